"""Issue 22: a sandbox's freezes go with it unless kept; what uses the disk, and pruning it."""

import time

import pytest

import sbx


def wait_freeze(client, sandbox_id):
    deadline = time.monotonic() + 20
    while True:
        fz = [s for s in client.snapshots() if s.info.sandbox_id == sandbox_id and s.name.startswith("freeze-")]
        if fz:
            return fz[0]
        assert time.monotonic() < deadline, "the freeze was not recorded"
        time.sleep(0.1)


def test_freezes_go_with_their_sandbox_unless_kept(client):
    a = client.create(template="tiny")
    b = client.create(template="tiny")
    kept = None
    try:
        for s in (a, b):
            assert s.exec("/.sbx/freeze --no-hold", user="1000").exit_code == 0
        fa, fb = wait_freeze(client, a.id), wait_freeze(client, b.id)
        kept = fb.keep()
        assert kept.info.kept is True
        a.delete()
        b.delete()
        names = {s.name for s in client.snapshots()}
        assert fa.name not in names, "a freeze outlived its sandbox"
        assert fb.name in names, "a kept freeze went with its sandbox"
        df = client.storage()
        assert [f["name"] for f in df["freezes"]] == [fb.name] and df["freezes"][0]["kept"] is True
    finally:
        client.delete_all([s for s in (a, b) if s.id in {x.id for x in client.list()}])
        if kept is not None:
            kept.delete()


def test_delete_keep_freezes_and_prune(client):
    a = client.create(template="tiny")
    assert a.exec("/.sbx/freeze --no-hold").exit_code == 0
    fz = wait_freeze(client, a.id)
    a.delete(keep_freezes=True)
    try:
        assert client.snapshot(fz.name).info.kept is True
        res = client.prune(orphans=True, freezes=True, dry_run=True)
        assert res["dryRun"] is True and fz.name not in {r.get("name") for r in res["removed"]}, "a kept freeze would be pruned"
        with pytest.raises(sbx.Invalid):
            client.prune(older_than="soon")
    finally:
        fz.delete()
    with pytest.raises(sbx.NotFound):
        fz.keep()
