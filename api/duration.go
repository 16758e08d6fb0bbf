package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Duration is a span of time on the wire. In JSON it is a Go duration
// string ("30m0s"), as sbxd has always written it; it is read as any
// spelling ParseDuration takes ("30m", or seconds as "1800"), always a
// string. Decoding refuses a bad or negative one, so a request that
// decodes carries a duration, never text to parse again; its bounds are
// checked by the request's Validate. It is also a command-line flag value
// (String, Set and Type, as pflag and flag want).
type Duration time.Duration

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String is d as a Go duration ("30m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// durationType is what a *json.UnmarshalTypeError from Duration names.
var durationType = reflect.TypeFor[Duration]()

// UnmarshalJSON reads a string as ParseDuration does. A bad one is a
// *json.UnmarshalTypeError, so that encoding/json adds the field's path:
// DecodeError turns it into the field's message.
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "null" {
		return nil
	}
	if !strings.HasPrefix(s, `"`) {
		return &json.UnmarshalTypeError{Value: fmt.Sprintf("%s is not a duration: give it as a string (\"90s\", or seconds as \"90\")", s), Type: durationType}
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := ParseDuration("", s)
	if err != nil {
		return &json.UnmarshalTypeError{Value: err.Error(), Type: durationType}
	}
	*d = Duration(v)
	return nil
}

// Set reads a flag's value as ParseDuration does; an empty one is refused
// (a flag given says something).
func (d *Duration) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("an empty duration: use seconds (90) or a number with a unit (90s, 30m, 2h)")
	}
	v, err := ParseDuration("", s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Type names the flag's kind in usage.
func (d *Duration) Type() string { return "duration" }

// DurationOf is d as a *Duration, for a field where absent and zero differ.
func DurationOf(d time.Duration) *Duration {
	v := Duration(d)
	return &v
}

// DecodeError is err, an error decoding a request body, as the message of
// the field at fault when a Duration in it did not read ("ttl: \"soon\" is
// not a duration ...", ErrInvalid); any other err is returned as it is.
func DecodeError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Type == durationType {
		return Errorf(ErrInvalid, "%s: %s", te.Field, te.Value)
	}
	return err
}

// checkDuration holds d, the field's value, to [lo, hi] (hi 0: no upper
// bound), with the field's one message: as ParseDuration's for a negative
// one (a typed value from a Go caller may be).
func checkDuration(field string, d Duration, lo, hi time.Duration) error {
	switch {
	case d < 0:
		return Errorf(ErrInvalid, "%s: %q is negative", field, d.String())
	case d.D() < lo || (hi > 0 && d.D() > hi):
		return Errorf(ErrInvalid, "%s: %q is not a duration between %s and %s", field, d.String(), lo, hi)
	}
	return nil
}
