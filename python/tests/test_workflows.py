"""The README's three workflows, run as the scripts in python/examples, and the pytest plugin on a small flaky suite."""

import json
import os
import re
import subprocess
import sys

import pytest

import sbx

from conftest import PYDIR

EXAMPLES = os.path.join(PYDIR, "examples")
SUITE = os.path.join(EXAMPLES, "flaky_suite")


def run(daemon, *args, cwd=None, timeout=600):
    env = dict(os.environ, SBX_HOST=daemon.host, PYTHONPATH=PYDIR)
    env.pop("SBX_TOKEN", None)
    return subprocess.run([sys.executable] + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def lines(out):
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def test_debug_on_failure(daemon, client, tmp_path):
    (tmp_path / "t.sh").write_text("echo checking; sleep 1000 & test -f /work/fixed\n")
    p = run(daemon, os.path.join(EXAMPLES, "debug_on_failure.py"), str(tmp_path), "sh t.sh", "--template", "tiny")
    assert p.returncode == 1, p.stderr
    [res] = lines(p.stdout)
    assert res["passed"] is False and res["stdout"] == "checking\n" and "sbx resume " + res["sandbox"] in p.stderr
    sb = client.sandbox(res["sandbox"])
    try:
        assert sb.info().state == "stopped"
        assert sb.resume().memory_restored
        assert "sleep 1000" in sb.exec("ps").stdout  # as it failed
    finally:
        sb.delete()
    (tmp_path / "fixed").write_text("")
    p = run(daemon, os.path.join(EXAMPLES, "debug_on_failure.py"), str(tmp_path), "sh t.sh", "--template", "tiny")
    assert p.returncode == 0 and lines(p.stdout)[0]["passed"] is True
    with pytest.raises(Exception):
        client.sandbox(lines(p.stdout)[0]["sandbox"])  # a pass leaves nothing


def test_flake_rate_50(daemon, client, tmp_path):
    (tmp_path / "t.sh").write_text('test "$(cat /work/warm)" = yes && test $((SEED % 4)) -ne 0\n')
    p = run(daemon, os.path.join(EXAMPLES, "flake_rate_50.py"), str(tmp_path), "sh t.sh", "--template", "tiny",
            "--setup", "echo yes > /work/warm", "--runs", "20")
    assert p.returncode == 0, p.stderr
    out = lines(p.stdout)
    runs, summary = out[:-1], out[-1]
    assert len(runs) == 20 and summary["runs"] == 20
    assert summary["failures"] == sum(1 for r in runs if r["seed"] % 4 == 0)
    assert all(r["pass"] == (r["seed"] % 4 != 0) for r in runs)
    assert "95% Wilson interval" in p.stderr
    assert client.list(meta={"job": "flake-rate"}) == [] and client.snapshots() == []


def test_fresh_machine_per_suite(daemon, client, tmp_path):
    # each suite asserts the other's leftover is absent, then leaves its own
    for s in ("a", "b", "c"):
        (tmp_path / ("suite_%s.sh" % s)).write_text("test ! -e /tmp/leftover && echo %s > /tmp/leftover && echo ok-%s\n" % (s, s))
    (tmp_path / "suite_bad.sh").write_text("exit 3\n")
    p = run(daemon, os.path.join(EXAMPLES, "fresh_machine_per_suite.py"), str(tmp_path), "sh suite_{suite}.sh",
            "a", "b", "c", "bad", "--template", "tiny")
    assert p.returncode == 1, p.stderr
    res = {r["suite"]: r for r in lines(p.stdout)}
    assert [res[s]["exitCode"] for s in ("a", "b", "c", "bad")] == [0, 0, 0, 3]
    assert res["b"]["output"] == "ok-b\n" and len({r["sandbox"] for r in res.values()}) == 4
    assert client.list(meta={"job": "quarantine"}) == [] and client.list(meta={"suite": "a"}) == []


def plugin(daemon, *args):
    return run(daemon, "-m", "pytest", "-p", "sbx.pytest_plugin", "-p", "no:cacheprovider", "--sbx-template", "base", *args, cwd=SUITE)


def test_plugin_runs_each_test_in_its_own_machine(daemon, base):
    p = plugin(daemon, "-rA", "test_suite.py")
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"4 passed, 1 skipped, 1 xfailed", p.stdout), p.stdout
    assert "PASSED test_suite.py::test_fresh_machine_a" in p.stdout and "PASSED test_suite.py::test_fresh_machine_b" in p.stdout
    assert "SKIPPED" in p.stdout and "not today" in p.stdout
    assert "XFAIL test_suite.py::test_known_bug" in p.stdout and "known to fail" in p.stdout


