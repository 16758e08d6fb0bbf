"""Files both ways, as streams."""

import hashlib
import io
import os
import tempfile

import pytest

import sbx


def test_write_makes_parents_and_reads_back(sb):
    sb.files.write("/srv/a/b/c.txt", "héllo\n")
    assert sb.files.read("/srv/a/b/c.txt") == "héllo\n".encode()
    assert sb.exec("cat /srv/a/b/c.txt").stdout == "héllo\n"
    with pytest.raises(sbx.NotFound):
        sb.files.write("/nope/x.txt", b"x", parents=False)
    sb.files.write("~/notes/today.txt", "in the home")  # ~ is the sandbox user's home, parents made there
    assert sb.exec("cat $HOME/notes/today.txt").stdout == "in the home"
    with pytest.raises(sbx.Invalid):
        sb.files.read("/etc")  # a directory


def test_mode_stat_list_rename_remove_mkdir(sb):
    sb.files.write("/srv/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    st = sb.files.stat("/srv/run.sh")
    assert (st.name, st.size, st.mode, st.is_dir) == ("run.sh", 19, "-rwxr-xr-x", False)
    assert sb.exec("/srv/run.sh").stdout == "ran\n"
    sb.files.mkdir("/srv/d1/d2")
    assert sb.files.stat("/srv/d1/d2").is_dir
    sb.files.mkdir("/srv/d1/d2")  # there already: fine
    assert sorted(f.name for f in sb.files.list("/srv")) == ["d1", "run.sh"]
    sb.files.rename("/srv/run.sh", "/srv/d1/moved.sh")
    assert not sb.files.exists("/srv/run.sh") and sb.files.exists("/srv/d1/moved.sh")
    with pytest.raises(sbx.SbxError):
        sb.files.remove("/srv/d1")  # not empty
    sb.files.remove("/srv/d1", recursive=True)
    assert not sb.files.exists("/srv/d1")
    for call in (lambda: sb.files.read("/no/such"), lambda: sb.files.stat("/no/such"),
                 lambda: sb.files.list("/no/such"), lambda: sb.files.remove("/no/such")):
        with pytest.raises(sbx.NotFound):
            call()
    with pytest.raises(sbx.Invalid):
        sb.files.read("")


def test_list_more_than_a_page(sb):
    # 5000 entries a page: 5003 takes two
    sb.exec("mkdir /many && cd /many && i=0; while [ $i -lt 5003 ]; do : > f$i; i=$((i+1)); done", timeout=120)
    names = [f.name for f in sb.files.list("/many")]
    assert len(names) == 5003 and len(set(names)) == 5003


def test_big_files_stream_both_ways(sb):
    # 64 MiB through read_to / write_from; compared by digest on both sides
    data = os.urandom(1 << 20) * 64
    want = hashlib.sha256(data).hexdigest()
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        assert sb.files.write_from("/big/blob", f) == len(data)
    assert sb.exec("sha256sum /big/blob", timeout=120).stdout.split()[0] == want
    with tempfile.TemporaryFile() as g:
        assert sb.files.read_to("/big/blob", g) == len(data)
        g.seek(0)
        assert hashlib.sha256(g.read()).hexdigest() == want
    with pytest.raises(sbx.TooLarge):
        sb.files.read("/big/blob", max_size=1 << 20)


def test_write_from_a_pipe_needs_its_size(sb):
    r, w = os.pipe()
    os.write(w, b"abc")
    os.close(w)
    with os.fdopen(r, "rb") as f:
        with pytest.raises(sbx.Invalid):
            sb.files.write_from("/p", f)
    with pytest.raises(sbx.Invalid):
        sb.files.write_from("/p", io.BytesIO(b"ab"), size=5)  # shorter than promised
    sb.files.write_from("/p", io.BytesIO(b"abcdef"), size=3)
    assert sb.files.read("/p") == b"abc"


def test_upload_dir(sb, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("X = 1\n")
    (tmp_path / "top.txt").write_text("top\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    sb.files.upload_dir(str(tmp_path), "/work")
    assert sb.files.read("/work/pkg/m.py") == b"X = 1\n" and sb.files.read("/work/top.txt") == b"top\n"
    assert not sb.files.exists("/work/.git")


def test_read_tar(sb):
    import tarfile

    sb.files.write("/t/a.txt", b"A")
    sb.files.write("/t/sub/b.txt", b"BB")
    with sb.files.read_tar("/t") as r:
        data = r.read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        files = {m.name.split("/", 1)[-1]: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
    assert files == {"a.txt": b"A", "sub/b.txt": b"BB"}, files
