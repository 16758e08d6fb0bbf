"""What needs no daemon: durations, commands, error kinds, hosts, the Wilson interval."""

import datetime
import os
import socket
import tempfile
import threading

import pytest

import sbx
from sbx._http import error_event
from sbx.errors import error_from_body
from sbx.types import duration_wire


@pytest.mark.parametrize(
    "given,want",
    [
        (90, "90s"),
        (0, "0s"),
        (1.5, "1500ms"),
        (datetime.timedelta(minutes=30), "1800s"),
        ("3600", "3600s"),
        ("90s", "90s"),
        ("2h", "2h"),
        ("1h30m", "1h30m"),
        (None, None),
    ],
)
def test_duration_wire(given, want):
    assert duration_wire(given, "ttl") == want


@pytest.mark.parametrize("bad", ["bogus", "-5", -1, "5 minutes", float("nan"), True, [], "1d"])
def test_bad_durations_are_invalid(bad):
    with pytest.raises(sbx.Invalid) as e:
        duration_wire(bad, "ttl")
    assert "ttl" in str(e.value)


def test_argv():
    assert sbx.argv("ls | wc -l") == ["/bin/sh", "-c", "ls | wc -l"]
    assert sbx.argv(["ls", "-la"]) == ["ls", "-la"]
    for bad in ("", "   ", [], ["ls", 3]):
        with pytest.raises(sbx.Invalid):
            sbx.argv(bad)


@pytest.mark.parametrize(
    "status,code,cls",
    [
        (404, "not_found", sbx.NotFound),
        (409, "conflict", sbx.Conflict),
        (400, "invalid", sbx.Invalid),
        (403, "forbidden", sbx.Forbidden),
        (503, "unavailable", sbx.Unavailable),
        (413, "too_large", sbx.TooLarge),
        (401, "unauthorized", sbx.Unauthorized),
        (500, "internal", sbx.Internal),
    ],
)
def test_error_kinds(status, code, cls):
    e = error_from_body(status, "X", b'{"error": {"code": "%s", "message": "said so"}}' % code.encode())
    assert type(e) is cls and e.code == code and e.message == "said so" and e.status == status
    assert isinstance(e, sbx.SbxError)
    # a body that is not the API's still gets the kind of its status, quoting the body
    e = error_from_body(status, "Reason", b"<html>proxy error</html>")
    assert type(e) is cls and "proxy error" in e.message and str(status) in e.message


@pytest.mark.parametrize(
    "doc,want",
    [
        ({"error": {"code": "not_found", "message": "gone"}}, ("not_found", "gone")),
        ({"event": "error", "error": {"code": "conflict", "message": "taken"}}, ("conflict", "taken")),
        # the flat shape of an sbxd older than the one envelope
        ({"error": "gone", "code": "not_found"}, ("not_found", "gone")),
        ({"error": "boom"}, ("", "boom")),
        ({}, ("", "")),
        ("not a dict", ("", "")),
    ],
)
def test_error_event(doc, want):
    assert error_event(doc) == want


def test_error_kinds_match_api_errors_go():
    # every code of api/errors.go has its class
    from conftest import REPO
    import re

    src = open(os.path.join(REPO, "api", "errors.go")).read()
    codes = set(re.findall(r'\{Err\w+, "(\w+)", http\.Status\w+\}', src))
    assert len(codes) >= 8
    from sbx.errors import _BY_CODE

    assert codes == set(_BY_CODE), "api/errors.go codes %s, Python has %s" % (sorted(codes), sorted(_BY_CODE))


@pytest.mark.parametrize("host", ["nonsense", "ftp://x", "unix://", "tcp://"])
def test_bad_host_is_invalid(host):
    with pytest.raises(sbx.Invalid):
        sbx.Client(host)


def test_host_and_token_from_env(monkeypatch):
    monkeypatch.setenv("SBX_HOST", "tcp://127.0.0.1:1")
    monkeypatch.setenv("SBX_TOKEN", "t0k")
    c = sbx.Client()
    assert c.host == "tcp://127.0.0.1:1" and c._t.token == "t0k"


def test_unreachable_is_unavailable():
    d = tempfile.mkdtemp()
    with pytest.raises(sbx.Unavailable) as e:
        sbx.Client("unix://" + os.path.join(d, "none.sock")).health()
    assert "cannot reach sbxd" in str(e.value)
    os.rmdir(d)