def test_plugin_reports_the_flake_rate(daemon, client, base):
    p = plugin(daemon, "--sbx-runs", "6", "--sbx-seed", "0", "-k", "stable or sometimes", "test_suite.py")
    assert p.returncode == 1, p.stdout + p.stderr
    # seeds 0..5 to test_stable, 6..11 to test_sometimes: 6 and 9 are multiples of 3
    assert "test_suite.py::test_stable: 0/6 failed: rate 0.0% (95% Wilson interval 0.0%–39.0%)" in p.stdout, p.stdout
    assert "test_suite.py::test_sometimes: 2/6 failed: rate 33.3% (95% Wilson interval 9.7%–70.0%)" in p.stdout
    # the traceback came back into this pytest's report
    assert "AssertionError: seed 6 is a multiple of 3" in p.stdout and "1 failed, 1 passed" in p.stdout
    assert client.list(meta={"sbx.pytest": "rate"}) == [] and client.list(meta={"sbx.pytest": "prepared"}) == []
    assert client.snapshots() == [], "the prepared snapshot was left"


def test_plugin_hunt_keeps_the_failure_frozen(daemon, client, base):
    p = plugin(daemon, "--sbx-hunt", "--sbx-runs", "8", "--sbx-seed", "1", "-k", "sometimes")
    assert p.returncode == 1, p.stdout + p.stderr
    m = re.search(r"test_suite.py::test_sometimes: seed 3, frozen in (sb_[a-z0-9]+): sbx resume \1", p.stdout)
    assert m, p.stdout
    sb = client.sandbox(m.group(1))
    try:
        assert sb.info().state == "stopped"
        assert sb.resume().memory_restored
        assert sb.files.exists("/work/test_suite.py")
    finally:
        sb.delete()
    assert client.list(meta={"sbx.pytest": "hunt"}) == []


def test_plugin_from_a_snapshot(daemon, client, base):
    with client.create(template="base") as sb:
        sb.exec("echo warm | sudo tee /etc/sbx-warm")
        snap = sb.snapshot(memory=True)
    try:
        args = ["-p", "sbx.pytest_plugin", "-p", "no:cacheprovider", "test_warm.py"]
        p = run(daemon, "-m", "pytest", "--sbx-from", snap.name, *args, cwd=SUITE)
        assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr
        p = run(daemon, "-m", "pytest", "--sbx-template", "base", *args, cwd=SUITE)
        assert p.returncode == 1 and "not a machine made from the warm snapshot" in p.stdout, p.stdout + p.stderr
    finally:
        snap.delete()


def test_plugin_bad_options(daemon):
    p = plugin(daemon, "--sbx-from", "x")
    assert p.returncode == 4 and "give one" in p.stderr
    p = run(daemon, "-m", "pytest", "-p", "sbx.pytest_plugin", "--sbx-runs", "3", cwd=SUITE)
    assert p.returncode == 4 and "need --sbx-template" in p.stderr
    p = run(daemon, "-m", "pytest", "-p", "sbx.pytest_plugin", "--sbx-template", "no-such-template", "-k", "stable or sometimes", cwd=SUITE)
    assert p.returncode == 1 and "NotFound" in p.stdout and "no-such-template" in p.stdout and "2 failed" in p.stdout
    p = run(daemon, "-m", "pytest", "-p", "sbx.pytest_plugin", "--sbx-template", "base", "--sbx-setup", "echo nope >&2; exit 3",
            "-k", "stable or sometimes", cwd=SUITE)
    assert p.returncode == 1 and "--sbx-setup exited 3" in p.stdout and "nope" in p.stdout and "2 failed" in p.stdout
    c = sbx.Client(daemon.host)
    assert c.list(meta={"sbx.pytest": "prepared"}) == [] and c.snapshots() == []
