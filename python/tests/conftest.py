"""The test session's sbxd: a real daemon on real runsc, with its own data dir, socket and tag.

It is started once per session (as root), shares the template cache of the
Go end-to-end tests (/var/tmp/sbx-test-templates-v2, through a ``templates``
symlink) so that ``base`` is built at most once per machine, and at the end
deletes every sandbox it made, stops with SIGTERM and checks that no runsc
process, namespace, mount or cgroup of its tag is left — even when tests fail.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Iterator, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYDIR)
BIN = os.environ.get("SBX_BIN") or os.path.join(REPO, "bin")
TEMPLATE_CACHE = os.environ.get("SBX_TEST_TEMPLATES") or "/var/tmp/sbx-test-templates-v2"

sys.path.insert(0, PYDIR)

import sbx  # noqa: E402


class Daemon:
    """Daemon is one sbxd started by the tests, and everything it leaves to clean."""

    def __init__(self, extra: Optional[List[str]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="sbx-py-")
        os.makedirs(TEMPLATE_CACHE, mode=0o700, exist_ok=True)
        os.symlink(TEMPLATE_CACHE, os.path.join(self.dir, "templates"))
        self.socket = os.path.join(self.dir, "sbxd.sock")
        self.tag = secrets.token_hex(2)
        self.host = "unix://" + self.socket
        self.extra = list(extra or [])
        self.proc: Optional[subprocess.Popen] = None
        self.log = os.path.join(self.dir, "sbxd.log")

    def args(self) -> List[str]:
        return [
            os.path.join(BIN, "sbxd"), "--data-dir", self.dir, "--socket", self.socket, "--tag", self.tag,
            "--default-template", "tiny", "--runsc", os.path.join(BIN, "runsc"), "--agent", os.path.join(BIN, "sbx-agent"),
            "--preview-listen", "127.0.0.1:0",
        ] + self.extra

    def start(self) -> "Daemon":
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(self.args(), stdout=logf, stderr=logf, start_new_session=True)
        c = sbx.Client(self.host, timeout=5)
        deadline = time.monotonic() + 60
        while True:
            try:
                c.health()
                return self
            except sbx.Unavailable:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("sbxd did not start: %s" % self.tail())
                time.sleep(0.1)

    def client(self, timeout: float = 120) -> sbx.Client:
        return sbx.Client(self.host, timeout=timeout)

    def tail(self) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""

    def kill(self, sig: int) -> None:
        """kill signals sbxd and waits for it to end."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def stop_and_clean(self) -> List[str]:
        """stop_and_clean deletes every sandbox, stops sbxd (SIGTERM), removes what is left and returns what had to be forced."""
        forced: List[str] = []
        if self.proc is not None and self.proc.poll() is None:
            c = self.client(60)
            try:
                for sb in c.list():
                    try:
                        sb.delete()
                    except sbx.NotFound:
                        pass
                    except sbx.SbxError as e:
                        forced.append("delete %s: %s" % (sb.id, e))
            except sbx.SbxError as e:
                forced.append("list: %s" % e)
        self.kill(signal.SIGTERM)
        runsc = os.path.join(BIN, "runsc")
        root = os.path.join(self.dir, "runsc")
        out = subprocess.run([runsc, "--root", root, "list", "-quiet"], capture_output=True, text=True).stdout.split()
        for cid in out:
            forced.append("runsc container " + cid)
            subprocess.run([runsc, "--root", root, "delete", "-force", cid], capture_output=True)
        subprocess.run(self.args() + ["--cleanup"], capture_output=True)
        for ns in netns_of(self.tag):
            forced.append("netns " + ns)
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        for m in reversed(mounts_under(self.dir)):
            forced.append("mount " + m)
            subprocess.run(["umount", "-l", m], capture_output=True)
        for ctl in os.listdir("/sys/fs/cgroup") if os.path.isdir("/sys/fs/cgroup") else []:
            p = os.path.join("/sys/fs/cgroup", ctl, "sbx-" + self.tag)
            if os.path.isdir(p):
                for sub in os.listdir(p):
                    if os.path.isdir(os.path.join(p, sub)):
                        forced.append("cgroup %s/%s" % (p, sub))
                        try:
                            os.rmdir(os.path.join(p, sub))
                        except OSError:
                            pass
                try:
                    os.rmdir(p)
                except OSError:
                    pass
        os.unlink(os.path.join(self.dir, "templates"))
        shutil.rmtree(self.dir, ignore_errors=True)
        return forced

    def leftovers(self) -> List[str]:
        """leftovers lists runsc processes, namespaces and mounts of this daemon still on the host."""
        left = ["netns " + n for n in netns_of(self.tag)]
        left += ["mount " + m for m in mounts_under(self.dir)]
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if self.dir in cmd:
                left.append("process %s: %s" % (pid, cmd[:200]))
        return left


def netns_of(tag: str) -> List[str]:
    names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    return [n for n in names if n.startswith("sbx-%s-" % tag)]


def mounts_under(d: str) -> List[str]:
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mp = line.split()[1]
            if mp == d or mp.startswith(d + "/"):
                out.append(mp)
    return out


def start_daemon(extra: Optional[List[str]] = None) -> Daemon:
    if os.geteuid() != 0:
        pytest.fail("the sbx tests run sbxd, which needs root")
    for b in ("sbxd", "runsc", "sbx-agent"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            pytest.fail("%s/%s is missing: run `make build` first" % (BIN, b))
    d = Daemon(extra)
    try:
        return d.start()
    except BaseException:
        d.stop_and_clean()
        raise


def finish(d: Daemon) -> None:
    """finish cleans up after a daemon and fails the test run if anything was left."""
    forced = d.stop_and_clean()
    deadline = time.monotonic() + 10
    left = d.leftovers()
    while left and time.monotonic() < deadline:  # processes that are on their way out
        time.sleep(0.2)
        left = d.leftovers()
    assert not left, "left on the host after sbxd %s: %s" % (d.tag, left)
    assert not forced, "sbxd %s left these, removed by force: %s" % (d.tag, forced)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt("signal %d" % signum)


# a SIGTERM (make's, a CI's timeout) unwinds the session like Ctrl-C, so the daemons are cleaned up
signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """daemon is the session's sbxd, with the tiny template built."""
    d = start_daemon()
    try:
        d.client(600).build_template("tiny")
        yield d
    finally:
        finish(d)


@pytest.fixture(scope="session")
def client(daemon: Daemon) -> sbx.Client:
    """client is a Client of the session's sbxd."""
    return daemon.client()


@pytest.fixture(scope="session")
def base(daemon: Daemon) -> str:
    """base builds (or finds cached) the Debian template and returns its name."""
    daemon.client(900).build_template("base")
    return "base"


@pytest.fixture
def sb(client: sbx.Client) -> Iterator[sbx.Sandbox]:
    """sb is a fresh tiny sandbox, deleted after the test."""
    s = client.create(template="tiny")
    try:
        yield s
    finally:
        client.delete_all([s])


@pytest.fixture
def own_daemon() -> Iterator[Daemon]:
    """own_daemon is an sbxd of the test's own, for tests that stop, kill or restart it."""
    d = start_daemon()
    try:
        yield d
    finally:
        finish(d)
