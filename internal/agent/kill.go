package agent

import (
	"flag"
	"io"
)

// runKill asks init to send a signal (default SIGTERM) to the process group
// of a command it started. An unknown id fails with ExitNotFound.
func runKill(args []string) error {
	const syntax = "kill --id ID [--signal N]"
	fset := flag.NewFlagSet("kill", flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	id := fset.String("id", "", "the exec id")
	sig := fset.Int("signal", 15, "signal number")
	if _, err := parseFlags(fset, args, 0, syntax); err != nil {
		return err
	}
	if *id == "" {
		return invalidf("kill: --id is required; usage: sbx-agent %s", syntax)
	}
	rep, err := callInit(initRequest{Op: "kill", ID: *id, Signal: sig})
	if err != nil {
		return failf(ExitError, "kill %s: %s", *id, err)
	}
	if rep.Error != "" {
		code := rep.Code
		if code == 0 {
			code = ExitError
		}
		return failf(code, "%s", rep.Error)
	}
	return nil
}
