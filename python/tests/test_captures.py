"""Snapshots, forks, stop and resume."""

import time

import pytest

import sbx


def counter(sb):
    # a detached loop that counts in memory and writes the count each 0.1 s; the rename makes
    # each write whole, so a read (or a capture) between the shell's truncate and its write
    # never sees an empty file
    sb.start("i=0; while :; do i=$((i+1)); echo $i > /tmp/count.t; mv /tmp/count.t /tmp/count; sleep 0.1; done")
    deadline = time.monotonic() + 20
    while True:
        r = sb.exec("cat /tmp/count 2>/dev/null")
        if r.stdout.strip().isdigit() and int(r.stdout) > 3:
            return int(r.stdout)
        assert time.monotonic() < deadline, "the counter did not start"
        time.sleep(0.1)


def read_count(sb):
    return int(sb.exec("cat /tmp/count").stdout)


def test_disk_snapshot_and_sandboxes_from_it(client, sb):
    sb.files.write("/data/x", b"before")
    snap = sb.snapshot("py-disk-%d" % time.monotonic_ns())
    try:
        assert snap.info.memory is False and snap.info.sandbox_id == sb.id
        sb.files.write("/data/x", b"after")
        assert client.snapshot(snap.name).name == snap.name
        assert snap.name in [s.name for s in client.snapshots()]
        kids = client.snapshot(snap.name).fork(2)
        try:
            assert len({k.id for k in kids}) == 2
            for k in kids:
                assert k.files.read("/data/x") == b"before"
        finally:
            client.delete_all(kids)
        with pytest.raises(sbx.Conflict):
            sb.snapshot(snap.name)
        with pytest.raises(sbx.Invalid):
            sb.snapshot("bad name!")
    finally:
        snap.delete()
    with pytest.raises(sbx.NotFound):
        client.snapshot(snap.name)
    with pytest.raises(sbx.NotFound):
        snap.delete()


def test_memory_fork_carries_on_processes(client, sb):
    c0 = counter(sb)
    kids = sb.fork(count=3, memory=True, meta={"role": "kid"})
    try:
        assert len(kids) == 3
        for k in kids:
            info = k.info()
            assert info.parent == sb.id and info.memory_restored and info.meta.get("role") == "kid"
            assert read_count(k) >= c0  # it carried on from the parent's count, not from 0
        assert {k.id for k in client.list(parent=sb.id)} == {k.id for k in kids}
    finally:
        client.delete_all(kids)


def test_disk_fork_boots_fresh(client, sb):
    counter(sb)
    sb.files.write("/data/y", b"disk")
    [kid] = sb.fork(name="py-fork-%d" % (time.monotonic_ns() % 10**9))
    try:
        assert kid.info().memory_restored is False and kid.name.startswith("py-fork-")
        assert kid.files.read("/data/y") == b"disk"
        # no counter runs in it: the count file stays as copied
        c = read_count(kid)
        time.sleep(0.5)
        assert read_count(kid) == c
    finally:
        kid.delete()


def test_fork_bad_input(sb):
    for bad in (0, -1, "2", True):
        with pytest.raises(sbx.Invalid) as e:
            sb.fork(count=bad)
        assert "count %r is out of range: a fork makes at least 1 sandbox" % (bad,) in str(e.value)
    with pytest.raises(sbx.Invalid) as e:
        sb.fork(count=2, name="two-named")
    assert "name: only a single fork can be named" in str(e.value)
    with pytest.raises(sbx.Invalid):
        sb.fork(ttl="whenever")


def test_fork_past_16_grows_a_tree(client, sb):
    kids = sb.fork(count=17)
    try:
        assert len({k.id for k in kids}) == 17
        parents = {k.info().parent for k in kids}
        assert sb.id in parents and len(parents) == 2  # 16 of sb, 1 of a child
    finally:
        client.delete_all(kids)


def test_stop_resume_keeps_memory(sb):
    counter(sb)
    info = sb.stop()
    assert info.state == "stopped"
    with pytest.raises(sbx.Conflict):
        sb.exec("true")
    with pytest.raises(sbx.Conflict):
        sb.stop()
    res = sb.resume(require_memory=True)
    assert res.memory_restored is True and res.reason == "" and res.info.state == "ready"
    c1 = read_count(sb)
    time.sleep(0.5)
    assert read_count(sb) > c1, "the counter did not come back alive"
    with pytest.raises(sbx.Conflict):
        sb.resume()


def test_memory_snapshot_and_delete_with_snapshots(client):
    sb = client.create(template="tiny")
    try:
        counter(sb)
        snap = sb.snapshot(memory=True)
        assert snap.info.memory is True and snap.name.startswith("snap-")
        [kid] = snap.fork(1)
        try:
            assert kid.info().memory_restored is True
            c = read_count(kid)
            time.sleep(0.5)
            assert read_count(kid) > c
        finally:
            kid.delete()
    finally:
        removed = sb.delete(with_snapshots=True)
    assert removed == [snap.name]
    with pytest.raises(sbx.NotFound):
        client.snapshot(snap.name)


def test_snapshot_fork_is_all_or_nothing(client, sb):
    snap = sb.snapshot()
    try:
        kids = snap.fork(5, parallel=3, meta={"from": "snap"})
        try:
            assert len({k.id for k in kids}) == 5 and all(k.info().from_snapshot == snap.name for k in kids)
        finally:
            client.delete_all(kids)
        with pytest.raises(sbx.Invalid):
            snap.fork(0)
        with pytest.raises(sbx.Invalid):
            snap.fork(2, ttl="later")
        # a batch whose creates sbxd refuses leaves none behind
        with pytest.raises(sbx.Invalid):
            snap.fork(3, meta={"": "no key"})
        assert client.list(meta={"from": "snap"}) == []
    finally:
        snap.delete()
