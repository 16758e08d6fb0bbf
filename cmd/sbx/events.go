package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"sbx.dev/sbx/api"
)

var eventsCommand = &command{
	name:    "events",
	usage:   "events ID [--follow]",
	summary: "print a sandbox's lifecycle events",
	run:     runEvents,
}

func runEvents(e *env, args []string) error {
	fs := e.flags("events")
	follow := fs.Bool("follow", false, "keep printing live events")
	fs.BoolVar(follow, "f", false, "short for --follow")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("events takes one sandbox id")
	}
	c, err := e.client()
	if err != nil {
		return err
	}
	return c.Events(e.ctx, pos[0], *follow, func(ev api.Event) error {
		if e.json {
			return e.printJSONLine(ev)
		}
		_, err := fmt.Fprintln(e.stdout, eventLine(ev))
		return err
	})
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
