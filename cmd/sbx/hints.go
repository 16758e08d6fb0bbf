package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// hint says what to type next after err, for people: the client's and
// sbxd's errors say what happened, in no one's command line, and the
// command line adds its own advice here. "" when it has none.
func (e *env) hint(err error) string {
	msg := err.Error()
	var unreach *client.UnreachableError
	name := e.commandName()
	switch {
	case errors.As(err, &unreach) && !unreach.Dropped:
		return fmt.Sprintf("is sbxd running? start it, or point --host (or $SBX_HOST) at it; sbx tried %s", unreach.Host)
	case errors.Is(err, api.ErrUnauthorized):
		return "set SBX_TOKEN to the token of sbxd's TCP listener (sbxd --token-file, else DATA_DIR/token on its host)"
	case errors.Is(err, api.ErrNotFound) && strings.Contains(msg, "template ") && strings.Contains(msg, " not found"):
		return "make it with `sbx template build NAME` (tiny, base, or base plus --packages) or `sbx template import NAME IMAGE`; `sbx template ls` lists those there are"
	case errors.Is(err, api.ErrUnavailable) && strings.Contains(msg, "memory cannot be restored") && len(e.args) > 0:
		return fmt.Sprintf("run `sbx resume %s` without --require-memory to boot it from its disk", e.args[0])
	case errors.Is(err, api.ErrInvalid) && strings.Contains(msg, "others are imported"):
		return "`sbx template build` makes tiny, base, and base plus --packages; `sbx template import NAME IMAGE` makes a template of any other image"
	case errors.Is(err, api.ErrConflict) && strings.Contains(msg, "with force"):
		return fmt.Sprintf("run `sbx %s` again with --force", name)
	case errors.Is(err, api.ErrConflict) && strings.Contains(msg, "published private") && len(e.args) > 1:
		return fmt.Sprintf("run `sbx preview %s %s --private` for a URL with a token, or `sbx preview %s %s --off` first to publish it to everyone", e.args[0], e.args[1], e.args[0], e.args[1])
	case errors.Is(err, api.ErrConflict):
		return e.stateHint()
	}
	return ""
}

// commandName is the running command without "sbx ": "template build".
func (e *env) commandName() string {
	if e.cmd == nil {
		return ""
	}
	return strings.TrimPrefix(e.cmd.CommandPath(), "sbx ")
}

// sandboxVerbs are the commands whose first argument is a sandbox.
var sandboxVerbs = map[string]bool{
	"exec": true, "shell": true, "attach": true, "kill": true, "logs": true, "ports": true, "preview": true,
	"fork": true, "snapshot": true, "stop": true, "ttl": true, "persist": true, "metrics": true, "scp": true,
	"fs stat": true, "fs ls": true, "flake-rate": true,
}

// stateHint is the advice after a conflict on a sandbox: it is stopped,
// being made, or gone wrong. It asks sbxd the sandbox's state (briefly).
func (e *env) stateHint() string {
	if !sandboxVerbs[e.commandName()] || len(e.args) == 0 || e.c == nil {
		return ""
	}
	id := e.args[0]
	if e.commandName() == "scp" {
		id = ""
		for _, a := range e.args {
			if p := parseScpPath(a); p.id != "" {
				id = p.id
			}
		}
	}
	if id == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.ctx), 2*time.Second)
	defer cancel()
	sb, err := e.c.Sandbox(id).Info(ctx)
	if err != nil {
		return ""
	}
	switch sb.State {
	case api.StateStopped:
		return fmt.Sprintf("sandbox %s is stopped: run `sbx resume %s` first", id, id)
	case api.StateStopping:
		return fmt.Sprintf("sandbox %s is stopping: `sbx resume %s` brings it back once the stop has ended", id, id)
	case api.StateError, api.StateLost:
		return fmt.Sprintf("sandbox %s is %s: `sbx info %s` says why; `sbx delete %s` removes it", id, sb.State, id, id)
	}
	return ""
}
