package sandbox

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sbx.dev/sbx/api"
)

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// ValidName checks a sandbox name. Names cannot look like ids, so a
// reference is never ambiguous.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return api.Errorf(api.ErrInvalid, "name %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	if strings.HasPrefix(name, "sb_") {
		return api.Errorf(api.ErrInvalid, "name %q: names cannot start with sb_, which ids use", name)
	}
	return nil
}

// ParseDuration parses a user's duration for the named field: a Go
// duration ("90s", "2h30m") or a bare number of seconds ("3600", "1.5"),
// as scripts written for sbx pass it; "" is zero. A bad or negative one is
// api.ErrInvalid naming the field.
func ParseDuration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		if !secondsRE.MatchString(s) {
			return 0, api.Errorf(api.ErrInvalid, "%s: %q is not a duration (use seconds, like 90, or a number with a unit, like 90s, 30m or 2h)", field, s)
		}
		secs, _ := strconv.ParseFloat(s, 64)
		if secs >= maxDurationSeconds {
			return 0, api.Errorf(api.ErrInvalid, "%s: %q is too long (at most %d seconds)", field, s, int64(maxDurationSeconds))
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 {
		return 0, api.Errorf(api.ErrInvalid, "%s: %q is negative", field, s)
	}
	return d, nil
}

// secondsRE is a bare number of seconds: digits, maybe with a fraction.
var secondsRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// maxDurationSeconds is the longest bare number of seconds: about 292
// years, what a time.Duration holds.
const maxDurationSeconds = float64(math.MaxInt64 / int64(time.Second))

var sizeRE = regexp.MustCompile(`^(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)$`)

// ParseSize parses a user's size ("512M", "1G", "1.5GiB", "4096") for the
// named field; "" is zero. K, M, G and T are powers of 1024.
func ParseSize(field, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	m := sizeRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, api.Errorf(api.ErrInvalid, "%s: %q is not a size (use a number with an optional unit, like 512M or 2G)", field, s)
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, api.Errorf(api.ErrInvalid, "%s: %q is not a size", field, s)
	}
	mult := map[string]float64{"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m[2]]
	v := n * mult
	if v > 1<<50 {
		return 0, api.Errorf(api.ErrInvalid, "%s: %q is too large", field, s)
	}
	return int64(v), nil
}

// checkMeta checks user metadata: short keys and values, not too many.
func checkMeta(meta map[string]string) error {
	if len(meta) > 64 {
		return api.Errorf(api.ErrInvalid, "meta: at most 64 keys, got %d", len(meta))
	}
	for k, v := range meta {
		if k == "" || len(k) > 128 || strings.ContainsAny(k, "=\n") {
			return api.Errorf(api.ErrInvalid, "meta: key %q: use 1-128 characters, no '=' or newline", k)
		}
		if len(v) > 1024 {
			return api.Errorf(api.ErrInvalid, "meta: value of %q is longer than 1024 bytes", k)
		}
	}
	return nil
}

// hostMemory is the host's memory in bytes (MemTotal of /proc/meminfo), or
// 0 when it cannot be read.
func hostMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return 0
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

func checkCPUs(cpus float64, max int) error {
	if cpus < 0 || cpus > float64(max) {
		return api.Errorf(api.ErrInvalid, "cpus: %v is out of range (0 to %d on this host)", cpus, max)
	}
	return nil
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<40:
		return fmt.Sprintf("%.1f TiB", float64(n)/(1<<40))
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d B", n)
	}
}
