"""Attacks on the Python client and the pytest plugin (issue 26), as a hostile sandbox and a careless user.

A test marked xfail(strict=True) demonstrates a break that is still open: it
fails against the current code (and the suite stays green); when the break is
fixed it passes, and strict makes that an XPASS failure so the mark is removed.
Every other test is an attack that was held.
"""

import datetime
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc

import pytest

import sbx
from sbx.types import duration_wire

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)


def in_thread(fn):
    """in_thread runs fn in a daemon thread; the returned dict gets "result" or "error", and "thread"."""
    box = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: B902 - the attack wants whatever comes out
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    box["thread"] = t
    t.start()
    return box


def cleanup_meta(client, key, value):
    """cleanup_meta deletes every sandbox of the session's daemon with meta key=value, and returns their ids."""
    left = client.list(meta={key: value})
    client.delete_all(left)
    return [s.id for s in left]


# --- a stalled sbxd: does every call have a timeout? ------------------------------------------


def _stalled(d, call):
    """_stalled stops sbxd (SIGSTOP), runs call in a thread, and says whether it ended within 20 s."""
    box = None
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        box = in_thread(call)
        box["thread"].join(20)
        return box, not box["thread"].is_alive()
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
        if box is not None:
            box["thread"].join(60)


def test_stalled_sbxd_plain_call_times_out(own_daemon):
    # held: a plain call (info) to a stalled sbxd ends with Unavailable after the client's timeout
    d = own_daemon
    c = d.client(timeout=3)
    sb = c.create(template="tiny")
    try:
        box, ended = _stalled(d, sb.info)
        assert ended, "info() to a stopped sbxd did not end within 20 s (client timeout 3 s)"
        assert isinstance(box.get("error"), sbx.Unavailable), box
    finally:
        c.delete_all([sb])


def test_stalled_sbxd_exec_times_out(own_daemon):
    d = own_daemon
    c = d.client(timeout=3)
    sb = c.create(template="tiny")
    try:
        box, ended = _stalled(d, lambda: sb.exec("true", timeout=2))
        assert ended, "exec('true', timeout=2) with Client(timeout=3) to a stopped sbxd did not end within 20 s"
        assert isinstance(box.get("error"), sbx.Unavailable), box
    finally:
        c.delete_all([sb])


def test_stalled_sbxd_file_read_times_out(own_daemon):
    d = own_daemon
    c = d.client(timeout=3)
    sb = c.create(template="tiny")
    try:
        sb.files.write("/tmp/small", b"hi")
        box, ended = _stalled(d, lambda: sb.files.read("/tmp/small"))
        assert ended, "files.read of a 2-byte file with Client(timeout=3) to a stopped sbxd did not end within 20 s"
        assert isinstance(box.get("error"), sbx.Unavailable), box
    finally:
        c.delete_all([sb])


# --- sbxd killed mid-stream ------------------------------------------------------------------


def test_sbxd_killed_mid_read_to_and_mid_logs_follow(own_daemon, tmp_path):
    # held: SIGKILL of sbxd in the middle of read_to of 48 MiB is an Unavailable, not a short file;
    # a logs(follow=True) open at the time ends with StreamError instead of hanging
    d = own_daemon
    c = d.client(timeout=30)
    sb = c.create(template="tiny")
    try:
        size = 48 << 20
        r = sb.exec("head -c %d /dev/urandom > /tmp/big && wc -c < /tmp/big" % size, timeout=120)
        assert r.exit_code == 0 and int(r.stdout) == size, r
        follow = in_thread(lambda: [ev for ev in sb.logs(stream="console", follow=True)])
        got = [0]

        class Slow:
            def write(self, b):
                got[0] += len(b)
                if got[0] == len(b):
                    d.kill(signal.SIGKILL)
                time.sleep(0.001)
                return len(b)

        with pytest.raises(sbx.Unavailable):
            n = sb.files.read_to("/tmp/big", Slow())
            pytest.fail("read_to returned %d of %d bytes after sbxd was killed, without an error" % (n, size))
        assert got[0] < size
        follow["thread"].join(20)
        assert not follow["thread"].is_alive(), "logs(follow=True) still hangs 20 s after sbxd died"
        # the follow had no event yet, so its answer had not started: Unavailable (StreamError is one too)
        assert isinstance(follow.get("error"), sbx.Unavailable), follow
    finally:
        if d.proc.poll() is not None:
            d.start()
        c.delete_all([sb])


