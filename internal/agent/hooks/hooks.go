// Package hooks holds what sbx puts beside the agent in every sandbox's
// /.sbx for test harnesses to freeze with: the pytest plugin sbx_freeze
// (importable with PYTHONPATH=/.sbx/python) and the Python stack reader
// hunt --freeze uses from outside a process.
package hooks

import (
	_ "embed"
	"slices"
	"strings"
)

//go:embed python/sbx_freeze.py
var pytestPlugin []byte

//go:embed python/sbx_pystack.py
var pyStack []byte

// PythonDir is where the Python hooks are inside a sandbox; put it on
// PYTHONPATH for `python3 -m pytest -p sbx_freeze`.
const PythonDir = "/.sbx/python"

// PyStackScript is the script run inside a Python process to write its
// stacks and locals (see sbx_pystack.py).
const PyStackScript = PythonDir + "/sbx_pystack.py"

// Files are the hooks, by their path under /.sbx.
var Files = map[string][]byte{
	"python/sbx_freeze.py":  pytestPlugin,
	"python/sbx_pystack.py": pyStack,
}

// Env returns env (KEY=VALUE, the last of a key winning) with PythonDir on
// PYTHONPATH, after what is there: every command in a sandbox can load the
// pytest plugin (`python3 -m pytest -p sbx_freeze`) without being told
// where it is, and a PYTHONPATH of the template's or the caller's still
// comes first.
func Env(env []string) []string {
	last := -1
	for i, kv := range env {
		if strings.HasPrefix(kv, "PYTHONPATH=") {
			last = i
		}
	}
	out := slices.Clone(env)
	if last < 0 {
		return append(out, "PYTHONPATH="+PythonDir)
	}
	cur := strings.TrimPrefix(env[last], "PYTHONPATH=")
	if slices.Contains(strings.Split(cur, ":"), PythonDir) {
		return out
	}
	if cur == "" {
		out[last] = "PYTHONPATH=" + PythonDir
	} else {
		out[last] = "PYTHONPATH=" + cur + ":" + PythonDir
	}
	return out
}
