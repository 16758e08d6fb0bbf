package main

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"sbx.dev/sbx/api"
	"sbx.dev/sbx/client"
	"sbx.dev/sbx/internal/flaky"
)

// durationFlag is a duration flag that takes what sbx's users write: a Go
// duration ("90s", "2h30m") or a bare number of seconds ("3600"), read by
// api.Duration as the server and the client read it. It remembers whether
// it was set, so that 0 ("none") differs from not given; not given, it is
// 0.
type durationFlag struct {
	api.Duration
	set bool
}

func (f *durationFlag) Set(s string) error {
	if err := f.Duration.Set(s); err != nil {
		return err
	}
	f.set = true
	return nil
}

func (f *durationFlag) String() string {
	if !f.set {
		return ""
	}
	return f.Duration.String()
}

// keep is the flag as a flaky KeepTTL: not given is the default, 0 is
// no ttl (flaky.KeepForever).
func (f *durationFlag) keep() time.Duration {
	if f.set && f.Duration == 0 {
		return flaky.KeepForever
	}
	return f.D()
}

// durationVar adds a durationFlag to fs.
func durationVar(fs *pflag.FlagSet, name, usage string) *durationFlag {
	f := &durationFlag{}
	fs.Var(f, name, usage)
	return f
}

// parseDuration reads a duration argument as a durationFlag does; an empty
// or negative one is refused.
func parseDuration(s string) (time.Duration, error) {
	var d api.Duration
	err := d.Set(s)
	return d.D(), err
}

// ttlText is a ttl for people: "" when none.
func ttlText(d api.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// optText is a duration the API may leave out, for people: "" when absent.
func optText(d *api.Duration) string {
	if d == nil {
		return ""
	}
	return d.String()
}

// checkEnv checks the K=V pairs of --env; a bare K takes its value from
// sbx's own environment, as docker's -e does.
func checkEnv(envs []string) error {
	for i, kv := range envs {
		k, _, ok := strings.Cut(kv, "=")
		if k == "" || strings.ContainsAny(k, " \t\n") {
			return usagef("--env %q: want K=V", kv)
		}
		if !ok {
			v, set := os.LookupEnv(k)
			if !set {
				return usagef("--env %s: %s is not set here; give %s=VALUE", k, k, k)
			}
			envs[i] = k + "=" + v
		}
	}
	return nil
}

// sizeFlag is a size flag as sbx's users write it: bytes, or a number with
// a unit K, M, G or T (powers of 1024), as sbxd reads sizes.
type sizeFlag struct {
	n   int64
	set bool
}

func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	f.n, f.set = n, true
	return nil
}

func (f *sizeFlag) String() string {
	if !f.set {
		return ""
	}
	return strconv.FormatInt(f.n, 10)
}

func (f *sizeFlag) Type() string { return "size" }

// sizeVar adds a sizeFlag to fs.
func sizeVar(fs *pflag.FlagSet, name, usage string) *sizeFlag {
	f := &sizeFlag{}
	fs.Var(f, name, usage)
	return f
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)i?b?$`)

// parseSize reads "512M", "2G", "1.5g", "1048576".
func parseSize(s string) (int64, error) {
	m := sizeRE.FindStringSubmatch(strings.ToLower(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size: use a number with an optional unit, like 512M or 2G", s)
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	v := n * map[string]float64{"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m[2]]
	if v > 1<<50 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(v), nil
}

// shapeFlags are --net-delay and --net-loss: explain's network knob, by
// hand, on new and fork.
type shapeFlags struct {
	delay *durationFlag
	loss  lossFlag
}

func shapeVars(fs *pflag.FlagSet) *shapeFlags {
	s := &shapeFlags{delay: durationVar(fs, "net-delay", "hold each packet the sandbox sends out this long, e.g. 100ms (at most 10s; 0: none)")}
	fs.Var(&s.loss, "net-loss", "drop each packet the sandbox sends out with this probability: 0.05 or 5% (0: none)")
	return s
}

// option is the client option the flags ask for, or nil when neither was
// given.
func (s *shapeFlags) option() client.SandboxOption {
	if !s.delay.set && !s.loss.set {
		return nil
	}
	return client.WithNetShape(s.delay.D(), s.loss.p)
}

// lossFlag is a probability, as a fraction (0.05) or a percentage (5%).
type lossFlag struct {
	p   float64
	set bool
}

func (f *lossFlag) Set(s string) error {
	s = strings.TrimSpace(s)
	pct := strings.HasSuffix(s, "%")
	p, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil || math.IsNaN(p) || math.IsInf(p, 0) {
		return fmt.Errorf("%q is not a probability: want a fraction like 0.05 or a percentage like 5%%", s)
	}
	if pct {
		p /= 100
	}
	if p < 0 || p >= 1 {
		return fmt.Errorf("%q is out of range: want 0 up to (not including) 1, or 0%% to 100%%", s)
	}
	f.p, f.set = p, true
	return nil
}

func (f *lossFlag) String() string {
	if !f.set {
		return ""
	}
	return strconv.FormatFloat(f.p, 'f', -1, 64)
}

func (f *lossFlag) Type() string { return "probability" }
