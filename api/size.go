package api

import (
	"regexp"
	"strconv"
	"strings"
)

var sizeRE = regexp.MustCompile(`^(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)$`)

// ParseSize parses a user's size ("512M", "1G", "1.5GiB", "4096") for the
// named field; "" is zero. K, M, G and T are powers of 1024.
func ParseSize(field, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	m := sizeRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, Errorf(ErrInvalid, "%s: %q is not a size (use a number with an optional unit, like 512M or 2G)", field, s)
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, Errorf(ErrInvalid, "%s: %q is not a size", field, s)
	}
	mult := map[string]float64{"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m[2]]
	v := n * mult
	if v > 1<<50 {
		return 0, Errorf(ErrInvalid, "%s: %q is too large", field, s)
	}
	return int64(v), nil
}
