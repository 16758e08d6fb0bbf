package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
)

func newEventsCmd(e *env) *cobra.Command {
	var (
		follow bool
		after  int64
	)
	cmd := &cobra.Command{
		Use:               "events [flags] ID",
		Short:             "print a sandbox's lifecycle events",
		Args:              exactArgs(1, "one sandbox id"),
		ValidArgsFunction: completeSandboxes(e),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.client()
			if err != nil {
				return err
			}
			var opts []client.EventsOption
			if follow {
				opts = append(opts, client.Follow())
			}
			if after > 0 {
				opts = append(opts, client.After(after))
			}
			err = c.Sandbox(args[0]).Events(e.ctx, func(ev api.Event) error {
				if e.json {
					return e.printJSONLine(ev)
				}
				_, err := fmt.Fprintln(e.stdout, eventLine(ev))
				return err
			}, opts...)
			if err == nil && e.ctx.Err() != nil {
				// a follow ends without error when its context does; a
				// signal ended it here, and sbx exits 128+N for that
				return context.Cause(e.ctx)
			}
			return err
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing live events (Ctrl-C ends it)")
	cmd.Flags().Int64Var(&after, "after", 0, "only the events after this sequence number (the seq of --json), to pick a follow up again")
	return cmd
}

// eventLine writes an event for people: "TIME TYPE key=value ...", the
// detail sorted by key.
func eventLine(ev api.Event) string {
	var b strings.Builder
	b.WriteString(ev.Time.Local().Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteString(" ")
	b.WriteString(safe(ev.Type))
	keys := make([]string, 0, len(ev.Detail))
	for k := range ev.Detail {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", safe(k), detailValue(ev.Detail[k]))
	}
	return b.String()
}

// detailValue writes one detail value: numbers in full (not 3.3e+06),
// strings quoted when they would not read as one word.
func detailValue(v any) string {
	switch v := v.(type) {
	case string:
		if v == "" || strings.ContainsAny(v, " \t\n\"=") || safe(v) != v {
			return strconv.Quote(v)
		}
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case nil:
		return "null"
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return safe(fmt.Sprint(v))
		}
		return safe(string(b))
	}
}
