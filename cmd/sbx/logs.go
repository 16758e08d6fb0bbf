package main

import (
	"strings"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

func newLogsCmd(e *env) *cobra.Command {
	var (
		execID, stream string
		follow         bool
		tail           int
	)
	cmd := &cobra.Command{
		Use:   "logs [flags] ID",
		Short: "print one of a sandbox's logs (default: its console)",
		Long: "logs prints one of a sandbox's log streams, a line at a time: console (its first\n" +
			"process and what is written to /dev/console inside), events (its lifecycle),\n" +
			"runtime (what runsc said about it) or exec/EXEC_ID (one command's output).",
		Example:           "  sbx logs web -f\n  sbx logs web --exec ex_abc --follow\n  sbx logs web --stream runtime --tail 20",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
	}
	fs := cmd.Flags()
	fs.StringVar(&execID, "exec", "", "the exec whose output to print (short for --stream exec/EXEC_ID)")
	fs.StringVar(&stream, "stream", "", "the log stream: console (default), events, runtime or exec/EXEC_ID")
	fs.BoolVarP(&follow, "follow", "f", false, "keep printing what comes (for an exec: until it ends; Ctrl-C ends it)")
	fs.IntVarP(&tail, "tail", "n", 0, "start at the last N lines (0: all of it)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if tail < 0 {
			return usagef("--tail %d: give a count of lines", tail)
		}
		name, err := logsStream(execID, stream)
		if err != nil {
			return err
		}
		c, err := e.client()
		if err != nil {
			return err
		}
		sb := c.Sandbox(args[0])
		if id, ok := strings.CutPrefix(name, "exec/"); ok && tail == 0 {
			// All of an exec's output, as before: its stdout and stderr apart.
			out := []client.OutputOption{client.WithStdout(e.stdout), client.WithStderr(e.stderr)}
			if e.json {
				out = []client.OutputOption{client.WithExecEvents(func(ev api.ExecEvent) error { return e.printJSONLine(ev) })}
			}
			if follow {
				_, err = sb.Process(id).Wait(e.ctx, out...)
			} else {
				_, err = sb.Process(id).Output(e.ctx, out...)
			}
			return err
		}
		opts := []client.LogsOption{client.WithStream(name), client.WithTail(tail)}
		if follow {
			opts = append(opts, client.Follow())
		}
		return sb.Logs(e.ctx, func(ev api.LogEvent) error {
			if e.json {
				return e.printJSONLine(ev)
			}
			w := e.stdout
			if strings.HasSuffix(ev.Stream, "/stderr") {
				w = e.stderr
			}
			_, err := w.Write(ev.Data)
			return err
		}, opts...)
	}
	return cmd
}

// logsStream picks the stream from --stream, or --exec ID as exec/ID.
func logsStream(execID, stream string) (string, error) {
	if execID != "" {
		want := "exec/" + execID
		if stream != "" && stream != want {
			return "", usagef("--exec %s and --stream %s name different streams", execID, stream)
		}
		return want, nil
	}
	switch {
	case stream == "":
		return "console", nil
	case stream == "console", stream == "events", stream == "runtime":
		return stream, nil
	case strings.HasPrefix(stream, "exec/") && len(stream) > len("exec/"):
		return stream, nil
	default:
		return "", usagef("--stream %q: the streams are console, events, runtime and exec/EXEC_ID", stream)
	}
}
