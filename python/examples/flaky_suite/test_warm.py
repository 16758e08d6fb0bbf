"""Passes only in a machine prepared from the snapshot python/tests/test_workflows.py takes (--sbx-from)."""

import os


def test_needs_the_snapshot():
    assert os.path.exists("/etc/sbx-warm"), "not a machine made from the warm snapshot"
