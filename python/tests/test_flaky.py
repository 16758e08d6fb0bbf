"""hunt, flake_rate and replay against the real sbxd (tiny; the test fails when $SEED is a multiple of 3)."""

import pytest

import sbx

TEST = 'echo "seed $SEED" > /tmp/last; sleep 1000 & test $((SEED % 3)) -ne 0'


def test_hunt_keeps_the_failure_frozen(client):
    res = client.hunt(TEST, template="tiny", seeds=[1, 2, 4, 6, 7], name=None)
    assert res.found and res.runs == 4 and res.seed == 6 and res.run.exit_code == 1
    sb = res.sandbox
    try:
        assert sb.info().state == "stopped" and res.resume == "sbx resume " + sb.id
        r = sb.resume(require_memory=True)
        assert r.memory_restored
        assert sb.files.read("/tmp/last") == b"seed 6\n"
        # the process the failing run left behind is alive after the resume
        assert "sleep 1000" in sb.exec("ps").stdout
    finally:
        sb.delete()


def test_hunt_with_a_snapshot_and_setup(client, tmp_path):
    (tmp_path / "t.sh").write_text('test "$(cat /work/ready)" = yes && test $((SEED % 3)) -ne 0\n')
    name = "py-hunt-%s" % tmp_path.name[-8:].replace("_", "-")
    res = client.hunt("sh t.sh", template="tiny", upload=str(tmp_path), setup="echo yes > /work/ready", seeds=[3], name=name)
    try:
        assert res.found and res.runs == 1 and res.snapshot == name
        assert client.snapshot(name).info.sandbox_id == res.sandbox.id
    finally:
        res.sandbox.delete(with_snapshots=True)


def test_hunt_without_a_failure_leaves_nothing(client):
    res = client.hunt("true", template="tiny", runs=3)
    assert not res.found and res.runs == 3 and res.sandbox is None and res.resume == ""
    assert client.list(meta={"sbx.hunt": "1"}) == []


def test_hunt_bad_input(client):
    with pytest.raises(sbx.Invalid):
        client.hunt("true", runs=0)
    with pytest.raises(sbx.Invalid):
        client.hunt("true", template="tiny", from_snapshot="x")
    with pytest.raises(sbx.NotFound):
        client.hunt("true", from_snapshot="no-such-snapshot")
    with pytest.raises(sbx.Invalid):
        client.hunt("true", template="tiny", timeout="forever")
    assert client.list(meta={"sbx.hunt": "1"}) == []


def test_hunt_setup_failure_keeps_the_sandbox(client):
    with pytest.raises(sbx.SbxError) as e:
        client.hunt("true", template="tiny", setup="exit 4")
    assert "exited 4" in str(e.value)
    kept = client.list(meta={"sbx.hunt": "1"})
    assert len(kept) == 1 and kept[0].id in str(e.value)
    client.delete_all(kept)


def test_flake_rate_in_memory_forks(client, sb):
    sb.files.write("/work/state", b"prepared")  # what every fork carries
    seen = []
    res = client.flake_rate('test "$(cat /work/state)" = prepared && test $((SEED % 3)) -ne 0', sandbox=sb, n=18,
                            seeds=range(18), parallel=3, progress=seen.append)
    s = res.summary
    assert (s.runs, s.failures) == (18, 6) and abs(s.rate - 6 / 18) < 1e-9
    assert s.wilson95 == sbx.wilson(6, 18) and s.kept == []
    assert [r.seed for r in res.runs] == list(range(18)) and len(seen) == 18
    assert [r.passed for r in res.runs] == [i % 3 != 0 for i in range(18)]
    assert len({r.sandbox for r in res.runs}) == 18
    assert client.list(parent=sb.id) == [], "forks were left"
    assert "6/18 failed: rate 33.3%" in str(s)


def test_flake_rate_keeps_failures(client, sb):
    res = client.flake_rate(TEST, sandbox=sb, n=4, seeds=[1, 3, 4, 6], keep_failures=True, keep_ttl="10m")
    try:
        assert res.summary.failures == 2 and len(res.summary.kept) == 2
        left = {s.id for s in client.list(parent=sb.id)}
        assert left == set(res.summary.kept)
        assert left == {r.sandbox for r in res.runs if not r.passed}
    finally:
        client.delete_all(res.summary.kept)


def test_flake_rate_from_a_snapshot(client, sb):
    snap = sb.snapshot(memory=True)
    try:
        res = client.flake_rate("test $((SEED % 2)) -eq 0", from_snapshot=snap.name, n=4, seeds=[2, 4, 5, 8])
        assert res.summary.failures == 1
    finally:
        snap.delete()
    assert client.list(meta={"sbx.flake-rate": "1"}) == []


def test_flake_rate_bad_input(client, sb):
    with pytest.raises(sbx.Invalid):
        client.flake_rate("true", n=2)
    with pytest.raises(sbx.Invalid):
        client.flake_rate("true", sandbox=sb, from_snapshot="x", n=2)
    with pytest.raises(sbx.Invalid):
        client.flake_rate("true", sandbox=sb, n=0)
    with pytest.raises(sbx.Invalid):
        client.flake_rate("true", sandbox=sb, n=2, parallel=0)
    with pytest.raises(sbx.Invalid):
        client.flake_rate("true", sandbox=sb, n=3, seeds=[1, 1, 2])
    with pytest.raises(sbx.Invalid):
        client.flake_rate("true", sandbox=sb, n=3, keep_ttl="a while")
    with pytest.raises(sbx.NotFound):
        client.flake_rate("true", from_snapshot="no-such-snapshot", n=2)


def test_flake_rate_error_leaves_no_fork(client, sb):
    # an error in the middle (here the progress callback's) ends the measurement, and no fork is left
    class Boom(Exception):
        pass

    def progress(run):
        raise Boom()

    with pytest.raises(Boom):
        client.flake_rate("true", sandbox=sb, n=20, parallel=2, keep_failures=True, progress=progress)
    assert client.list(parent=sb.id) == []
    with pytest.raises(sbx.Invalid):
        client.flake_rate("true", sandbox=sb, n=2, timeout="forever")


def test_replay(client, sb):
    sb.files.write("/work/x", b"1")
    snap = sb.snapshot()
    try:
        fail = client.replay(snap.name, 9, 'test -f /work/x && test $((SEED % 3)) -ne 0', n=3)
        assert fail.summary.pattern == "FFF" and fail.summary.seed == 9 and str(fail.summary) == "3/3 failed"
        ok = client.replay(snap.name, 10, 'test -f /work/x && test $((SEED % 3)) -ne 0', n=2, parallel=1)
        assert ok.summary.pattern == "PP" and ok.summary.failures == 0
        assert client.list(meta={"sbx.replay": "1"}) == []
        with pytest.raises(sbx.Invalid):
            client.replay(snap.name, 1, "true", n=0)
    finally:
        snap.delete()
    with pytest.raises(sbx.NotFound):
        client.replay("no-such-snapshot", 1, "true")
    with pytest.raises(sbx.Invalid):
        client.replay("", 1, "true")
