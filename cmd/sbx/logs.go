package main

import (
	"strings"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

var logsCommand = &command{
	name:    "logs",
	usage:   "logs ID [--stream console|events|runtime|exec/EXEC_ID] [--exec EXEC_ID] [--follow] [--tail N]",
	summary: "print one of a sandbox's logs (default: its console)",
	run:     runLogs,
}

func runLogs(e *env, args []string) error {
	fs := e.flags("logs")
	execID := fs.String("exec", "", "the exec whose output to print (short for --stream exec/EXEC_ID)")
	stream := fs.String("stream", "", "the log stream: console (default), events, runtime or exec/EXEC_ID")
	follow := fs.Bool("follow", false, "keep printing what comes (for an exec: until it ends)")
	fs.BoolVar(follow, "f", false, "short for --follow")
	tail := fs.Int("tail", 0, "start at the last N lines (0: all of it)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("logs takes one sandbox id")
	}
	if *tail < 0 {
		return usagef("--tail %d: give a count of lines", *tail)
	}
	name, err := logsStream(*execID, *stream)
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	if id, ok := strings.CutPrefix(name, "exec/"); ok && *tail == 0 {
		// All of an exec's output, as before: its stdout and stderr apart.
		if e.json {
			_, err = c.ExecOutputEvents(e.ctx, pos[0], id, *follow, func(ev api.ExecEvent) error { return e.printJSONLine(ev) })
		} else {
			_, err = c.ExecOutput(e.ctx, pos[0], id, *follow, e.stdout, e.stderr)
		}
		return err
	}
	opts := []client.LogsOption{client.WithStream(name), client.WithTail(*tail)}
	if *follow {
		opts = append(opts, client.WithFollow())
	}
	return c.Logs(e.ctx, pos[0], func(ev api.LogEvent) error {
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
