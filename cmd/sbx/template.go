package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"sbx.dev/sbx/api"
)

var templateCommand = &command{
	name:    "template",
	usage:   "template build NAME [--force] | template ls | template rm NAME | template import NAME PATH",
	summary: "build, import, list and remove templates",
	run:     runTemplate,
}

func runTemplate(e *env, args []string) error {
	fs := e.flags("template")
	force := fs.Bool("force", false, "build again even if the template exists")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("template takes build, ls, rm or import")
	}
	verb, rest := pos[0], pos[1:]
	want := map[string]int{"build": 1, "ls": 0, "list": 0, "rm": 1, "import": 2}
	n, ok := want[verb]
	if !ok {
		return usagef("unknown template command %q", verb)
	}
	if len(rest) != n {
		return usagef("template %s takes %d argument(s)", verb, n)
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	switch verb {
	case "ls", "list":
		ts, err := c.Templates(e.ctx)
		if err != nil {
			return err
		}
		if e.json {
			return e.printJSON(ts)
		}
		now := time.Now()
		tw := e.table()
		fmt.Fprintln(tw, "NAME\tSIZE\tSOURCE\tAGE")
		for _, t := range ts {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, size(t.Size), orDash(t.Source), age(now, t.CreatedAt))
		}
		return tw.Flush()
	case "rm":
		if err := c.RemoveTemplate(e.ctx, rest[0]); err != nil {
			return err
		}
		if e.json {
			return e.printJSON(map[string]string{"name": rest[0]})
		}
		return nil
	case "build":
		p := e.progress()
		t, err := c.BuildTemplate(e.ctx, rest[0], *force, p.event)
		return p.finish(t, err, "built")
	default: // import
		r, err := openImport(rest[1], e.stdin)
		if err != nil {
			return err
		}
		defer r.Close()
		p := e.progress()
		t, err := c.ImportTemplate(e.ctx, rest[0], r, p.event)
		return p.finish(t, err, "imported")
	}
}

// openImport returns what to upload for PATH: a tar made on the fly of a
// directory, a file as it is (the server detects gzip), or stdin for "-".
func openImport(p string, stdin io.Reader) (io.ReadCloser, error) {
	if p == "-" {
		return io.NopCloser(stdin), nil
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return tarDir(p), nil
	}
	return os.Open(p)
}

// progressPrinter shows template progress: JSON lines with --json, one
// updating line on a terminal, nothing but the last line otherwise.
type progressPrinter struct {
	e    *env
	tty  bool
	last string
}

func (e *env) progress() *progressPrinter {
	return &progressPrinter{e: e, tty: isTerminal(e.stderr)}
}

func (p *progressPrinter) event(ev api.Progress) {
	switch {
	case p.e.json:
		p.e.printJSONLine(ev)
	case p.tty && ev.Message != "":
		// One updating line: a message wider than the terminal would wrap,
		// and \r could then not take it back.
		msg := strings.TrimSpace(ev.Message)
		if w := termWidth(p.e.stderr); w > 10 && len(msg) >= w {
			msg = msg[:w-4] + "..."
		}
		fmt.Fprintf(p.e.stderr, "\r\033[K%s", msg)
		p.last = msg
	}
}

func (p *progressPrinter) finish(t *api.Template, err error, did string) error {
	if p.tty && p.last != "" && !p.e.json {
		fmt.Fprint(p.e.stderr, "\r\033[K")
	}
	if err != nil || p.e.json {
		return err
	}
	_, err = fmt.Fprintf(p.e.stdout, "template %s %s (%s)\n", t.Name, did, size(t.Size))
	return err
}
