"""explain: why a flaky test fails, from Python.

``sbx explain`` records each run of a test in monitored memory forks of one
ready sandbox and reports what the failing runs did that the passing runs did
not, what makes it worse and when the failure became certain. Its analysis is
the Go workflow's (package ``internal/explain``); this module runs the ``sbx``
command against the client's sbxd with ``--json`` and returns its last line,
the ``explained`` object, as an :class:`Explained`. Progress lines go to
``on_progress`` as they come.
"""

import json
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Union

from .errors import Invalid, SbxError, Unavailable, error_class

Command = Union[str, Sequence[str]]

#: The most a progress or result line may be (a report names every finding).
MAX_LINE = 64 << 20


@dataclass
class Finding:
    """Finding is one divergence: what failing runs did that passing runs did not (or the reverse)."""

    summary: str
    resource: str
    failing: int
    passing: int
    score: float
    example: Any = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Finding":
        return cls(str(d.get("summary", "")), str(d.get("resource", "")), int(d.get("failing", 0)),
                   int(d.get("passing", 0)), float(d.get("score", 0.0)), d.get("example"))


@dataclass
class Explained:
    """Explained is what explain found: the rate with its Wilson 95 % interval, the divergence (best
    separating first), the knobs' rates, the point of no return and the report's path. ``raw`` is the
    whole object as sbx printed it (runs, knob verdicts, the fix's verdict, ...)."""

    runs: int
    failed: int
    rate: float
    low: float
    high: float
    divergence: List[Finding] = field(default_factory=list)
    knobs: List[Dict[str, Any]] = field(default_factory=list)
    point_of_no_return: Optional[Dict[str, Any]] = None
    report: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Explained":
        r = d.get("rate") or {}
        return cls(
            runs=int(d.get("runs", 0)), failed=int(d.get("failed", 0)),
            rate=float(r.get("rate", 0.0)), low=float(r.get("low", 0.0)), high=float(r.get("high", 0.0)),
            divergence=[Finding.from_json(f) for f in d.get("divergence") or []],
            knobs=list(d.get("knobs") or []), point_of_no_return=d.get("pointOfNoReturn"),
            report=d.get("report") or None, raw=d,
        )


def find_sbx(sbx: Optional[str] = None) -> str:
    """find_sbx is the sbx command explain runs: ``sbx``, else ``$SBX_CLI``, else ``sbx`` on PATH."""
    path = sbx or os.environ.get("SBX_CLI") or shutil.which("sbx")
    if not path or not os.access(path, os.X_OK):
        raise Unavailable("explain runs the sbx command, and none was found: pass sbx=PATH or set $SBX_CLI")
    return path


def explain(
    client: Any,
    ref: str,
    cmd: Command,
    n: Optional[int] = None,
    parallel: Optional[int] = None,
    timeout: Optional[float] = None,
    seed_env: Optional[str] = None,
    report: Optional[str] = None,
    args: Sequence[str] = (),
    sbx: Optional[str] = None,
    on_progress: Optional[Callable[[Dict[str, Any]], None]] = None,
) -> Explained:
    """explain runs the test ``cmd`` from sandbox or snapshot ``ref`` (``from:NAME`` for a snapshot) as
    ``sbx explain`` does and returns what it found.

    ``n``, ``parallel``, ``timeout`` (seconds), ``seed_env`` and ``report`` are its flags; ``args``
    passes any other flag as it is (``["--knob-env", "GOMAXPROCS=1"]``). Errors are the kinds of the
    API's (the sbx command's JSON error on stderr); a Ctrl-C ends the sbx command, which cleans up its
    forks, before it propagates.
    """
    if isinstance(cmd, str):
        if not cmd.strip():
            raise Invalid("explain: an empty command")
        argv = [cmd]
    else:
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise Invalid("explain: want a non-empty list of str, got %r" % (cmd,))
    line = [find_sbx(sbx), "--host", client.host, "--json", "explain"]
    if ref.startswith("from:"):
        line += ["--from", ref[len("from:"):]]
    for flag, v in (("-n", n), ("--parallel", parallel), ("--seed-env", seed_env), ("--report", report)):
        if v is not None:
            line += [flag, str(v)]
    if timeout is not None:
        if timeout <= 0:
            raise Invalid("explain: timeout %r: want a positive number of seconds" % (timeout,))
        line += ["--timeout", "%dms" % max(1, round(timeout * 1000))]
    line += list(args)
    if not ref.startswith("from:"):
        line.append(ref)
    line += ["--"] + argv
    env = dict(os.environ)
    token = getattr(client._t, "token", None)
    if token:
        env["SBX_TOKEN"] = token
    p = subprocess.Popen(line, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    errs: List[bytes] = []
    t = threading.Thread(target=_drain, args=(p.stderr, errs), daemon=True)
    t.start()
    last: Optional[Dict[str, Any]] = None
    try:
        assert p.stdout is not None
        for raw in iter(lambda: p.stdout.readline(MAX_LINE), b""):  # type: ignore[union-attr]
            try:
                d = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(d, dict):
                continue
            if d.get("event") == "explained":
                last = d
            elif on_progress is not None:
                on_progress(d)
        code = p.wait()
    except BaseException:
        p.terminate()  # sbx ends its forks on SIGTERM
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        raise
    t.join(timeout=5)
    stderr = b"".join(errs).decode("utf-8", "replace")
    if code != 0 or last is None:
        raise _error(stderr, code)
    return Explained.from_json(last)


def _drain(f: Optional[IO[bytes]], out: List[bytes]) -> None:
    if f is None:
        return
    r: IO[bytes] = f
    kept = 0
    for chunk in iter(lambda: r.read(65536), b""):
        if kept < 1 << 20:
            out.append(chunk)
            kept += len(chunk)


def _error(stderr: str, code: int) -> SbxError:
    for line in reversed(stderr.splitlines()):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("error"), dict):
            c = str(d["error"].get("code") or "")
            cls = error_class(c, 400 if code == 2 else 0)
            return cls(str(d["error"].get("message") or stderr.strip()), code=c or cls.code)
    if code == 2:
        return Invalid("sbx explain: " + (stderr.strip() or "usage error"))
    return SbxError("sbx explain exited %d: %s" % (code, stderr.strip()[-2000:]))
