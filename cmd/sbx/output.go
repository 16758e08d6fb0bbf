package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"golang.org/x/term"
)

// printJSON writes v as one JSON document on stdout.
func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine writes v as one line of JSON on stdout (streams: a line per event).
func (e *env) printJSONLine(v any) error {
	return json.NewEncoder(e.stdout).Encode(v)
}

// table returns a tabwriter on stdout; the caller flushes it.
func (e *env) table() *tabwriter.Writer {
	return tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
}

// isTerminal reports whether r or w is a terminal.
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// termWidth is the width of the terminal v is, or 0.
func termWidth(v any) int {
	f, ok := v.(*os.File)
	if !ok {
		return 0
	}
	w, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return w
}

// age says how long ago t was, in one unit: "42s", "5m", "3h", "2d".
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
}

// size writes a byte count for people: "512B", "1.5K", "360.0M".
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%c", float64(n)/float64(div), "KMGTPE"[exp])
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// safe returns s fit for a terminal: every control character (C0, DEL,
// C1), every bidirectional override, and every byte that is not UTF-8 is
// written as a Go escape (`\x1b`, `\u202e`), so that a name or a message
// from a sandbox cannot move the cursor, retitle the window, clear the
// screen or forge a row of a table. Printable text, spaces included, stays
// as it is.
func safe(s string) string { return quoteControl(s, false) }

// safeText is safe for text of several lines (a backtrace): newlines and
// tabs stay.
func safeText(s string) string { return quoteControl(s, true) }

func quoteControl(s string, lines bool) string {
	clean := utf8.ValidString(s)
	for _, r := range s {
		if !clean || unsafeRune(r, lines) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case unsafeRune(r, lines):
			q := strconv.QuoteRune(r) // 'x' with the escape inside
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[:n])
		}
		s = s[n:]
	}
	return b.String()
}

// unsafeRune reports whether r may act on a terminal rather than print.
func unsafeRune(r rune, lines bool) bool {
	switch {
	case lines && (r == '\n' || r == '\t'):
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0x200e, r == 0x200f, r == 0x061c:
		return true // bidirectional overrides: text that reads other than it is
	}
	return false
}
