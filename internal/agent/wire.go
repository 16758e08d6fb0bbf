package agent

import "sbx.dev/sbx/internal/wire/agentwire"

// What the agent shares with its clients outside the sandbox lives in
// package agentwire; these are its names here.
type (
	FreezeRecord = agentwire.FreezeRecord
	HuntConfig   = agentwire.HuntConfig
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
)
