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


@pytest.fixture
def registry():
    """registry is the distribution registry `make fleet-tools` builds, on a loopback port of its own."""
    import os
    import socket
    import subprocess
    import tempfile
    import urllib.request

    from conftest import BIN

    try:
        with open(os.path.join(BIN, ".fleet-dir")) as f:
            tools = f.read().strip()
    except OSError:
        if os.environ.get("CI"):
            raise
        pytest.skip("the registry is not built: run `make fleet-tools`")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    d = tempfile.mkdtemp(prefix="sbx-py-registry-")
    cfg = os.path.join(d, "registry.yml")
    with open(cfg, "w") as f:
        f.write("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s/data\nhttp:\n  addr: %s\n" % (d, addr))
    p = subprocess.Popen([os.path.join(tools, "registry"), "serve", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen("http://%s/v2/" % addr, timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the registry did not come up"
                time.sleep(0.1)
        yield addr
    finally:
        p.kill()
        p.wait()
        import shutil

        shutil.rmtree(d, ignore_errors=True)


def test_push_and_pull_a_snapshot(client, registry):
    """A snapshot pushed to a registry and pulled back under another name boots with its files; the pull
    fetches nothing the node holds; a pull under a taken name is refused."""
    sb = client.create(template="tiny")
    snap = pulled = None
    try:
        assert sb.exec("echo carried > /carried.txt").exit_code == 0
        snap = sb.snapshot("py-push-" + sb.id[3:])
        ref = snap.push(registry + "/sbx/py:one")
        assert "@sha256:" in ref
        pulled = client.pull_snapshot(ref, name="py-pulled-" + sb.id[3:])
        assert pulled.name == "py-pulled-" + sb.id[3:] and pulled.info.kept is True
        with pytest.raises(sbx.Conflict):
            client.pull_snapshot(ref, name=pulled.name)
        with pytest.raises(sbx.Invalid):
            snap.push("")
        c = client.create(from_snapshot=pulled.name)
        try:
            assert c.exec("cat /carried.txt").stdout.strip() == "carried"
        finally:
            c.delete()
    finally:
        sb.delete()
        for s in (snap, pulled):
            if s is not None:
                s.delete()
