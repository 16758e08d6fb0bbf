package api

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Line writes an event as one line, "TIME TYPE key=value ...": the time in
// loc, the detail sorted by key, numbers in full (not 3.3e+06), strings
// quoted when they would not read as one word. clean, if set, makes each
// name and value fit to print (a terminal's escapes); a string it changes
// is quoted.
func (ev Event) Line(loc *time.Location, clean func(string) string) string {
	if clean == nil {
		clean = func(s string) string { return s }
	}
	var b strings.Builder
	b.WriteString(ev.Time.In(loc).Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteString(" ")
	b.WriteString(clean(ev.Type))
	keys := make([]string, 0, len(ev.Detail))
	for k := range ev.Detail {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", clean(k), detailValue(ev.Detail[k], clean))
	}
	return b.String()
}

func detailValue(v any, clean func(string) string) string {
	switch v := v.(type) {
	case string:
		if v == "" || strings.ContainsAny(v, " \t\n\"=") || clean(v) != v {
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
			return clean(fmt.Sprint(v))
		}
		return clean(string(b))
	}
}
