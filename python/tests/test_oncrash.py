"""exec(on_crash=True): the crash of the command (or a process it started) as the sandbox caught it, and the boot's spent capture."""

import pytest

import sbx


def _drop_crash_snapshots(client, s):
    for cr in s.crashes():
        try:
            client.snapshot(cr.snapshot).delete()
        except sbx.NotFound:
            pass


def test_exec_on_crash_catches_and_then_is_spent(client, sb):
    try:
        r = sb.exec("kill -SEGV $$", on_crash=True, timeout=60)
        assert r.exit_code == 139, r
        assert r.crash is not None, r
        assert r.crash.signal == "SIGSEGV" and r.crash.snapshot, r.crash
        assert [c.snapshot for c in sb.crashes()] == [r.crash.snapshot]
        # a child's crash (the shell goes on and exits 0) is still the exec's
        again = sb.exec("sh -c 'kill -SEGV $$'; exit 0", on_crash=True, timeout=60)
        assert again.exit_code == 0 and again.crash is None
        # the boot's one capture is spent: the second crash of the command itself says on what
        r2 = sb.exec("kill -SEGV $$", on_crash=True, timeout=60)
        assert r2.exit_code == 139 and r2.crash is None, r2
        assert "spent" in r2.crash_missed and r.crash.snapshot in r2.crash_missed, r2.crash_missed
        # a normal exit is untouched
        ok = sb.exec("exit 3", on_crash=True)
        assert ok.exit_code == 3 and ok.crash is None and ok.crash_missed == ""
    finally:
        _drop_crash_snapshots(client, sb)


def test_on_crash_refuses_capture_off(client):
    s = client.create(template="tiny", meta={"sbx.crashes": "off"})
    try:
        with pytest.raises(sbx.Invalid, match="crash capture off"):
            s.exec("echo ran", on_crash=True)
        with pytest.raises(sbx.Invalid, match="crash capture off"):
            s.start("echo ran", on_crash=True)
        assert s.execs() == []
    finally:
        s.delete()
