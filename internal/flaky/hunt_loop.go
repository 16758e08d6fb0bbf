package flaky

import (
	"path"
	"strings"

	"sbx.dev/sbx/internal/wire/agentwire"
)

// The hunt loop runs inside the sandbox as the agent's `hunt` mode
// (internal/agent/hunt.go); the client writes its configuration and
// follows its lines.

// HuntDir is where the loop inside the sandbox keeps its state and evidence.
const HuntDir = "/work/.sbx-hunt"

// huntConfig is the loop's configuration inside the sandbox; attach finds
// the loop's exec by it.
const huntConfig = HuntDir + "/hunt.json"

// legacyLoop is the loop script of hunts started by an sbx whose loop was
// a shell script; attach still finds those.
const legacyLoop = HuntDir + "/loop.sh"

// The loop's exit codes (agentwire.Hunt*).
const (
	loopFailed      = agentwire.HuntFailed
	loopSetupFailed = agentwire.HuntSetupFailed
	// loopFrozen: a run failed and the sandbox froze at the failure.
	loopFrozen = agentwire.HuntFrozen
)

// The lines the loop prints on its stdout, one per step.
const (
	lineRun      = agentwire.HuntLineRun      // "sbx-hunt: run N seed S exit E"
	lineFailed   = agentwire.HuntLineFailed   // "sbx-hunt: failed N seed S exit E time T"
	lineCaptured = agentwire.HuntLineCaptured // the evidence is in HuntDir
	lineFrozen   = agentwire.HuntLineFrozen   // "sbx-hunt: frozen NAME"
)

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:@%+,") == "" {
		return s // nothing the shell would read differently
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// collectPaths makes the --collect paths absolute (relative ones are in
// /work) and clean, so that each names its place under collected/.
func collectPaths(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		if !path.IsAbs(p) {
			p = path.Join("/work", p)
		}
		out[i] = path.Clean(p)
	}
	return out
}

func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}
