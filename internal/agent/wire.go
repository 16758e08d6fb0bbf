package agent

import (
	"sbx.dev/sbx/internal/wire/agentwire"
	"sbx.dev/sbx/internal/wire/freezewire"
)

// What the agent shares with its clients outside the sandbox lives in
// packages agentwire and freezewire; these are their names here.
type (
	FreezeRecord = freezewire.Record
	HuntConfig   = agentwire.HuntConfig
	StartRequest = agentwire.StartRequest
)

const (
	FreezeFreezing    = agentwire.FreezeFreezing
	FreezeFrozen      = agentwire.FreezeFrozen
	FreezeFailed      = agentwire.FreezeFailed
	FreezeCopy        = agentwire.FreezeCopy
	FreezeUsed        = agentwire.FreezeUsed
	FreezeUnsupported = agentwire.FreezeUnsupported
	FreezeInterrupted = agentwire.FreezeInterrupted
	FreezeUnconfirmed = agentwire.FreezeUnconfirmed
	HuntNoFailure     = agentwire.HuntNoFailure
	HuntFailed        = agentwire.HuntFailed
	HuntSetupFailed   = agentwire.HuntSetupFailed
	HuntFrozen        = agentwire.HuntFrozen
	HuntLineRun       = agentwire.HuntLineRun
	HuntLineFailed    = agentwire.HuntLineFailed
	HuntLineCaptured  = agentwire.HuntLineCaptured
	HuntLineFrozen    = agentwire.HuntLineFrozen
	AgentPath         = agentwire.AgentPath
	FreezeRecordFile  = agentwire.FreezeRecordFile
	ExitOK            = agentwire.ExitOK
	ExitError         = agentwire.ExitError
	ExitNotFound      = agentwire.ExitNotFound
	ExitInvalid       = agentwire.ExitInvalid
	ExitExists        = agentwire.ExitExists
	ExitTimeoutExec   = agentwire.ExitTimeoutExec
	ExitUsageExec     = agentwire.ExitUsageExec
	ExitCannotExec    = agentwire.ExitCannotExec
	ExitNotFoundExec  = agentwire.ExitNotFoundExec
)
