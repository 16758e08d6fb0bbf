package api

import (
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ParseDuration parses a user's duration: a Go duration ("90s", "2h30m")
// or a bare number of seconds ("3600", "1.5"), as scripts written for sbx
// pass it; "" is zero. A bad or negative one is ErrInvalid, its message
// led by field ("ttl: ...") unless field is "". The CLI, the server and
// the clients read durations with it, so one spelling means one thing
// everywhere.
func ParseDuration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	lead := ""
	if field != "" {
		lead = field + ": "
	}
	t := strings.TrimSpace(s)
	d, err := time.ParseDuration(t)
	if err != nil {
		if !secondsRE.MatchString(t) {
			return 0, Errorf(ErrInvalid, "%s%q is not a duration (use seconds, like 90, or a number with a unit, like 90s, 30m or 2h)", lead, s)
		}
		secs, _ := strconv.ParseFloat(t, 64)
		if secs >= maxDurationSeconds {
			return 0, Errorf(ErrInvalid, "%s%q is too long (at most %d seconds)", lead, s, int64(maxDurationSeconds))
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 {
		return 0, Errorf(ErrInvalid, "%s%q is negative", lead, s)
	}
	return d, nil
}

// secondsRE is a bare number of seconds: digits, maybe with a fraction.
var secondsRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// maxDurationSeconds is the longest bare number of seconds: about 292
// years, what a time.Duration holds.
const maxDurationSeconds = float64(math.MaxInt64 / int64(time.Second))
