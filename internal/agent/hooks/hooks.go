// Package hooks holds what sbx puts beside the agent in every sandbox's
// /.sbx for test harnesses to freeze with: the pytest plugin sbx_freeze
// (importable with PYTHONPATH=/.sbx/python) and the Python stack reader
// hunt --freeze uses from outside a process.
package hooks

import _ "embed"

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
