"""Logs, events, previews, ports, metrics, templates — and streams that break under the client."""

import os
import signal
import threading
import time
import urllib.request

import pytest

import sbx


def test_logs_of_an_exec_and_the_events_stream(sb):
    r = sb.exec("echo to-out; echo to-err >&2")
    chunks = list(sb.logs(stream="exec/" + r.exec_id))
    streams = {c.stream for c in chunks}
    assert b"".join(c.data for c in chunks if c.stream.endswith("stdout")) == b"to-out\n"
    assert b"".join(c.data for c in chunks if c.stream.endswith("stderr")) == b"to-err\n"
    assert streams <= {"exec/%s/stdout" % r.exec_id, "exec/%s/stderr" % r.exec_id}
    text = b"".join(c.data for c in sb.logs(stream="events")).decode()
    assert "created" in text
    assert len(list(sb.logs(stream="events", tail=1))) == 1
    with pytest.raises(sbx.Invalid):
        list(sb.logs(stream="no-such-stream"))
    with pytest.raises(sbx.Invalid):
        sb.logs(tail=-1)


def test_console_log_follow(sb):
    got = []

    def follow():
        it = sb.logs(stream="console", follow=True)
        for ev in it:
            got.append(ev.data)
            if b"hello-console" in b"".join(got):
                it.close()  # drops the connection
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    time.sleep(0.5)
    sb.exec("echo hello-console > /dev/console")
    t.join(30)
    assert not t.is_alive() and b"hello-console" in b"".join(got)


def test_events_follow_and_after(sb):
    evs = list(sb.events())
    assert evs and [e.seq for e in evs] == sorted(e.seq for e in evs)
    assert any(e.type == "created" for e in evs)
    last = evs[-1].seq
    assert list(sb.events(after=last)) == []
    seen = []

    def follow():
        for e in sb.events(follow=True, after=last):
            seen.append(e)
            if e.type == "snapshot":
                return

    t = threading.Thread(target=follow)
    t.start()
    time.sleep(0.3)
    snap = sb.snapshot()
    t.join(30)
    snap.delete()
    assert not t.is_alive() and seen[-1].type == "snapshot" and seen[-1].detail["name"] == snap.name
    assert all(e.seq > last for e in seen)


def test_preview_ports_metrics(sb):
    sb.start("mkdir -p /www && echo hi-from-inside > /www/index.html && httpd -f -p 8080 -h /www")
    deadline = time.monotonic() + 20
    while 8080 not in [p.port for p in sb.ports()]:
        assert time.monotonic() < deadline, "nothing listens on 8080"
        time.sleep(0.2)
    url = sb.preview_url(8080)
    assert url.startswith("http://8080-%s." % sb.id)
    assert 8080 in [p["port"] for p in sb.previews()]
    # the preview proxy is on loopback: reach it by its port, naming the host in the Host header
    host = url.split("//")[1].split("/")[0]
    port = host.rsplit(":", 1)[1]
    req = urllib.request.Request("http://127.0.0.1:%s/" % port, headers={"Host": host})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.read() == b"hi-from-inside\n"
    private = sb.preview_url(8080, private=True, ttl="10m")
    assert "token" in private or "sbx_token" in private or private != url
    sb.unpreview(8080)
    assert sb.previews() == []
    with pytest.raises(sbx.Invalid):
        sb.preview_url(70000)
    m = sb.metrics()
    assert m.processes >= 1 and m.memory_bytes > 0


def test_templates_and_health(client):
    names = [t.name for t in client.templates()]
    assert "tiny" in names
    t = client.template("tiny")
    assert t.version.startswith("sha256:")
    with pytest.raises(sbx.NotFound):
        client.template("no-such-template")
    assert "sbx" in client.prometheus()


