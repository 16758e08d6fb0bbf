"""Debug on failure: run the tests in a fresh machine; when they fail, keep the machine as it failed.

    python3 debug_on_failure.py PROJECT_DIR 'python3 -m pytest -x' [--template base]

It prints the result; on a failure it stops the sandbox with its processes and
memory kept and prints how to come back to it (`sbx resume ID`, `sbx shell ID`).
Exit code: the tests'.
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
    ap.add_argument("--timeout", default="10m")
    a = ap.parse_args()
    c = sbx.Client()
    with c.create(template=a.template, ttl="1h", meta={"job": "debug-on-failure"}) as sb:
        sb.files.upload_dir(a.project, "/work")
        r = sb.exec(a.cmd, cwd="/work", timeout=a.timeout)
        if r.ok:
            print(json.dumps({"passed": True, "sandbox": sb.id}))
            return 0
        sb.keep()  # the with block leaves it: the evidence stays
        sb.stop()  # processes and memory kept, no CPU spent
        print(json.dumps({"passed": False, "exitCode": r.exit_code, "sandbox": sb.id,
                          "stdout": r.stdout[-4000:], "stderr": r.stderr[-4000:]}))
        print("failed; the machine is kept: sbx resume %s && sbx shell %s" % (sb.id, sb.id), file=sys.stderr)
        return r.exit_code


if __name__ == "__main__":
    sys.exit(main())
