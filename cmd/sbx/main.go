// Command sbx is the command line of sbxd: sandboxes, snapshots, forks, execs, files and templates.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

// version is set at build time.
var version = "dev"

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		// the command ends its work (a hunt deletes what it made) and
		// then sbx exits quietly with 128+signal
		cancel(&signalError{sig.(syscall.Signal)})
		sig = <-sigs
		os.Exit(128 + int(sig.(syscall.Signal))) // a second one: leave now
	}()
	os.Exit(runContext(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// signalError is the cause of sbx's context when a signal ended it.
type signalError struct{ sig syscall.Signal }

func (e *signalError) Error() string { return "interrupted by " + e.sig.String() }

// env is what a verb runs with: the global flags and the standard streams.
type env struct {
	ctx    context.Context
	host   string
	json   bool
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	root   *cobra.Command
	cmd    *cobra.Command // the command running, once cobra found it
	// started is set when a command's own code starts: an error before
	// that is cobra's, about the command line.
	started bool
	// args are the command's positional arguments, for hints.
	args []string
	c    *client.Client
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
	e.root = newRoot(e)
	e.root.SetArgs(args)
	cmd, err := e.root.ExecuteContextC(ctx)
	if e.cmd == nil {
		e.cmd = cmd
	}
	return e.fail(err)
}

// fail reports err the way its kind asks and returns the exit code.
func (e *env) fail(err error) int {
	if err == nil {
		return 0
	}
	var se *signalError
	if errors.As(context.Cause(e.ctx), &se) {
		// Ctrl-C on a follow, SIGTERM from a supervisor: what was asked
		// for ended there, which is no failure to report
		return 128 + int(se.sig)
	}
	var xe *exitError
	if errors.As(err, &xe) {
		return xe.code
	}
	var ue *usageError
	isUsage := errors.As(err, &ue) || !e.started
	e.printError(err, isUsage)
	if !isUsage && !e.json {
		if h := e.hint(err); h != "" {
			fmt.Fprintf(e.stderr, "sbx: %s\n", h)
		}
	}
	if !isUsage {
		return 1
	}
	if !e.json {
		e.printUsageHint(e.stderr)
	}
	return 2
}

// printError writes err on stderr: "sbx: message", or with --json an api.ErrorBody.
func (e *env) printError(err error, usage bool) {
	if !e.json {
		// a message may quote what a sandbox said: quoted for the terminal
		fmt.Fprintf(e.stderr, "sbx: %s\n", safeText(err.Error()))
		return
	}
	var body api.ErrorBody
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		body.Error = &api.ErrorDetail{Code: ae.Code, Message: ae.Message}
	case usage:
		_, code := api.StatusOf(api.ErrInvalid)
		body.Error = &api.ErrorDetail{Code: code, Message: err.Error()}
	default:
		_, code := api.StatusOf(err)
		body.Error = &api.ErrorDetail{Code: code, Message: err.Error()}
	}
	b, _ := json.Marshal(body)
	fmt.Fprintf(e.stderr, "%s\n", b)
}

// interrupted reports whether a signal has ended sbx's context.
func (e *env) interrupted() bool {
	var se *signalError
	return errors.As(context.Cause(e.ctx), &se)
}