def test_stream_broken_by_sbxd_dying(own_daemon):
    # sbxd killed mid-exec: the stream breaks, the error names the exec, the exec goes on;
    # sbxd restarted, waiting again gives its whole output
    d = own_daemon
    c = d.client()
    c.build_template("tiny")
    sb = c.create(template="tiny")
    out = []
    errs = []

    def run():
        try:
            sb.exec_stream("echo begin; sleep 3; echo end", on_stdout=out.append, timeout=60)
        except sbx.SbxError as e:
            errs.append(e)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 20
    while not out:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    d.kill(signal.SIGKILL)
    t.join(30)
    assert len(errs) == 1 and isinstance(errs[0], sbx.StreamError) and isinstance(errs[0], sbx.Unavailable)
    e = errs[0]
    assert e.exec_id.startswith("ex_") and e.sandbox_id == sb.id and "goes on" in str(e)
    with pytest.raises(sbx.Unavailable):
        c.health()
    d.start()
    r = sb.process(e.exec_id).wait()
    assert r.exit_code == 0 and r.stdout == "begin\nend\n"


def test_follow_broken_by_sbxd_stopping(own_daemon):
    d = own_daemon
    c = d.client()
    c.build_template("tiny")
    sb = c.create(template="tiny")
    errs = []
    seen = []

    def follow():
        try:
            for ev in sb.events(follow=True):
                seen.append(ev)
        except sbx.SbxError as e:
            errs.append(e)

    t = threading.Thread(target=follow)
    t.start()
    deadline = time.monotonic() + 20
    while not seen:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    d.kill(signal.SIGTERM)
    t.join(30)
    assert not t.is_alive()
    assert len(errs) == 1 and isinstance(errs[0], sbx.Unavailable), errs
    if isinstance(errs[0], sbx.StreamError):
        assert errs[0].last_seq == seen[-1].seq
    d.start()


def test_import_and_remove_a_template(client, tmp_path):
    import io
    import shutil
    import tarfile

    busybox = shutil.which("busybox") or "/bin/busybox"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(busybox, arcname="bin/busybox")
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tf.addfile(link)
        for d in ("etc", "tmp", "proc", "dev", "sys", "root"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(ti)
    size = buf.tell()
    buf.seek(0)
    name = "py-imp-" + tmp_path.name[-6:].replace("_", "-").strip("-")
    t = client.import_template(name, buf, size)
    try:
        assert t.name == name and t.version.startswith("sha256:")
        with client.create(template=name) as sb:
            assert sb.exec(["/bin/busybox", "echo", "imported"]).stdout == "imported\n"
    finally:
        client.remove_template(name)
    with pytest.raises(sbx.NotFound):
        client.template(name)
    with pytest.raises(sbx.NotFound):
        client.remove_template(name)


def test_tcp_with_a_token():
    import socket as _socket

    from conftest import finish, start_daemon

    s = _socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    import tempfile

    tf = tempfile.NamedTemporaryFile("w", delete=False)
    tf.write("py-test-token-123\n")
    tf.close()
    d = start_daemon(["--listen", "127.0.0.1:%d" % port, "--token-file", tf.name])
    try:
        c = sbx.Client("tcp://127.0.0.1:%d" % port, token="py-test-token-123")
        assert c.health()["status"] == "ok"
        c.build_template("tiny")
        with c.create(template="tiny") as sb:
            assert sb.exec("echo over-tcp").stdout == "over-tcp\n"
        with pytest.raises(sbx.Unauthorized) as e:
            sbx.Client("tcp://127.0.0.1:%d" % port, token="wrong").list()
        assert e.value.status == 401
        with pytest.raises(sbx.Unauthorized):
            sbx.Client("tcp://127.0.0.1:%d" % port, token="").list()
    finally:
        finish(d)
        os.unlink(tf.name)


def test_trace_of_a_monitored_sandbox(client):
    with client.create(template="tiny", monitor=True) as s:
        assert s.exec("cat /etc/hostname > /dev/null; echo hi > /tmp/traced", timeout=30).exit_code == 0
        deadline = time.monotonic() + 20
        while True:
            tr = s.trace()
            if any(e.get("path") == "/tmp/traced" for e in tr["events"]) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert tr["connected"] and tr["sandboxId"] == s.id, tr
        assert any(e.get("path") == "/tmp/traced" for e in tr["events"]), tr["events"][-20:]
    with client.create(template="tiny") as s:
        with pytest.raises(sbx.Conflict):
            s.trace()
