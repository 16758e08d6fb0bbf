"""pytest -p sbx.pytest_plugin: run each test in its own sandbox, measure flake rates, freeze failures.

On the host, ``pytest -p sbx.pytest_plugin --sbx-template base`` prepares one
machine (the project's files copied to ``--sbx-workdir`` once, ``--sbx-setup``
run once, and pytest itself copied from the host when the machine has none),
then runs every selected test in its own fresh machine booted on its disk: one clean
machine per test, by construction. The test's outcome, traceback and output
come back into this pytest's report.

- ``--sbx-runs N`` runs each test N times in memory forks of the prepared
  machine (each run with its own ``$SEED``) and reports its flake rate with
  the 95% Wilson interval in the terminal summary; the test fails if any run did.
- ``--sbx-hunt`` runs each test until it fails (up to ``--sbx-runs``, default
  20) and keeps the first failing machine stopped, with its processes and
  memory: the summary says which sandbox to resume.
- ``--sbx-from SNAPSHOT`` prepares the machine from a snapshot instead of a template.

The prepared machine's disk is kept as a snapshot once; each test's fresh
machine boots on it. Runs of --sbx-runs and --sbx-hunt are memory forks of
the prepared machine. Both go when the session ends; frozen failures stay.

The host is ``--sbx-host``, else ``$SBX_HOST``, as for the sbx command line.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import pytest

from .client import Client, Sandbox
from .errors import SbxError
from .flaky import RateSummary, summarize, Run

_PYTEST_DIR = "/opt/sbx-pytest"
_JUNIT = "/tmp/sbx-pytest-junit.xml"
_DEFAULT_HUNT_RUNS = 20


def pytest_addoption(parser: Any) -> None:
    """pytest_addoption adds the --sbx-* options."""
    g = parser.getgroup("sbx", "run tests in sbx sandboxes")
    g.addoption("--sbx-template", default=None, help="prepare the machine from this template and run each test in a fork of it")
    g.addoption("--sbx-from", default=None, metavar="SNAPSHOT", help="prepare the machine from this snapshot instead")
    g.addoption("--sbx-runs", type=int, default=0, metavar="N", help="run each test N times in memory forks and report its flake rate")
    g.addoption("--sbx-hunt", action="store_true", default=False, help="run each test until it fails (up to --sbx-runs) and keep the failure frozen")
    g.addoption("--sbx-seed", type=int, default=None, metavar="S", help="give the runs seeds S, S+1, ... in $SEED (default: random)")
    g.addoption("--sbx-host", default=None, help="sbxd's address (default $SBX_HOST)")
    g.addoption("--sbx-workdir", default="/work", help="where the project's files go in the sandbox")
    g.addoption("--sbx-setup", default=None, metavar="CMD", help="a shell command run once in the prepared machine")
    g.addoption("--sbx-python", default="python3", help="the sandbox's python")
    g.addoption("--sbx-parallel", type=int, default=4, help="how many runs of a test go at once")
    g.addoption("--sbx-timeout", default="10m", help="the limit of one run of a test in the sandbox")
    g.addoption("--sbx-keep-ttl", default="2h", help="idle ttl of a frozen failure (0: none)")


def pytest_configure(config: Any) -> None:
    """pytest_configure turns the runner on when --sbx-template or --sbx-from is given."""
    o = config.option
    if o.sbx_template and o.sbx_from:
        raise pytest.UsageError("--sbx-template and --sbx-from: give one")
    if (o.sbx_runs or o.sbx_hunt) and not (o.sbx_template or o.sbx_from):
        raise pytest.UsageError("--sbx-runs and --sbx-hunt need --sbx-template or --sbx-from")
    if o.sbx_runs < 0 or o.sbx_parallel < 1:
        raise pytest.UsageError("--sbx-runs must be 0 or more, --sbx-parallel 1 or more")
    if o.sbx_template or o.sbx_from:
        config.pluginmanager.register(Runner(config), "sbx-runner")


def _host_pytest_paths() -> List[str]:
    """_host_pytest_paths lists the files of pytest and what it imports, outside the standard library, on this host."""
    code = (
        "import sys, sysconfig, json, os, pytest\n"
        "std = {os.path.realpath(sysconfig.get_paths()[k]) for k in ('stdlib', 'platstdlib')}\n"
        "out = set()\n"
        "for name, m in list(sys.modules.items()):\n"
        "    f = getattr(m, '__file__', None)\n"
        "    if not f or '.' in name: continue\n"
        "    f = os.path.realpath(f)\n"
        "    if any(f.startswith(s + os.sep) and 'packages' not in f for s in std): continue\n"
        "    out.add(os.path.dirname(f) if os.path.basename(f) == '__init__.py' else f)\n"
        "print(json.dumps(sorted(out)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return [p for p in json.loads(out) if "/sbx/" not in p + "/"]


class Runner:
    """Runner runs the session's tests in sandboxes forked from one prepared machine."""

    def __init__(self, config: Any) -> None:
        self.config = config
        o = config.option
        self.client = Client(o.sbx_host)
        self.prepared: Optional[Sandbox] = None
        self.snapshot: Optional[str] = None
        self.failed: Optional[SbxError] = None
        self.rates: Dict[str, RateSummary] = {}
        self.frozen: Dict[str, Tuple[str, int]] = {}
        self.seed = o.sbx_seed
        self._seed_lock = threading.Lock()

    # the machine

    def _prepare(self) -> Sandbox:
        """_prepare makes the prepared machine once; a preparation that failed fails every test, and is not tried again."""
        if self.prepared is not None:
            return self.prepared
        if self.failed is not None:
            raise self.failed
        o = self.config.option
        sb = self.client.create(template=o.sbx_template, from_snapshot=o.sbx_from, meta={"sbx.pytest": "prepared"})
        # named before it is taken, so that a snapshot whose answer an interrupt cut off is found and deleted
        snap = "sbx-pytest-%s-%s" % (sb.id[3:], uuid.uuid4().hex[:8])
        try:
            wd = o.sbx_workdir
            sb.files.upload_dir(str(self.config.rootpath), wd)
            if sb.exec([o.sbx_python, "-c", "import pytest"], timeout=60).exit_code != 0:
                self._ship_pytest(sb)
            if o.sbx_setup:
                r = sb.exec(o.sbx_setup, timeout=None, cwd=wd)
                if r.exit_code != 0:
                    raise SbxError("--sbx-setup exited %d in the prepared machine:\n%s%s" % (r.exit_code, r.stdout, r.stderr))
            # the prepared disk, once: every test's fresh machine boots on it
            self.snapshot = sb.snapshot(snap).name
        except BaseException as e:
            try:
                self.client.snapshot(snap).delete()
            except SbxError:
                pass
            try:
                self.client.delete_all([sb])
            except SbxError:
                pass
            if isinstance(e, SbxError):
                self.failed = e
            raise
        self.prepared = sb
        return sb

    def _ship_pytest(self, sb: Sandbox) -> None:
        """_ship_pytest copies the host's pytest (pure Python) into the sandbox, for machines without one."""
        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w") as tf:
                for p in _host_pytest_paths():
                    tf.add(p, arcname=os.path.basename(p), filter=lambda ti: None if "__pycache__" in ti.name else ti)
            size = tmp.tell()
            tmp.seek(0)
            sb.files.mkdir(_PYTEST_DIR)
            sb.files.write_tar(_PYTEST_DIR, tmp, size)

    def _seeds(self, n: int) -> List[int]:
        import random

        with self._seed_lock:
            if self.seed is None:
                return [random.getrandbits(32) for _ in range(n)]
            out = list(range(self.seed, self.seed + n))
            self.seed += n
            return out

    # one run

    def _run_in(self, sb: Sandbox, item: Any, seed: Optional[int]) -> Dict[str, Any]:
        """_run_in runs the item once in sb and returns its outcome, longrepr and output."""
        o = self.config.option
        env = {"SBX_NODEID": item.nodeid, "SBX_PYTHON": o.sbx_python}
        if seed is not None:
            env["SEED"] = str(seed)
        script = (
            'export PYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}"; rm -f %s; '
            'exec "$SBX_PYTHON" -m pytest -p no:cacheprovider -q -rN --tb=long --junitxml=%s "$SBX_NODEID"'
            % (_PYTEST_DIR, _JUNIT, _JUNIT)
        )
        start = time.monotonic()
        r = sb.exec(script, timeout=o.sbx_timeout, env=env, cwd=o.sbx_workdir)
        res: Dict[str, Any] = {"seed": seed, "sandbox": sb.id, "exit_code": r.exit_code, "stdout": r.stdout, "stderr": r.stderr,
                               "duration": time.monotonic() - start}
        try:
            xml = sb.files.read(_JUNIT, max_size=16 << 20)
        except SbxError:
            xml = b""
        outcome = "failed"
        longrepr: Any = None
        case = None
        if xml:
            try:
                case = ET.fromstring(xml).find(".//testcase")
            except ET.ParseError:
                case = None
        if case is None:
            longrepr = "sbx: pytest in %s exited %d without a result for %s\n%s%s" % (sb.id, r.exit_code, item.nodeid, r.stdout, r.stderr)
        else:
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            skip = case.find("skipped")
            if bad is not None:
                longrepr = (bad.text or bad.get("message") or "failed").rstrip()
            elif skip is not None and skip.get("type") == "pytest.xfail":
                outcome = "xfailed"
                longrepr = (skip.get("message") or "xfail")
            elif skip is not None:
                outcome = "skipped"
                path, line = item.location[0], item.location[1] or 0
                longrepr = (str(path), int(line) + 1, skip.get("message") or "skipped")
            elif r.exit_code == 0:
                outcome = "passed"
            else:
                longrepr = "sbx: pytest in %s exited %d\n%s%s" % (sb.id, r.exit_code, r.stdout, r.stderr)
        res["outcome"], res["longrepr"] = outcome, longrepr
        return res

    # the protocol

    @pytest.hookimpl(tryfirst=True)  # type: ignore[misc]
    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> bool:
        """pytest_runtest_protocol runs the item in sandboxes instead of here and reports what they said."""
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        o = self.config.option
        try:
            prepared = self._prepare()
            if o.sbx_hunt:
                res = self._hunt(prepared, item, o.sbx_runs or _DEFAULT_HUNT_RUNS)
            elif o.sbx_runs:
                res = self._rate(prepared, item, o.sbx_runs)
            else:
                assert self.snapshot is not None
                kid = self.client.create(from_snapshot=self.snapshot, meta={"sbx.pytest": "test"})
                try:
                    res = self._run_in(kid, item, None)
                finally:
                    self.client.delete_all([kid])
        except SbxError as e:
            res = {"outcome": "failed", "longrepr": "sbx: %s: %s" % (type(e).__name__, e), "stdout": "", "stderr": "", "duration": 0.0}
        phases = ("setup", "teardown") if res["outcome"] == "skipped" else ("setup", "call", "teardown")
        for when in phases:
            rep = self._report(item, when, res)
            ihook.pytest_runtest_logreport(report=rep)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _report(self, item: Any, when: str, res: Dict[str, Any]) -> Any:
        """_report is the TestReport of one phase: the remote outcome on "call" (on "setup" for a skip)."""
        from _pytest.reports import TestReport

        outcome: Any = "passed"
        longrepr: Any = None
        sections: List[Tuple[str, str]] = []
        skipped = res["outcome"] == "skipped"
        if (when == "call" and not skipped) or (when == "setup" and skipped):
            outcome, longrepr = res["outcome"], res["longrepr"]
        if when == "call":
            if res.get("stdout"):
                sections.append(("Captured stdout call (sbx %s)" % res.get("sandbox", ""), res["stdout"]))
            if res.get("stderr"):
                sections.append(("Captured stderr call (sbx %s)" % res.get("sandbox", ""), res["stderr"]))
        phase: Any = when
        wasxfail = None
        if outcome == "xfailed":
            outcome, wasxfail, longrepr = "skipped", str(longrepr), None
        elif outcome == "passed" and when == "call":
            # as pytest's skipping plugin: a pass of a test marked xfail is an XPASS (a failure if strict)
            from _pytest.skipping import evaluate_xfail_marks

            xfailed = evaluate_xfail_marks(item)
            if xfailed is not None and xfailed.run:
                if xfailed.strict:
                    outcome, longrepr = "failed", "[XPASS(strict)] " + xfailed.reason
                else:
                    wasxfail = xfailed.reason
        rep = TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, outcome, longrepr, phase, sections,
                         res.get("duration", 0.0) if when == "call" else 0.0)
        if wasxfail is not None:
            setattr(rep, "wasxfail", wasxfail)  # what pytest itself sets on an expected failure
        return rep

    def _run_all(self, kids: List[Sandbox], item: Any, seeds: List[int], workers: int) -> List[Dict[str, Any]]:
        """_run_all runs the item once in each kid, ``workers`` at a time.

        On an exception (KeyboardInterrupt included) no more runs start and
        the kids are deleted, which ends the runs under way, before it is raised.
        """
        pool = ThreadPoolExecutor(max_workers=workers)
        futs: List["Future[Dict[str, Any]]"] = []
        try:
            futs += [pool.submit(self._run_in, k, item, s) for k, s in zip(kids, seeds)]
            return [f.result() for f in futs]
        except BaseException:
            for f in futs:
                f.cancel()
            try:
                self.client.delete_all(kids)
            except SbxError:
                pass
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _rate(self, prepared: Sandbox, item: Any, n: int) -> Dict[str, Any]:
        seeds = self._seeds(n)
        kids = prepared.fork(count=n, memory=True, meta={"sbx.pytest": "rate"})
        try:
            results = self._run_all(kids, item, seeds, self.config.option.sbx_parallel)
        finally:
            self.client.delete_all(kids)
        runs = [Run(i, r["seed"], r["sandbox"], r["exit_code"], r["outcome"] != "failed", int(r["duration"] * 1000)) for i, r in enumerate(results)]
        s = summarize(runs)
        self.rates[item.nodeid] = s
        failed = [r for r in results if r["outcome"] == "failed"]
        if not failed:
            res = dict(results[0])
            return res
        res = dict(failed[0])
        res["longrepr"] = "%s\n\nsbx: %s (this run's seed: %s)" % (res["longrepr"], s, res["seed"])
        return res

    def _hunt(self, prepared: Sandbox, item: Any, n: int) -> Dict[str, Any]:
        o = self.config.option
        done = 0
        last: Optional[Dict[str, Any]] = None
        while done < n:
            batch = min(o.sbx_parallel, n - done)
            seeds = self._seeds(batch)
            kids = prepared.fork(count=batch, memory=True, meta={"sbx.pytest": "hunt"})
            keep: Optional[Sandbox] = None
            try:
                results = self._run_all(kids, item, seeds, batch)
                for i, r in enumerate(results):
                    if r["outcome"] == "failed":
                        keep = kids[i]
                        keep.set_ttl(o.sbx_keep_ttl)
                        keep.stop()
                        self.frozen[item.nodeid] = (keep.id, r["seed"])
                        r = dict(r)
                        r["longrepr"] = "%s\n\nsbx: failed at run %d (seed %s); the machine is frozen: sbx resume %s" % (
                            r["longrepr"], done + i + 1, r["seed"], keep.id)
                        return r
                last = results[-1]
            finally:
                self.client.delete_all([k for k in kids if k is not keep])
            done += batch
        assert last is not None
        return last

    # the end

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """pytest_terminal_summary prints the flake rates and the frozen failures."""
        tr = terminalreporter
        if self.rates:
            tr.write_sep("=", "sbx flake rates")
            for nodeid, s in self.rates.items():
                tr.write_line("%s: %s" % (nodeid, s))
        if self.frozen:
            tr.write_sep("=", "sbx frozen failures")
            for nodeid, (sid, seed) in self.frozen.items():
                tr.write_line("%s: seed %s, frozen in %s: sbx resume %s" % (nodeid, seed, sid, sid))

    def pytest_sessionfinish(self, session: Any) -> None:
        """pytest_sessionfinish deletes the prepared machine and its snapshot (frozen failures stay)."""
        if self.snapshot is not None:
            try:
                self.client.snapshot(self.snapshot).delete()
            except SbxError as e:
                sys.stderr.write("sbx: could not delete the prepared snapshot %s: %s\n" % (self.snapshot, e))
            self.snapshot = None
        if self.prepared is not None:
            try:
                self.client.delete_all([self.prepared])
            except SbxError as e:
                sys.stderr.write("sbx: could not delete the prepared machine %s: %s\n" % (self.prepared.id, e))
            self.prepared = None
