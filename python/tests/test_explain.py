"""explain from Python: the sbx command's analysis, its result as objects."""

import os

import pytest

import sbx

from conftest import BIN

SBX = os.path.join(BIN, "sbx")

# fails on about half of its runs, by a byte of its own /dev/urandom
COIN = "r=$(head -c1 /dev/urandom | od -An -tu1); test $((r % 2)) = 0"


def test_explain_rate_and_findings(client, sb):
    before = {s.id for s in client.list()}
    progress = []
    ex = client.explain(sb.id, COIN, n=8, sbx=SBX, args=["--knob-runs", "0", "--pnr-parents", "0"],
                        on_progress=progress.append)
    assert isinstance(ex, sbx.Explained)
    assert ex.runs == 8 and 0 <= ex.failed <= 8
    assert 0.0 <= ex.low <= ex.rate <= ex.high <= 1.0
    assert abs(ex.rate - ex.failed / ex.runs) < 1e-9
    assert all(isinstance(f, sbx.Finding) for f in ex.divergence)
    assert ex.raw.get("event") == "explained"
    assert progress, "no progress lines came"
    # what explain made is gone
    assert {s.id for s in client.list()} == before


def test_explain_errors(client, sb):
    with pytest.raises(sbx.NotFound):
        client.explain("sb_nosuchsandb", COIN, n=2, sbx=SBX)
    with pytest.raises(sbx.Invalid):
        client.explain(sb.id, "", sbx=SBX)
    with pytest.raises(sbx.Invalid):
        client.explain(sb.id, COIN, timeout=-1, sbx=SBX)
    with pytest.raises(sbx.Unavailable):
        client.explain(sb.id, COIN, sbx="/nonexistent/sbx")
