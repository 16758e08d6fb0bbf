"""The package is typed (py.typed): mypy --strict finds nothing, for Python 3.9 on (when mypy is installed)."""

import os
import shutil
import subprocess

import pytest

from conftest import PYDIR


def test_py_typed_is_shipped():
    assert os.path.exists(os.path.join(PYDIR, "sbx", "py.typed"))
    with open(os.path.join(PYDIR, "pyproject.toml")) as f:
        assert 'sbx = ["py.typed"]' in f.read()


@pytest.mark.skipif(shutil.which("mypy") is None, reason="mypy is not installed (apt-get install mypy)")
def test_mypy_strict():
    p = subprocess.run(["mypy", "--python-version", "3.9", "--strict", "--ignore-missing-imports", "sbx"],
                       cwd=PYDIR, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