# --- interrupts ------------------------------------------------------------------------------


def _sigint_default():
    """Run in the child before it execs: SIGINT back to its default, so that
    Python installs its KeyboardInterrupt handler there even when this test
    runs with SIGINT ignored (a background job of a shell without job
    control, which is how a CI harness may start `make test`)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _script(daemon, body, tmp_path):
    path = tmp_path / "attack.py"
    path.write_text("import sys, time\nsys.path.insert(0, %r)\nimport sbx\nc = sbx.Client(%r)\n" % (PYDIR, daemon.host)
                    + textwrap.dedent(body))
    return subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_sigint_default)


def test_keyboard_interrupt_during_snapshot_fork_leaves_nothing(daemon, client, sb, tmp_path):
    snap = sb.snapshot()
    tag = "kbint-" + tmp_path.name[-6:]
    p = _script(daemon, """
        snap = c.snapshot(%r)
        print("forking", flush=True)
        snap.fork(6, parallel=2, meta={"attack": %r})
        print("done", flush=True)
    """ % (snap.name, tag), tmp_path)
    try:
        assert p.stdout.readline().strip() == "forking"
        deadline = time.monotonic() + 60
        while not client.list(meta={"attack": tag}) and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=180)
        assert "KeyboardInterrupt" in out and "done" not in out, out
        time.sleep(1)
        left = [s.id for s in client.list(meta={"attack": tag})]
        assert left == [], "Ctrl-C during snapshot.fork(6) left %d sandboxes: %s" % (len(left), left)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        cleanup_meta(client, "attack", tag)
        snap.delete()


def test_keyboard_interrupt_during_sandbox_fork_leaves_nothing(daemon, client, sb, tmp_path):
    # held: Ctrl-C in a fork tree (count=20: two calls of the API) deletes every child announced
    tag = "kbfork-" + tmp_path.name[-6:]
    p = _script(daemon, """
        sb = c.sandbox(%r)
        print("forking", flush=True)
        sb.fork(count=20, meta={"attack": %r})
        print("done", flush=True)
    """ % (sb.id, tag), tmp_path)
    try:
        assert p.stdout.readline().strip() == "forking"
        deadline = time.monotonic() + 60
        while not client.list(meta={"attack": tag}) and time.monotonic() < deadline:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=180)
        assert "done" not in out, out
        deadline = time.monotonic() + 30
        while client.list(meta={"attack": tag}) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert client.list(meta={"attack": tag}) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        cleanup_meta(client, "attack", tag)


# --- a hostile sandbox's output and files -----------------------------------------------------


def test_endless_output_is_capped_with_memory_bounded(sb):
    tracemalloc.start()
    try:
        with pytest.raises(sbx.TooLarge) as e:
            sb.exec("yes attack", timeout=60, max_output=2 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    m = re.search(r"(ex_[A-Za-z0-9]+)", str(e.value))
    assert m, str(e.value)
    assert peak < 32 << 20, "exec with max_output=2 MiB peaked at %d MiB in the client" % (peak >> 20)
    proc = sb.process(m.group(1))
    assert proc.info().state == "running"
    proc.kill()
    assert proc.wait(max_output=1 << 30, on_stdout=lambda b: None).exit_code != 0


def test_binary_output_and_stderr(sb):
    r = sb.exec("printf '\\377\\376\\000abc\\n'; printf '\\300' >&2; exit 3")
    assert r.exit_code == 3
    assert r.stdout_bytes == b"\xff\xfe\x00abc\n" and r.stderr_bytes == b"\xc0"
    assert r.stdout == "\ufffd\ufffd\x00abc\n" and r.stderr == "\ufffd"


def test_read_of_devices_and_fifos_is_refused(sb):
    sb.exec("mkfifo /tmp/fifo", timeout=10)
    for path in ("/dev/zero", "/dev/urandom", "/tmp/fifo", "/proc/self/fd/0"):
        box = in_thread(lambda: sb.files.read(path))
        box["thread"].join(20)
        assert not box["thread"].is_alive(), "files.read(%s) hangs" % path
        assert isinstance(box.get("error"), sbx.Invalid), (path, box)
        assert box["error"].code == "invalid" and box["error"].status == 400


def test_symlinks_out_of_the_sandbox_stay_in_the_sandbox(sb, tmp_path):
    # read_to / write_from through a link to a host path act on the sandbox's file of that path, never the host's
    marker = tmp_path / "host-marker"
    marker.write_bytes(b"host secret")
    sb.exec("mkdir -p %s && echo sandbox > %s/host-marker && ln -s %s /tmp/up && ln -s / /tmp/root"
            % (tmp_path, tmp_path, marker), timeout=10)
    import io

    buf = io.BytesIO()
    sb.files.read_to("/tmp/up", buf)
    assert buf.getvalue() == b"sandbox\n"
    sb.files.write_from("/tmp/root" + str(marker), io.BytesIO(b"overwritten"))
    assert marker.read_bytes() == b"host secret"
    assert sb.files.read(str(marker)) == b"overwritten"


# --- bad input -------------------------------------------------------------------------------


def test_bad_durations_are_invalid_before_they_are_sent(sb):
    for bad in (-1, -0.5, float("nan"), float("inf"), True, "-5m", "soon", "", "  ", [], "1x"):
        with pytest.raises(sbx.Invalid):
            sb.set_ttl(bad)
    assert sb.set_ttl(datetime.timedelta(minutes=90)).ttl in ("1h30m0s", "1h30m", "90m")
    assert sb.set_ttl(1.5).ttl.startswith("1.5")


def test_huge_durations_are_the_servers_invalid(sb):
    for huge in (10 ** 12, datetime.timedelta.max, 1e300):
        with pytest.raises(sbx.Invalid) as e:
            sb.set_ttl(huge)
        assert e.value.status in (0, 400)


def test_tiny_positive_timeout_is_not_no_timeout(sb):
    r = sb.exec("sleep 3; echo finished", timeout=0.0004)
    assert r.timed_out and "finished" not in r.stdout, r
    assert duration_wire(0.0004, "ttl") not in ("0s", "0ms")


def test_exec_bad_input(sb):
    for bad in ([], (), "", "   ", ["sh", 1], [b"ls"]):
        with pytest.raises(sbx.Invalid):
            sb.exec(bad)
    with pytest.raises(sbx.Invalid):
        sb.exec("true", env={"A=B": "x"})
    with pytest.raises(sbx.Invalid):
        sb.exec("true", env={"": "x"})
    r = sb.exec("echo \"$A\"", env={"A": "x=y=z"})
    assert r.stdout == "x=y=z\n"
    for kw in ({"cwd": "relative/dir"}, {"cwd": "/no/such/dir"}, {"user": "no-such-user"}, {"env": {"A": "nul\0byte"}}):
        try:
            r = sb.exec("pwd", **kw)
        except sbx.SbxError as e:
            assert isinstance(e, sbx.Invalid) and e.code == "invalid", (kw, type(e), e)
        else:
            assert r.exit_code != 0, (kw, r)


def test_fork_bad_counts(sb, client):
    for bad in (0, -1, True, 2.0, "3", None):
        with pytest.raises(sbx.Invalid):
            sb.fork(count=bad)
    with pytest.raises(sbx.Invalid):
        sb.fork(count=2, name="two")
    assert client.list(parent=sb.id) == []


def test_names_with_slashes_and_dots(client):
    for bad in ("a/b", "../x", "a\nb", "a b", "x" * 300):
        with pytest.raises(sbx.Invalid):
            client.create(template="tiny", name=bad)
    for ref in ("a/b", "%2F", "a?b", "a#b", "\u00e9"):
        with pytest.raises(sbx.NotFound):
            client.sandbox(ref)


def test_dot_names_are_not_found(client):
    for ref in ("..", "."):
        with pytest.raises(sbx.NotFound):
            client.sandbox(ref)
        with pytest.raises(sbx.NotFound):
            client.snapshot(ref)


# --- the context manager -----------------------------------------------------------------------


def test_context_manager_deletes_when_the_body_raises_and_keeps_with_keep(client):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with client.create(template="tiny") as s:
            sid = s.id
            raise Boom()
    with pytest.raises(sbx.NotFound):
        client.sandbox(sid)
    with pytest.raises(Boom):
        with client.create(template="tiny", keep=True) as s:
            kept = s.id
            raise Boom()
    try:
        assert client.sandbox(kept).info().state == "ready"
    finally:
        client.delete_all([kept])
    # the body deleted it itself: no error on exit
    with client.create(template="tiny") as s:
        s.delete()


def test_context_manager_exit_when_sbxd_is_stalled(own_daemon):
    # the delete on exit cannot be done: a body that raised keeps its exception; one that did not gets an error naming the sandbox
    d = own_daemon
    c = d.client(timeout=2)

    class Boom(Exception):
        pass

    left = []
    try:
        with pytest.raises(Boom):
            with c.create(template="tiny") as s:
                left.append(s.id)
                os.kill(d.proc.pid, signal.SIGSTOP)
                raise Boom()
        os.kill(d.proc.pid, signal.SIGCONT)
        with pytest.raises(sbx.Unavailable) as e:
            with c.create(template="tiny") as s:
                left.append(s.id)
                os.kill(d.proc.pid, signal.SIGSTOP)
        assert s.id in str(e.value) and "left behind" in str(e.value), str(e.value)
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
        c.delete_all(left)


def test_sandbox_that_kills_its_own_init(client):
    # as on Linux, nothing inside can kill init (pid 1, sbx's agent): the
    # signal is dropped, the exec goes on, the sandbox stays ready
    s = client.create(template="tiny")
    try:
        r = s.exec("kill -9 1; kill -STOP 1; echo still", timeout=20, user="root")
        assert r.exit_code == 0 and r.stdout == "still\n", r
        assert s.info().state == "ready"
        assert s.exec("echo after", timeout=20).stdout == "after\n"
    finally:
        client.delete_all([s])
    with pytest.raises(sbx.NotFound):
        s.info()


# --- listings: many names, odd names (base, for python3 in the sandbox) -----------------------


@pytest.fixture
def bsb(client, base):
    s = client.create(template=base)
    try:
        yield s
    finally:
        client.delete_all([s])


def test_listing_of_100000_names_with_newlines(bsb):
    r = bsb.exec("python3 -c \"import os; os.makedirs('/tmp/d'); "
                 "[open('/tmp/d/n%06d' % i, 'wb').close() for i in range(100000)]; "
                 "open('/tmp/d/new\\nline', 'wb').close()\"", timeout=300)
    assert r.exit_code == 0, r
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        ls = bsb.files.list("/tmp/d")
        took = time.monotonic() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    names = [e.name for e in ls]
    assert len(names) == 100001 and len(set(names)) == 100001
    assert "new\nline" in names
    assert peak < 512 << 20, "listing 100,001 names peaked at %d MiB" % (peak >> 20)
    assert took < 240, took


MAKE_RAW = ("python3 -c \"import os; os.makedirs(b'/tmp/r'); "
            "[open(b'/tmp/r/f\\xff%%05d' %% i, 'wb').close() for i in range(%d)]\"")


def test_listing_of_5001_non_utf8_names(bsb):
    r = bsb.exec(MAKE_RAW % 5001, timeout=120)
    assert r.exit_code == 0, r
    ls = bsb.files.list("/tmp/r")
    assert len(ls) == 5001


def test_non_utf8_names_are_told_apart(bsb):
    r = bsb.exec("python3 -c \"import os; os.makedirs(b'/tmp/r'); open(b'/tmp/r/a\\xff', 'w').close(); "
                 "open(b'/tmp/r/a\\xfe', 'w').close()\"", timeout=60)
    assert r.exit_code == 0, r
    ls = bsb.files.list("/tmp/r")
    assert len(ls) == 2
    assert sorted(e.raw for e in ls) == [b"a\xfe", b"a\xff"], [e.name for e in ls]
    # sbxd's file API takes UTF-8 paths only (it would act on a/U+FFFD): a bytes path that is not is Invalid, not another file
    for call in (lambda: bsb.files.stat(b"/tmp/r/a\xff"), lambda: bsb.files.write(b"/tmp/r/a\xfe", b"x")):
        with pytest.raises(sbx.Invalid):
            call()
    assert bsb.files.stat("/tmp/r".encode()).is_dir
    assert sorted(e.raw for e in bsb.files.list("/tmp/r")) == [b"a\xfe", b"a\xff"]


# --- the pytest plugin -------------------------------------------------------------------------


def plugin_env(daemon):
    env = dict(os.environ, SBX_HOST=daemon.host, PYTHONPATH=PYDIR)
    env.pop("SBX_TOKEN", None)
    return env


def write_project(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def plugin_leftovers(client, snaps_before):
    left = [s.id for s in client.list() if s.info_cache and s.info_cache.meta.get("sbx.pytest")]
    snaps = [s.name for s in client.snapshots() if s.name not in snaps_before]
    return left, snaps


def clean_plugin(client, snaps_before):
    for s in client.list():
        if s.info_cache and s.info_cache.meta.get("sbx.pytest"):
            client.delete_all([s])
    for s in client.snapshots():
        if s.name not in snaps_before:
            try:
                s.delete()
            except sbx.NotFound:
                pass


def test_plugin_hostile_tests(daemon, client, base, tmp_path):
    # a test that hangs (killed at --sbx-timeout), one that kills its machine's processes, a conftest that
    # errors only in the sandbox, and --sbx-runs 0: each is a failure in the report, and nothing is left
    proj = tmp_path / "proj"
    write_project(proj, {
        "pytest.ini": "[pytest]\n",
        "test_hostile.py": """
            import os, time
            def test_hangs():
                time.sleep(1000)
            def test_kills_everything():
                os.system("kill -9 -1")
                time.sleep(5)
            def test_fine():
                pass
        """,
        "sub/conftest.py": """
            import os
            if os.environ.get("SBX_NODEID"):
                raise RuntimeError("conftest boom in the sandbox")
        """,
        "sub/test_sub.py": "def test_in_sub():\n    pass\n",
    })
    before = {s.name for s in client.snapshots()}
    try:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "pytest", "-p", "sbx.pytest_plugin", "-p", "no:cacheprovider", "-rA",
                            "--sbx-template", base, "--sbx-timeout", "8s", "--sbx-runs", "0"],
                           cwd=str(proj), env=plugin_env(daemon), capture_output=True, text=True, timeout=600)
        took = time.monotonic() - t0
        out = p.stdout + p.stderr
        assert p.returncode == 1, out
        assert "FAILED test_hostile.py::test_hangs" in out, out
        assert "FAILED test_hostile.py::test_kills_everything" in out, out
        assert "PASSED test_hostile.py::test_fine" in out, out
        assert "FAILED sub/test_sub.py::test_in_sub" in out and "conftest boom in the sandbox" in out, out
        assert re.search(r"3 failed, 1 passed", out), out
        assert took < 300, took
        assert plugin_leftovers(client, before) == ([], [])
    finally:
        clean_plugin(client, before)


def test_plugin_keyboard_interrupt_leaves_nothing(daemon, client, base, tmp_path):
    proj = tmp_path / "proj"
    write_project(proj, {"pytest.ini": "[pytest]\n", "test_slow.py": "import time\ndef test_slow():\n    time.sleep(8)\n"})
    before = {s.name for s in client.snapshots()}
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "sbx.pytest_plugin", "-p", "no:cacheprovider",
                          "--sbx-template", base, "--sbx-runs", "3"],
                         cwd=str(proj), env=plugin_env(daemon), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 300
        while not client.list(meta={"sbx.pytest": "rate"}):
            assert time.monotonic() < deadline and p.poll() is None, "no rate fork appeared"
            time.sleep(0.2)
        time.sleep(1)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=120)
        took = time.monotonic() - t0
        assert "KeyboardInterrupt" in out or "Interrupted" in out, out
        assert plugin_leftovers(client, before) == ([], []), out
        assert took < 60, "pytest took %.0f s to stop after Ctrl-C" % took
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        clean_plugin(client, before)


# --- more: timeouts that leave work behind, memory of a big read, lying sizes, wrong state -------


def test_create_that_times_out_leaves_no_sandbox(daemon, client, tmp_path):
    tag = "late-" + tmp_path.name[-6:]
    impatient = sbx.Client(daemon.host, timeout=0.05)
    try:
        with pytest.raises(sbx.Unavailable) as e:
            impatient.create(template="tiny", meta={"attack": tag})
        assert re.search(r"sb_\w+, was deleted", str(e.value)), str(e.value)
        time.sleep(8)
        left = [s.id for s in client.list(meta={"attack": tag})]
        assert left == [], "create timed out in the client, and left %s" % left
    finally:
        time.sleep(2)
        cleanup_meta(client, "attack", tag)


def test_keyboard_interrupt_stops_replay(daemon, client, sb, tmp_path):
    snap = sb.snapshot()
    p = _script(daemon, """
        print("replaying", flush=True)
        c.replay(%r, 1, "sleep 4", n=6, parallel=1)
        print("done", flush=True)
    """ % snap.name, tmp_path)
    try:
        assert p.stdout.readline().strip() == "replaying"
        deadline = time.monotonic() + 60
        while not client.list(meta={"sbx.replay": "1"}) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=180)
        took = time.monotonic() - t0
        assert "done" not in out, out
        assert took < 10, "replay(n=6) went on for %.0f s after Ctrl-C" % took
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        cleanup_meta(client, "sbx.replay", "1")
        snap.delete()


def test_keyboard_interrupt_stops_flake_rate(daemon, client, sb, tmp_path):
    # Ctrl-C in flake_rate: no more runs start, the runs under way end with their forks, and no fork is left
    p = _script(daemon, """
        print("measuring", flush=True)
        c.flake_rate("sleep 30", sandbox=c.sandbox(%r), n=6, parallel=2)
        print("measured", flush=True)
    """ % sb.id, tmp_path)
    try:
        assert p.stdout.readline().strip() == "measuring"
        deadline = time.monotonic() + 60
        running = []
        while not running and time.monotonic() < deadline:  # until a run is under way
            for k in client.list(meta={"sbx.flake-rate": "1"}, state="ready"):
                try:
                    running += [x for x in k.execs() if x.state == "running"]
                except sbx.NotFound:
                    pass
            time.sleep(0.1)
        assert running, "no run of flake_rate started"
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=180)
        took = time.monotonic() - t0
        assert "measured" not in out and "KeyboardInterrupt" in out, out
        assert took < 10, "flake_rate(n=6) went on for %.0f s after Ctrl-C" % took
        assert client.list(meta={"sbx.flake-rate": "1"}) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        cleanup_meta(client, "sbx.flake-rate", "1")


def test_read_past_max_size_is_too_large_with_memory_bounded(sb):
    assert sb.exec("truncate -s 64M /tmp/sparse || dd if=/dev/zero of=/tmp/sparse bs=1M count=64", timeout=60).exit_code == 0
    cap = 16 << 20
    tracemalloc.start()
    try:
        with pytest.raises(sbx.TooLarge):
            sb.files.read("/tmp/sparse", max_size=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * cap, "files.read(max_size=16 MiB) peaked at %d MiB" % (peak >> 20)


def test_write_from_a_file_shorter_than_its_size(sb):
    import io

    sb.files.write("/tmp/victim", b"original")
    with pytest.raises(sbx.SbxError):
        sb.files.write_from("/tmp/victim", io.BytesIO(b"short"), size=1000)
    assert sb.files.read("/tmp/victim") == b"original"


def test_calls_on_a_stopped_sandbox_are_conflicts(client):
    s = client.create(template="tiny")
    try:
        s.stop()
        for call in (lambda: s.exec("true"), lambda: s.files.read("/etc/hostname"), lambda: s.files.list("/"),
                     lambda: s.start("true"), lambda: s.fork()):
            with pytest.raises(sbx.Conflict) as e:
                call()
            assert e.value.code == "conflict" and e.value.status == 409
        assert client.list(parent=s.id) == []
    finally:
        client.delete_all([s])


def _plugin_run(daemon, client, proj, *args):
    before = {s.name for s in client.snapshots()}
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-p", "sbx.pytest_plugin", "-p", "no:cacheprovider", "-rA",
                            "--sbx-template", "base"] + list(args),
                           cwd=str(proj), env=plugin_env(daemon), capture_output=True, text=True, timeout=600)
        assert plugin_leftovers(client, before) == ([], [])
        return p.stdout + p.stderr
    finally:
        clean_plugin(client, before)


PARAMS = {
    "pytest.ini": "[pytest]\n",
    "test_params.py": """
        import pytest
        @pytest.mark.parametrize("x", ["plain", "sp ace", "\\u00e9t\\u00e9", "a/b", "new\\nline"])
        def test_odd_ids(x):
            assert x
        @pytest.mark.parametrize("x", ["a::b"])
        def test_colons(x):
            assert x
        @pytest.mark.xfail(reason="not strict")
        def test_xpass():
            pass
    """,
}


def test_plugin_parametrized_ids(daemon, client, base, tmp_path):
    # held: odd parametrize ids (spaces, non-ASCII, slashes, newlines) find their test in the sandbox
    proj = tmp_path / "proj"
    write_project(proj, PARAMS)
    out = _plugin_run(daemon, client, proj, "-k", "odd_ids")
    assert re.search(r"\b5 passed\b", out) and "failed" not in out, out


def test_plugin_id_with_double_colon(daemon, client, base, tmp_path):
    # held: a parametrize id holding '::' still selects its test in the sandbox
    proj = tmp_path / "proj"
    write_project(proj, PARAMS)
    out = _plugin_run(daemon, client, proj, "-k", "colons")
    assert "PASSED test_params.py::test_colons[a::b]" in out, out


def test_plugin_xpass(daemon, client, base, tmp_path):
    proj = tmp_path / "proj"
    write_project(proj, PARAMS)
    out = _plugin_run(daemon, client, proj, "-k", "xpass")
    assert "XPASS" in out and "1 xpassed" in out, out



def test_plugin_keyboard_interrupt_during_a_create(daemon, client, base, tmp_path):
    proj = tmp_path / "proj"
    write_project(proj, {"pytest.ini": "[pytest]\n",
                         "test_many.py": "import pytest\n@pytest.mark.parametrize('i', range(40))\ndef test_quick(i):\n    pass\n"})
    before = {s.name for s in client.snapshots()}
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "sbx.pytest_plugin", "-p", "no:cacheprovider",
                          "--sbx-template", base], cwd=str(proj), env=plugin_env(daemon),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_sigint_default)
    try:
        deadline = time.monotonic() + 300
        seen_test = 0
        while True:
            assert time.monotonic() < deadline and p.poll() is None, "no test machine was seen being made"
            creating = [s for s in client.list(meta={"sbx.pytest": "test"}) if s.info_cache.state == "creating"]
            if creating:
                seen_test += 1
                if seen_test >= 3:  # let a couple of tests run first, then interrupt a create
                    p.send_signal(signal.SIGINT)
                    break
                while client.list(meta={"sbx.pytest": "test"}):
                    time.sleep(0.01)
            time.sleep(0.005)
        out, _ = p.communicate(timeout=120)
        time.sleep(5)
        left = plugin_leftovers(client, before)
        assert left == ([], []), (left, out[-2000:])
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        clean_plugin(client, before)


@pytest.mark.xfail(strict=True, reason="open: a file whose name is not UTF-8 cannot be addressed: sbxd's file API takes "
                   "its path as a UTF-8 query value (a bytes path sbxd would mangle is Invalid in the client)")
def test_non_utf8_path_can_be_read(sb):
    assert sb.exec("printf x > \"$(printf '/tmp/a\\377')\"", timeout=10).exit_code == 0
    errs = []
    for path in (os.fsdecode(b"/tmp/a\xff"), b"/tmp/a\xff"):
        try:
            assert sb.files.read(path) == b"x"
            return
        except Exception as e:  # noqa: B902
            errs.append(e)
    assert all(isinstance(e, sbx.SbxError) for e in errs), errs
    pytest.fail("no way to read /tmp/a\\xff: %r" % errs)


def test_bad_paths(sb):
    for bad in ("", "relative", "/tmp/nul\0byte", "/tmp/new\nline/../x"):
        try:
            sb.files.write(bad, b"x")
        except sbx.SbxError as e:
            assert isinstance(e, sbx.Invalid), (bad, type(e), e)
    sb.files.mkdir("/tmp/adir")
    with pytest.raises(sbx.Invalid):
        sb.files.read("/tmp/adir")
    with pytest.raises(sbx.NotFound):
        sb.files.read("/no/such/file")
    with pytest.raises(sbx.NotFound):
        sb.files.list("/no/such/dir")
    for bad in (["echo", "nul\0"],):
        try:
            sb.exec(bad)
        except sbx.SbxError as e:
            assert isinstance(e, sbx.Invalid), (bad, type(e), e)


def test_unreachable_hosts_are_unavailable():
    for host in ("unix:///nonexistent/sbxd.sock", "tcp://127.0.0.1:1"):
        with pytest.raises(sbx.Unavailable):
            sbx.Client(host, timeout=2).health()
    for host in ("http://", "ftp://x", "nothing", "unix://"):
        with pytest.raises(sbx.Invalid):
            sbx.Client(host)


def test_context_manager_keeps_the_bodys_exception_when_sbxd_is_gone(own_daemon):
    d = own_daemon
    c = d.client(timeout=5)
    made = []
    try:
        with pytest.raises(ValueError):
            with c.create(template="tiny") as s:
                made.append(s.id)
                d.kill(signal.SIGKILL)
                raise ValueError("the test's own failure")
    finally:
        if d.proc.poll() is not None:
            d.start()
        c.delete_all(made)


def test_follows_end_when_the_sandbox_is_deleted(client):
    # held: events(follow=True), logs(follow=True) of a running exec and Process.wait all end when the sandbox goes
    s = client.create(template="tiny")
    try:
        p = s.start("echo tick; sleep 1000")
        follows = {
            "events": in_thread(lambda: [e for e in s.events(follow=True)]),
            "logs": in_thread(lambda: [e for e in s.logs(stream="exec/" + p.id, follow=True)]),
            "wait": in_thread(p.wait),
        }
        time.sleep(1.5)
        s.delete()
        for what, box in follows.items():
            box["thread"].join(30)
            assert not box["thread"].is_alive(), "%s still follows 30 s after the sandbox was deleted" % what
            err = box.get("error")
            assert err is None or isinstance(err, sbx.SbxError), (what, err)
    finally:
        client.delete_all([s])
