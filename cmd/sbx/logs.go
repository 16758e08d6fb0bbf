package main

import (
	"strings"

	"sbx.dev/sbx/api"
)

var logsCommand = &command{
	name:    "logs",
	usage:   "logs ID --exec EXEC_ID [--follow]   (or --stream exec/EXEC_ID)",
	summary: "print an exec's output",
	run:     runLogs,
}

func runLogs(e *env, args []string) error {
	fs := e.flags("logs")
	execID := fs.String("exec", "", "the exec whose output to print")
	stream := fs.String("stream", "", "the log stream; only exec/EXEC_ID for now")
	follow := fs.Bool("follow", false, "keep printing live output until the exec ends")
	fs.BoolVar(follow, "f", false, "short for --follow")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("logs takes one sandbox id")
	}
	id, err := logsExecID(*execID, *stream)
	if err != nil {
		return err
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	if e.json {
		_, err = c.ExecOutputEvents(e.ctx, pos[0], id, *follow, func(ev api.ExecEvent) error { return e.printJSONLine(ev) })
	} else {
		_, err = c.ExecOutput(e.ctx, pos[0], id, *follow, e.stdout, e.stderr)
	}
	return err
}

// logsExecID picks the exec id from --exec or --stream exec/ID.
func logsExecID(execID, stream string) (string, error) {
	if stream != "" {
		id, ok := strings.CutPrefix(stream, "exec/")
		if !ok || id == "" {
			return "", usagef("--stream %q is not supported yet; only exec/EXEC_ID streams are", stream)
		}
		if execID != "" && execID != id {
			return "", usagef("--exec %s and --stream %s name different execs", execID, stream)
		}
		execID = id
	}
	if execID == "" {
		return "", usagef("logs needs --exec EXEC_ID")
	}
	return execID, nil
}
