package hooks

import (
	"slices"
	"testing"
)

func TestEnv(t *testing.T) {
	for _, c := range []struct {
		name     string
		env, out []string
	}{
		{"unset", []string{"PATH=/bin"}, []string{"PATH=/bin", "PYTHONPATH=/.sbx/python"}},
		{"empty", []string{"PYTHONPATH="}, []string{"PYTHONPATH=/.sbx/python"}},
		{"the caller's first", []string{"PYTHONPATH=/src:/lib"}, []string{"PYTHONPATH=/src:/lib:/.sbx/python"}},
		{"there already", []string{"PYTHONPATH=/.sbx/python:/src"}, []string{"PYTHONPATH=/.sbx/python:/src"}},
		{"the last wins", []string{"PYTHONPATH=/a", "X=1", "PYTHONPATH=/b"}, []string{"PYTHONPATH=/a", "X=1", "PYTHONPATH=/b:/.sbx/python"}},
		{"a prefix is not it", []string{"PYTHONPATH=/.sbx/python2"}, []string{"PYTHONPATH=/.sbx/python2:/.sbx/python"}},
	} {
		in := slices.Clone(c.env)
		if got := Env(c.env); !slices.Equal(got, c.out) {
			t.Errorf("%s: Env(%q) = %q, want %q", c.name, c.env, got, c.out)
		}
		if !slices.Equal(in, c.env) {
			t.Errorf("%s: Env changed its argument to %q", c.name, c.env)
		}
	}
}