def test_connection_closed_before_answer_is_unavailable():
    # a server that accepts and hangs up at once, on the unix socket
    d = tempfile.mkdtemp()
    path = os.path.join(d, "s.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.recv(1024)
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    try:
        with pytest.raises(sbx.Unavailable) as e:
            sbx.Client("unix://" + path).health()
        assert "broke before its answer" in str(e.value)
    finally:
        t.join(5)
        srv.close()
        os.unlink(path)
        os.rmdir(d)


@pytest.mark.parametrize(
    "failures,runs,lo,hi",
    [(0, 10, 0, 0.27754), (5, 10, 0.23659, 0.76341), (10, 10, 0.72246, 1), (7, 50, 0.06951, 0.26186),
     (1, 1, 0.20654, 1), (30, 100, 0.21895, 0.39585), (0, 0, 0, 1)],
)
def test_wilson_as_internal_flaky(failures, runs, lo, hi):
    # the values of internal/flaky/wilson_test.go
    got = sbx.wilson(failures, runs)
    assert abs(got[0] - lo) < 5e-5 and abs(got[1] - hi) < 5e-5, got


def test_rate_summary_string():
    from sbx.flaky import summarize

    runs = [sbx.Run(i, i, "sb", 1 if i < 7 else 0, i >= 7, 1) for i in range(50)]
    assert str(summarize(runs)) == "7/50 failed: rate 14.0% (95% Wilson interval 7.0%–26.2%)"


def test_everything_public_has_a_docstring():
    import inspect

    import sbx.flaky
    import sbx.pytest_plugin

    missing = []
    for mod in (sbx, sbx.flaky, sbx.pytest_plugin):
        if not (mod.__doc__ or "").strip():
            missing.append(mod.__name__)
    for name in sbx.__all__:
        obj = getattr(sbx, name)
        if not callable(obj):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for mname, m in vars(obj).items():
                if mname.startswith("_") or not (inspect.isfunction(m) or isinstance(m, property)):
                    continue
                if not (m.__doc__ or "").strip():
                    missing.append("%s.%s" % (name, mname))
    for fn in (sbx.flaky.hunt, sbx.flaky.flake_rate, sbx.flaky.replay, sbx.flaky.summarize):
        if not (fn.__doc__ or "").strip():
            missing.append(fn.__name__)
    assert not missing, "no docstring: %s" % missing


def _fake_sbxd(answers):
    """_fake_sbxd serves one connection per item of answers on a unix socket: each
    reads a request (its head) and writes the bytes the item gives for it
    (a function of the head). It returns the socket's path, the heads read,
    and a function that stops it."""
    d = tempfile.mkdtemp()
    path = os.path.join(d, "s.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(len(answers))
    heads = []

    def serve():
        for answer in answers:
            conn, _ = srv.accept()
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":", 1)[1])
            while len(body) < n:
                body += conn.recv(4096)
            heads.append(head.decode())
            conn.sendall(answer(head.decode()))
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def stop():
        t.join(5)
        srv.close()
        os.unlink(path)
        os.rmdir(d)

    return path, heads, stop


def _ok(doc):
    import json
    body = json.dumps(doc).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


_SB = {"id": "sb_wait", "state": "ready", "memoryRestored": True}


def _info(status, why):
    return b"HTTP/1.1 %d Processing\r\nSbx-Waiting: %s\r\n\r\n" % (status, why.encode())


def test_resume_hears_why_it_waits():
    # a fleet's controller: 102s saying why, then the answer; the client asks
    # for them only when it has someone to tell
    def resume(head):
        if "sbx-progress: 102" not in head.lower():
            return _ok(_SB)
        return b"".join(_info(102, "waiting for node-%d" % i) for i in range(12)) + _info(103, "hints") + _ok(_SB)

    path, heads, stop = _fake_sbxd([lambda h: _ok(_SB), resume, resume])
    try:
        sb = sbx.Client("unix://" + path).sandbox("sb_wait", keep=True)
        heard = []
        r = sb.resume(require_memory=True, on_wait=heard.append)
        assert r.memory_restored
        assert heard == ["waiting for node-%d" % i for i in range(sbx.MAX_WAITS)]
        assert sb.resume(require_memory=True).memory_restored
    finally:
        stop()
    assert "sbx-progress: 102" in heads[1].lower() and "sbx-progress" not in heads[2].lower()


def test_informational_answers_are_not_the_answer():
    # a 102 nobody asked for is read past, not taken for the answer; a
    # flood of them is not sbx's
    path, _, stop = _fake_sbxd([
        lambda h: _info(102, "unasked") + _ok({"status": "ok"}),
        lambda h: _info(102, "x") * (sbx._http.MAX_INFORMATIONAL + 1) + _ok({"status": "ok"}),
    ])
    try:
        c = sbx.Client("unix://" + path)
        assert c._t.call("GET", "/v1/health") == {"status": "ok"}
        with pytest.raises(sbx.Unavailable) as e:
            c._t.call("GET", "/v1/health")
        assert "informational" in str(e.value)
    finally:
        stop()
