"""A small suite with a stable test, a flaky one (it fails when $SEED is a multiple of 3) and a skipped one."""

import os

import pytest


def test_stable():
    assert sum(range(10)) == 45


def test_sometimes():
    seed = int(os.environ.get("SEED", "1"))
    print("seed is", seed)
    assert seed % 3 != 0, "seed %d is a multiple of 3" % seed


def test_fresh_machine_a():
    # each test runs in its own machine: the other one's marker is never there
    assert not os.path.exists("/tmp/sbx-marker"), "a machine shared with another test"
    open("/tmp/sbx-marker", "w").write("a")


def test_fresh_machine_b():
    assert not os.path.exists("/tmp/sbx-marker"), "a machine shared with another test"
    open("/tmp/sbx-marker", "w").write("b")


@pytest.mark.skip(reason="not today")
def test_skipped():
    raise AssertionError("never runs")


@pytest.mark.xfail(reason="known to fail", strict=True)
def test_known_bug():
    assert 1 + 1 == 3
