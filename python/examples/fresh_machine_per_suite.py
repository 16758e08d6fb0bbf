"""One fresh machine per suite: the quarantine loop, clean by construction.

    python3 fresh_machine_per_suite.py PROJECT_DIR 'python3 -m pytest -q {suite}' SUITE... [--template base]

The project is copied into one prepared machine once; each suite then runs in
its own disk fork of it (a fresh boot on a copy of that disk), and the fork is
deleted. Nothing one suite leaves behind can reach another. One JSON line per
suite; the exit code is 1 if any suite failed.
"""

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import sbx


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("project")
    ap.add_argument("cmd", help="the command, with {suite} for the suite")
    ap.add_argument("suites", nargs="+")
    ap.add_argument("--template", default="base")
    ap.add_argument("--parallel", type=int, default=2)
    a = ap.parse_args()
    c = sbx.Client()
    with c.create(template=a.template, meta={"job": "quarantine"}) as prepared:
        prepared.files.upload_dir(a.project, "/work")

        def run(suite: str) -> dict:
            [machine] = prepared.fork(meta={"suite": suite})
            with machine:
                r = machine.exec(a.cmd.format(suite=suite), cwd="/work", timeout="10m")
                return {"suite": suite, "sandbox": machine.id, "exitCode": r.exit_code, "output": r.stdout[-2000:]}

        with ThreadPoolExecutor(a.parallel) as pool:
            results = list(pool.map(run, a.suites))
    for r in results:
        print(json.dumps(r))
    return 1 if any(r["exitCode"] != 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
