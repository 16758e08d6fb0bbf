package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"sbx.dev/sbx/api"
)

func newEventsCmd(e *env) *cobra.Command {
	var follow bool
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
			return c.Events(e.ctx, args[0], follow, func(ev api.Event) error {
				if e.json {
					return e.printJSONLine(ev)
				}
				_, err := fmt.Fprintln(e.stdout, eventLine(ev))
				return err
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing live events (Ctrl-C ends it)")
	return cmd
}

// eventLine writes an event for people: "TIME TYPE key=value ...", the
// detail sorted by key.
func eventLine(ev api.Event) string {
	var b strings.Builder
	b.WriteString(ev.Time.Local().Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteString(" ")
	b.WriteString(ev.Type)
	keys := make([]string, 0, len(ev.Detail))
	for k := range ev.Detail {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, detailValue(ev.Detail[k]))
	}
	return b.String()
}

// detailValue writes one detail value: numbers in full (not 3.3e+06),
// strings quoted when they would not read as one word.
func detailValue(v any) string {
	switch v := v.(type) {
	case string:
		if v == "" || strings.ContainsAny(v, " \t\n\"=") {
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
			return fmt.Sprint(v)
		}
		return string(b)
	}
}
