package main

import (
	"errors"
	"io"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/client"
)

// attachLine is one JSON line of `sbx --json attach`: the exec's output as
// it comes ("output", stdout and stderr together, as a terminal shows them),
// then its "exit".
type attachLine struct {
	Event    string `json:"event"`
	Data     []byte `json:"data,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
}

func newAttachCmd(e *env) *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:               "attach [flags] ID EXEC_ID",
		Short:             "follow a running exec's output (from its start, or from now); exits with its exit code",
		Args:              exactArgs(2, "a sandbox id and an exec id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from != "start" && from != "tail" {
				return usagef("--from %q: want start or tail", from)
			}
			c, err := e.client()
			if err != nil {
				return err
			}
			var opts []client.AttachOption
			if from == "start" {
				opts = append(opts, client.FromStart())
			}
			t, err := c.Sandbox(args[0]).Process(args[1]).Attach(e.ctx, opts...)
			if err != nil {
				return err
			}
			defer t.Close()
			var out io.Writer = e.stdout
			if e.json {
				out = jsonChunks{e}
			}
			if _, err := io.Copy(out, t); err != nil {
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
			if e.json {
				if err := e.printJSONLine(attachLine{Event: "exit", ExitCode: &code}); err != nil {
					return err
				}
			}
			if code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "start", "start: the output kept so far, then what comes; tail: only what comes")
	return cmd
}

// jsonChunks writes each chunk of output as an "output" JSON line.
type jsonChunks struct{ e *env }

func (w jsonChunks) Write(p []byte) (int, error) {
	if err := w.e.printJSONLine(attachLine{Event: "output", Data: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}
