// Command sbx is the command line of sbxd: sandboxes, snapshots, forks, execs, files and templates.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one verb of sbx.
type command struct {
	name    string
	aliases []string
	usage   string // "new [--template T] ...", without "sbx "
	summary string
	run     func(e *env, args []string) error
}

// commands lists the verbs in the order usage shows them.
var commands = []*command{
	newCommand, listCommand, infoCommand, deleteCommand,
	snapshotCommand, forkCommand, stopCommand, resumeCommand, eventsCommand, ttlCommand, persistCommand,
	execCommand, shellCommand, attachCommand, psCommand, logsCommand, metricsCommand, portsCommand, previewCommand,
	scpCommand, fsCommand, templateCommand,
	huntCommand, flakeRateCommand, replayCommand,
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
		for _, a := range c.aliases {
			if a == name {
				return c
			}
		}
	}
	return nil
}

// env is what a verb runs with: the global flags and the standard streams.
type env struct {
	ctx    context.Context
	host   string
	json   bool
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	cmd    *command
	verb   string // the command's name as typed (an alias, maybe)
	c      *client.Client
}

// client returns the client of --host (else $SBX_HOST).
func (e *env) client() (*client.Client, error) {
	if e.c == nil {
		c, err := client.New(e.host)
		if err != nil {
			return nil, err
		}
		e.c = c
	}
	return e.c, nil
}

// flags returns a flag set for the verb with the global flags on it too, so
// they are accepted anywhere among the verb's flags.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addGlobalFlags(fs, e)
	return fs
}

func addGlobalFlags(fs *flag.FlagSet, e *env) {
	fs.StringVar(&e.host, "host", e.host, "sbxd address: unix:///path or tcp://host:port (default $SBX_HOST)")
	fs.BoolVar(&e.json, "json", e.json, "print JSON")
}

// usageError is a mistake in the command line: exit 2 and show the usage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// exitError carries the exit code sbx must end with (a remote exit code).
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// run runs sbx with args (without the program name) and returns its exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdin, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr}
	gfs := flag.NewFlagSet("sbx", flag.ContinueOnError)
	gfs.SetOutput(io.Discard)
	addGlobalFlags(gfs, e)
	if err := gfs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout)
			return 0
		}
		return e.fail(usagef("%s", err))
	}
	args = gfs.Args()
	if len(args) == 0 {
		fmt.Fprintln(stderr, "sbx: no command given")
		printUsage(stderr)
		return 2
	}
	if args[0] == "help" {
		if len(args) > 1 {
			if c := lookup(args[1]); c != nil {
				fmt.Fprintf(stdout, "usage: sbx %s\n", c.usage)
				return 0
			}
		}
		printUsage(stdout)
		return 0
	}
	e.cmd, e.verb = lookup(args[0]), args[0]
	if e.cmd == nil {
		return e.fail(usagef("unknown command %q", args[0]))
	}
	return e.fail(e.cmd.run(e, args[1:]))
}

// fail reports err the way its kind asks and returns the exit code.
func (e *env) fail(err error) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		if e.cmd != nil {
			fmt.Fprintf(e.stdout, "usage: sbx %s\n", e.cmd.usage)
		} else {
			printUsage(e.stdout)
		}
		return 0
	}
	var xe *exitError
	if errors.As(err, &xe) {
		return xe.code
	}
	var ue *usageError
	isUsage := errors.As(err, &ue)
	e.printError(err, isUsage)
	if !isUsage {
		return 1
	}
	if !e.json {
		if e.cmd != nil {
			fmt.Fprintf(e.stderr, "usage: sbx %s\n", e.cmd.usage)
		} else {
			printUsage(e.stderr)
		}
	}
	return 2
}

// printError writes err on stderr: "sbx: message", or with --json an api.ErrorBody.
func (e *env) printError(err error, usage bool) {
	if !e.json {
		fmt.Fprintf(e.stderr, "sbx: %s\n", err)
		return
	}
	var body api.ErrorBody
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		body.Error = api.ErrorDetail{Code: ae.Code, Message: ae.Message}
	case usage:
		_, code := api.StatusOf(api.ErrInvalid)
		body.Error = api.ErrorDetail{Code: code, Message: err.Error()}
	default:
		_, code := api.StatusOf(err)
		body.Error = api.ErrorDetail{Code: code, Message: err.Error()}
	}
	b, _ := json.Marshal(body)
	fmt.Fprintf(e.stderr, "%s\n", b)
}

func printUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString("usage: sbx [--host ADDR] [--json] COMMAND [ARGS]\n\ncommands:\n")
	names := make([]string, len(commands))
	width := 0
	for i, c := range commands {
		names[i] = c.name
		if len(c.aliases) > 0 {
			names[i] += " (" + strings.Join(c.aliases, ", ") + ")"
		}
		width = max(width, len(names[i]))
	}
	for i, c := range commands {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, names[i], c.summary)
	}
	b.WriteString("\nglobal flags, accepted anywhere:\n  --host ADDR  sbxd address, unix:///path or tcp://host:port (default $SBX_HOST, else " + client.DefaultHost + ")\n  --json       print JSON on stdout\n\nrun `sbx help COMMAND` for a command's usage\n")
	io.WriteString(w, b.String())
}
