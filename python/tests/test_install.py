"""`pip install ./python` works without the network, and the package runs on the oldest Python it claims (3.9)."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

from conftest import PYDIR


def test_pip_install_offline(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(PYDIR, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".mypy_cache", ".pytest_cache"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    p = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([py, "-c", "import sbx, os; print(sbx.__file__); print(os.path.exists(os.path.join(os.path.dirname(sbx.__file__), 'py.typed')))"],
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=60)
    where, typed = p.stdout.split()
    assert where.startswith(str(venv)) and typed == "True", p.stdout + p.stderr


def python39():
    # a real 3.9, not a version manager's shim that may answer "command not found"
    for p in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9"))) + [shutil.which("python3.9")]:
        if not p or not os.access(p, os.X_OK):
            continue
        r = subprocess.run([p, "-c", "import sys; print(sys.version_info[:2] == (3, 9))"], capture_output=True, text=True)
        if r.stdout.strip() == "True":
            return p
    return None


@pytest.mark.skipif(python39() is None, reason="no Python 3.9 on this machine")
def test_runs_on_python_3_9(daemon):
    script = (
        "import sbx\n"
        "c = sbx.Client()\n"
        "with c.create(template='tiny') as sb:\n"
        "    r = sb.exec('echo $((6*7))')\n"
        "    assert r.stdout == '42\\n', r\n"
        "    sb.files.write('/a/b', 'x'); assert sb.files.read('/a/b') == b'x'\n"
        "    [k] = sb.fork(memory=True); k.delete()\n"
        "    s = c.flake_rate('test $SEED -ne 2', sandbox=sb, n=3, seeds=[1, 2, 3]).summary\n"
        "    assert (s.runs, s.failures) == (3, 1), s\n"
        "print('ok')\n"
    )
    env = dict(os.environ, SBX_HOST=daemon.host, PYTHONPATH=PYDIR)
    p = subprocess.run([python39(), "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout == "ok\n", p.stdout + p.stderr
