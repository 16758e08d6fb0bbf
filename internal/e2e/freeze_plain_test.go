package e2e

import (
	"context"
	"strings"
	"testing"
	"time"
)

// failingPytest is a test file whose one test fails.
const failingPytest = `
def test_fails():
    token = "plain-exec"
    assert token == "never"
`

// TestFreezePytestPlainExec: `python3 -m pytest -p sbx_freeze` freezes at
// the failing test in a plain `sbx exec`, as the template's default user,
// with no PYTHONPATH given (the hooks are on every command's PYTHONPATH)
// and with one given (the caller's comes first, the hooks still load); a
// terminal's commands can import the plugin too.
func TestFreezePytestPlainExec(t *testing.T) {
	d := shared
	id := d.newSandbox(t, "--template", "base")
	d.must(t, "exec", id, "--", "sh", "-c", "cat > /tmp/test_plain.py <<'EOF'\n"+failingPytest+"EOF")

	r := d.sbx(t, "exec", id, "--", "python3", "-m", "pytest", "-p", "sbx_freeze", "-q", "/tmp/test_plain.py")
	if r.code != 1 || !strings.Contains(r.stdout+r.stderr, "1 failed") {
		t.Fatalf("pytest -p sbx_freeze in a plain exec: exit %d, want 1 with the test failed\n%s%s", r.code, r.stdout, r.stderr)
	}
	m := frozeAs.FindStringSubmatch(r.stdout + r.stderr)
	if m == nil {
		t.Fatalf("pytest -p sbx_freeze in a plain exec did not freeze: %s%s", r.stdout, r.stderr)
	}
	t.Cleanup(func() { _ = d.client.DeleteSnapshot(context.Background(), m[1]) })
	sn := waitSnapshot(t, d, m[1], 10*time.Second)
	if !sn.Memory || sn.SandboxID != id {
		t.Errorf("the freeze's snapshot %+v, want one with memory of %s", sn, id)
	}

	// the caller's PYTHONPATH comes first, and the plugin still loads
	r = d.sbx(t, "exec", "--env", "PYTHONPATH=/opt/mine", id, "--", "python3", "-c",
		"import sys, sbx_freeze; print([p for p in sys.path if p in ('/opt/mine', '/.sbx/python')])")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "['/opt/mine', '/.sbx/python']" {
		t.Errorf("with PYTHONPATH=/opt/mine: exit %d %q %q, want the caller's path first and the plugin importable", r.code, r.stdout, r.stderr)
	}
	// as root too
	r = d.sbx(t, "exec", "-u", "root", id, "--", "python3", "-c", "import sbx_freeze; print('ok')")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "ok" {
		t.Errorf("as root: exit %d %q %q, want the plugin importable", r.code, r.stdout, r.stderr)
	}
	// and in a terminal
	r = d.sbxIn(t, []byte("python3 -c \"import sbx_freeze; print('plugin', 'here')\"\nexit\n"), "shell", id)
	if !strings.Contains(r.stdout, "plugin here") {
		t.Errorf("in `sbx shell`: exit %d %q %q, want the plugin importable", r.code, r.stdout, r.stderr)
	}
}
