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
)

// durationFlag is a duration flag that takes what sbx's users write: a Go
// duration ("90s", "2h30m") or a bare number of seconds ("3600"), as the
// server does. It remembers whether it was set, so that 0 ("none") differs
// from not given.
type durationFlag struct {
	d   time.Duration
	set bool
}

func (f *durationFlag) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	f.d, f.set = d, true
	return nil
}

func (f *durationFlag) String() string {
	if !f.set {
		return ""
	}
	return f.d.String()
}

func (f *durationFlag) Type() string { return "duration" }

// wire is the duration as the API takes it: "" when not given.
func (f *durationFlag) wire() string {
	if !f.set {
		return ""
	}
	return f.d.String()
}

// durationVar adds a durationFlag to fs.
func durationVar(fs *pflag.FlagSet, name, usage string) *durationFlag {
	f := &durationFlag{}
	fs.Var(f, name, usage)
	return f
}

// seconds is a bare number of seconds.
var seconds = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// parseDuration reads a duration as sbx's users write it (see durationFlag);
// a negative one is refused.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	d, err := time.ParseDuration(s)
	if err != nil {
		if !seconds.MatchString(s) {
			return 0, fmt.Errorf("%q is not a duration: use seconds (90) or a number with a unit (90s, 30m, 2h)", s)
		}
		secs, _ := strconv.ParseFloat(s, 64)
		if secs >= float64(math.MaxInt64/int64(time.Second)) {
			return 0, fmt.Errorf("%q seconds is too long", s)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d < 0 {
		return 0, fmt.Errorf("%q is negative", s)
	}
	return d, nil
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
