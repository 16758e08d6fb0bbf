"""Snapshot once, fork 50 ways: a flaky test's failure rate with its 95% Wilson interval.

    python3 flake_rate_50.py PROJECT_DIR 'python3 -m pytest -q tests/test_flaky.py' [--runs 50] [--template base]

The project is copied in and set up once; a memory snapshot keeps that warm
machine; 50 memory forks of it each run the test once with their own $SEED,
four at a time, and are deleted as they end. One JSON line per run, then the summary.
"""

import argparse
import json
import sys

import sbx


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("project")
    ap.add_argument("cmd")
    ap.add_argument("--template", default="base")
    ap.add_argument("--setup", default=None)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--parallel", type=int, default=4)
    a = ap.parse_args()
    c = sbx.Client()
    with c.create(template=a.template, meta={"job": "flake-rate"}) as sb:
        sb.files.upload_dir(a.project, "/work")
        if a.setup:
            r = sb.exec(a.setup, cwd="/work", timeout=None)
            if not r.ok:
                print("setup failed: %s" % r.stderr, file=sys.stderr)
                return 1
        snap = sb.snapshot(memory=True)
    try:
        res = c.flake_rate(a.cmd, from_snapshot=snap.name, n=a.runs, parallel=a.parallel, cwd="/work",
                           progress=lambda run: print(json.dumps({"run": run.run, "seed": run.seed, "pass": run.passed})))
    finally:
        snap.delete()
    s = res.summary
    print(json.dumps({"runs": s.runs, "failures": s.failures, "rate": s.rate, "wilson95": list(s.wilson95)}))
    print(s, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
