package sandbox

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"

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

// ParseSize parses a user's size ("512M", "1G"): api.ParseSize, the one
// parser the CLI, the server and the fleet share.
func ParseSize(field, s string) (int64, error) { return api.ParseSize(field, s) }

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
	if math.IsNaN(cpus) || cpus < 0 || cpus > float64(max) {
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
