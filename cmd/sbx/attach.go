package main

import (
	"errors"
	"io"
)

var attachCommand = &command{
	name:    "attach",
	usage:   "attach ID EXEC_ID [--from start|tail]",
	summary: "follow a running exec's output (from its start, or from now); exits with its exit code",
	run:     runAttach,
}

func runAttach(e *env, args []string) error {
	fs := e.flags("attach")
	from := fs.String("from", "start", "start: the output kept so far, then what comes; tail: only what comes")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("attach takes a sandbox id and an exec id")
	}
	if *from != "start" && *from != "tail" {
		return usagef("--from %q: want start or tail", *from)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	t, err := c.Attach(e.ctx, pos[0], pos[1], *from == "start")
	if err != nil {
		return err
	}
	defer t.Close()
	if _, err := io.Copy(e.stdout, t); err != nil {
		return err
	}
	code, ok := t.ExitCode()
	switch {
	case !ok:
		return errors.New("the stream ended without the exec's exit code")
	case code < 0:
		return errors.New("the exec was lost: sbx cannot know how it ended")
	case code > 255:
		code = 255
	}
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}
