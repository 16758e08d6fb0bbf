package main

import (
	"fmt"
	"strconv"
	"time"

	"sbx.dev/sbx/client"
)

var previewCommand = &command{
	name:    "preview",
	usage:   "preview ID PORT [--private [--ttl 1h]]",
	summary: "print the URL that reaches a port inside a sandbox",
	run:     runPreview,
}

func runPreview(e *env, args []string) error {
	fs := e.flags("preview")
	private := fs.Bool("private", false, "require a signed, expiring token (carried by the URL)")
	ttl := fs.Duration("ttl", 0, "how long a private URL's token is valid (default 1h)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	opts, err := previewOptions(pos, *private, *ttl)
	if err != nil {
		return err
	}
	port, _ := strconv.Atoi(pos[1])
	c, err := e.client()
	if err != nil {
		return err
	}
	p, err := c.Preview(e.ctx, pos[0], port, opts...)
	if err != nil {
		return err
	}
	if e.json {
		return e.printJSON(p)
	}
	fmt.Fprintln(e.stdout, p.URL)
	if p.ExpiresAt != nil {
		fmt.Fprintf(e.stderr, "private: valid until %s\n", p.ExpiresAt.Local().Format(time.RFC3339))
	}
	return nil
}

// previewOptions checks a preview's command line and returns its options.
func previewOptions(pos []string, private bool, ttl time.Duration) ([]client.PreviewOption, error) {
	if len(pos) != 2 {
		return nil, usagef("preview takes a sandbox id and a port")
	}
	if port, err := strconv.Atoi(pos[1]); err != nil || port < 1 || port > 65535 {
		return nil, usagef("port %q: want a TCP port, 1-65535", pos[1])
	}
	switch {
	case ttl < 0:
		return nil, usagef("--ttl %s: want a positive duration", ttl)
	case ttl > 0 && !private:
		return nil, usagef("--ttl is for --private previews only")
	case private:
		return []client.PreviewOption{client.PrivatePreview(ttl)}, nil
	}
	return nil, nil
}
