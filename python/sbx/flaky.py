"""The flaky-test workflows, on the client: hunt, flake rate, replay.

They mirror sbx's own (``sbx hunt``, ``sbx flake-rate``, ``sbx replay``,
package internal/flaky) over the public API: each run of the test gets its
seed in ``$SEED`` (``seed_env``), a test that fails is a result and not an
exception, and an exception is operational (a fork, exec or delete that did
not work; Invalid for bad arguments), after which nothing of the workflow is
left running but what it says it keeps. The hunt loops from the client
rather than from inside the sandbox: when the client goes away, the hunt
stops with it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Union

from .errors import Invalid, NotFound, SbxError
from .types import Duration, duration_wire

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client, Command, Sandbox

DEFAULT_SEED_ENV = "SEED"
DEFAULT_PARALLEL = 4
DEFAULT_HUNT_RUNS = 100
DEFAULT_REPLAYS = 10
DEFAULT_KEEP_TTL = 2 * 3600
_Z95 = 1.96

Seeds = Union[None, Iterable[int], Callable[[], int]]


def wilson(failures: int, runs: int) -> "tuple[float, float]":
    """wilson is the 95% Wilson score interval (z = 1.96) of ``failures`` in ``runs``; (0, 1) with no runs."""
    if runs <= 0:
        return (0.0, 1.0)
    n = float(runs)
    p = failures / n
    z2 = _Z95 * _Z95
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    margin = _Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return (max(0.0, center - margin), min(1.0, center + margin))


@dataclass
class Run:
    """Run is the outcome of one run of the test: its seed, sandbox, exit code and output."""

    run: int
    seed: int
    sandbox: str
    exit_code: int
    passed: bool
    duration_ms: int
    stdout: str = field(default="", repr=False)
    stderr: str = field(default="", repr=False)


@dataclass
class RateSummary:
    """RateSummary is a measured failure rate with its 95% Wilson interval, and the failures kept."""

    runs: int
    failures: int
    rate: float
    wilson95: "tuple[float, float]"
    kept: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "%d/%d failed: rate %.1f%% (95%% Wilson interval %.1f%%–%.1f%%)" % (
            self.failures, self.runs, 100 * self.rate, 100 * self.wilson95[0], 100 * self.wilson95[1])


def summarize(runs: List[Run], kept: Optional[List[str]] = None) -> RateSummary:
    """summarize counts the runs' failures and puts the Wilson interval on the rate."""
    f = sum(1 for r in runs if not r.passed)
    return RateSummary(len(runs), f, f / len(runs) if runs else 0.0, wilson(f, len(runs)), list(kept or []))


@dataclass
class RateResult:
    """RateResult is every run of flake_rate in run order and the summary."""

    runs: List[Run]
    summary: RateSummary


@dataclass
class ReplaySummary:
    """ReplaySummary is what replay saw: the pattern has one letter per run, P passed, F failed."""

    runs: int
    failures: int
    seed: int
    pattern: str

    def __str__(self) -> str:
        return "%d/%d failed" % (self.failures, self.runs)


@dataclass
class ReplayResult:
    """ReplayResult is every run of replay in run order and the summary."""

    runs: List[Run]
    summary: ReplaySummary


@dataclass
class HuntResult:
    """HuntResult is what a hunt found and where it left it.

    With ``found``, ``sandbox`` is the failing machine, stopped with its
    processes and memory (``sandbox.resume()`` brings it back as it failed),
    ``run`` the failing run with its ``seed``, ``snapshot`` the disk snapshot
    taken at the failure (when ``name`` was given), and ``resume`` the command
    that brings it back. Without, ``runs`` passed and the sandbox is gone.
    """

    found: bool
    runs: int
    run: Optional[Run] = None
    sandbox: Optional["Sandbox"] = None
    snapshot: Optional[str] = None

    @property
    def seed(self) -> Optional[int]:
        """seed is the failing run's seed."""
        return self.run.seed if self.run else None

    @property
    def resume(self) -> str:
        """resume is the command that brings the failing machine back."""
        return "sbx resume %s" % self.sandbox.id if self.sandbox and self.found else ""


def _seeds(n: int, seeds: Seeds, at_most: bool = False) -> List[int]:
    if seeds is not None and not callable(seeds):
        out = [int(s) for s in seeds][:n]
        if len(out) < n and not (at_most and out):
            raise Invalid("want %d seeds, got %d" % (n, len(out)))
        if len(set(out)) != len(out):
            raise Invalid("the seeds repeat: two runs with one seed would measure it twice")
        return out
    nxt = seeds if callable(seeds) else (lambda: random.getrandbits(32))
    seen: Set[int] = set()
    out = []
    while len(out) < n:
        s = int(nxt())
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def _run_once(sb: "Sandbox", cmd: "Command", i: int, seed: int, seed_env: str, timeout: Optional[Duration], cwd: Optional[str], env: Optional[Dict[str, str]]) -> Run:
    e = dict(env or {})
    e[seed_env] = str(seed)
    start = time.monotonic()
    r = sb.exec(cmd, timeout=timeout, env=e, cwd=cwd)
    if r.exit_code < 0:
        raise SbxError("run %d (seed %d) in %s: exec %s ended (%s) without an exit code" % (i, seed, sb.id, r.exec_id, r.state))
    return Run(i, seed, sb.id, r.exit_code, r.exit_code == 0, int((time.monotonic() - start) * 1000), r.stdout, r.stderr)


#: MAX_PARALLEL is the most runs at once (each a sandbox of its own), as the CLI's.
MAX_PARALLEL = 64


def _check(n: int, parallel: int, what: str, timeout: Optional[Duration] = None) -> None:
    duration_wire(timeout, "%s: timeout" % what)
    if not isinstance(n, int) or n < 1:
        raise Invalid("%s: want at least 1 run, got %r" % (what, n))
    if not isinstance(parallel, int) or isinstance(parallel, bool) or not 1 <= parallel <= MAX_PARALLEL:
        raise Invalid("%s: want 1 to %d runs at once, got %r" % (what, MAX_PARALLEL, parallel))


def hunt(
    client: "Client",
    cmd: "Command",
    template: Optional[str] = None,
    from_snapshot: Optional[str] = None,
    sandbox: Optional["Sandbox"] = None,
    runs: int = DEFAULT_HUNT_RUNS,
    seed_env: str = DEFAULT_SEED_ENV,
    seeds: Seeds = None,
    timeout: Optional[Duration] = None,
    cwd: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    upload: Optional[str] = None,
    workdir: str = "/work",
    setup: Optional["Command"] = None,
    name: Optional[str] = None,
    keep_ttl: Optional[Duration] = DEFAULT_KEEP_TTL,
    progress: Optional[Callable[[Run], None]] = None,
) -> HuntResult:
    """hunt runs the test up to ``runs`` times in one sandbox until a run fails, and keeps that machine frozen.

    The sandbox is ``sandbox``, or one made from ``template`` or
    ``from_snapshot``; ``upload`` copies a local folder to ``workdir`` first
    and ``setup`` runs once (a setup that fails raises, and the sandbox is
    kept for a look). Each run gets its seed in ``$SEED``. On a failure: a
    disk snapshot named ``name`` (if given), the idle ttl ``keep_ttl``, and a
    stop that keeps processes and memory. Without a failure, a sandbox hunt
    made is deleted.
    """
    _check(runs, 1, "hunt", timeout)
    duration_wire(keep_ttl, "hunt: keep_ttl")
    if sum(x is not None for x in (template, from_snapshot, sandbox)) > 1:
        raise Invalid("hunt: give one of template, from_snapshot and sandbox")
    made = sandbox is None
    sb = sandbox if sandbox is not None else client.create(template=template, from_snapshot=from_snapshot, meta={"sbx.hunt": "1"})
    try:
        if upload:
            sb.files.upload_dir(upload, workdir)
            cwd = cwd or workdir
        if setup is not None:
            r = sb.exec(setup, timeout=None, cwd=cwd, env=env)
            if r.exit_code != 0:
                sb.keep()
                raise SbxError("hunt: the setup exited %d in %s (kept for a look): %s" % (r.exit_code, sb.id, (r.stderr or r.stdout)[-2000:]))
    except SbxError:
        raise
    except BaseException:
        if made:
            client.delete_all([sb])
        raise
    try:
        seedlist = _seeds(runs, seeds, at_most=True)  # a list of seeds may be shorter than runs: it is the runs
        runs = len(seedlist)
        for i, seed in enumerate(seedlist):
            run = _run_once(sb, cmd, i, seed, seed_env, timeout, cwd, env)
            if progress:
                progress(run)
            if run.passed:
                continue
            snap = None
            if name:
                snap = sb.snapshot(name).name
            if keep_ttl is not None:
                sb.set_ttl(keep_ttl)
            sb.stop()
            return HuntResult(True, i + 1, run, sb.keep(), snap)
    except BaseException:
        if made:
            client.delete_all([sb])
        raise
    if made:
        sb.delete()
    return HuntResult(False, runs)


def flake_rate(
    client: "Client",
    cmd: "Command",
    sandbox: Optional["Sandbox"] = None,
    from_snapshot: Optional[str] = None,
    n: int = 50,
    parallel: int = DEFAULT_PARALLEL,
    keep_failures: bool = False,
    keep_ttl: Optional[Duration] = DEFAULT_KEEP_TTL,
    seed_env: str = DEFAULT_SEED_ENV,
    seeds: Seeds = None,
    timeout: Optional[Duration] = None,
    cwd: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    progress: Optional[Callable[[Run], None]] = None,
) -> RateResult:
    """flake_rate forks ``n`` memory copies of one ready machine, runs the test once in each with its own seed, and measures the failure rate.

    The machine is ``sandbox``, or one made from the snapshot ``from_snapshot``
    (deleted afterwards); exactly one must be given. Forks are made 16 at a
    time from that machine and runs start as soon as their forks exist, at
    most ``parallel`` at once. Every fork is deleted as its run ends, except
    failing ones with ``keep_failures`` (kept with the idle ttl
    ``keep_ttl``). On an error (KeyboardInterrupt included) no more runs
    start, the forks of the runs under way are deleted, and no fork is left.
    """
    _check(n, parallel, "flake rate", timeout)
    duration_wire(keep_ttl, "flake rate: keep_ttl")
    if (sandbox is None) == (from_snapshot is None):
        raise Invalid("flake rate: give exactly one of sandbox and from_snapshot")
    seedlist = _seeds(n, seeds)
    src = sandbox if sandbox is not None else client.create(from_snapshot=from_snapshot)
    results: List[Optional[Run]] = [None] * n
    kept: List[str] = []
    alive: Set[str] = set()
    lock = threading.Lock()
    failed = threading.Event()

    def one(i: int, kid: "Sandbox") -> Run:
        if failed.is_set():
            raise _Cancelled()
        run = _run_once(kid, cmd, i, seedlist[i], seed_env, timeout, cwd, env)
        if not run.passed and keep_failures:
            if keep_ttl is not None:
                kid.set_ttl(keep_ttl)
            with lock:
                kept.append(kid.id)
                alive.discard(kid.id)
        else:
            kid.delete()
            with lock:
                alive.discard(kid.id)
        if progress:
            with lock:
                progress(run)
        return run

    pool = ThreadPoolExecutor(max_workers=parallel)
    pending: Dict["Future[Run]", int] = {}
    first: Optional[BaseException] = None
    try:
        made = 0
        while made < n and first is None:
            while len(pending) >= parallel + 16 - 1:
                first = _reap(pending, results, first)
            if first is not None:
                break
            kids = src.fork(count=min(16, n - made), memory=True, meta={"sbx.flake-rate": "1"})
            with lock:
                alive.update(k.id for k in kids)
            for k in kids:
                pending[pool.submit(one, made, k)] = made
                made += 1
        while pending:
            first = _reap(pending, results, first)
            if first is not None:
                failed.set()
    except BaseException as e:
        first = first or e
        failed.set()
    finally:
        if first is not None:
            # no run starts, and the runs under way end with their forks, rather than each to its own end
            with lock:
                left = list(alive)
            try:
                client.delete_all(left)
            except SbxError:
                pass
        pool.shutdown(wait=True, cancel_futures=True)
        if first is not None:
            with lock:
                left = list(alive) + kept
            try:
                client.delete_all(left)
            except SbxError:
                pass
        if sandbox is None:
            try:
                client.delete_all([src])
            except SbxError:
                pass
    if first is not None:
        raise first
    runs = [r for r in results if r is not None]
    return RateResult(runs, summarize(runs, kept))


class _Cancelled(Exception):
    pass


def _reap(pending: Dict["Future[Run]", int], results: List[Optional[Run]], first: Optional[BaseException]) -> Optional[BaseException]:
    done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
    for f in done:
        i = pending.pop(f)
        e = f.exception()
        if e is None:
            results[i] = f.result()
        elif not isinstance(e, _Cancelled) and first is None:
            first = e
    return first


def replay(
    client: "Client",
    snapshot: str,
    seed: int,
    cmd: "Command",
    n: int = DEFAULT_REPLAYS,
    parallel: int = DEFAULT_PARALLEL,
    seed_env: str = DEFAULT_SEED_ENV,
    timeout: Optional[Duration] = None,
    cwd: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    progress: Optional[Callable[[Run], None]] = None,
) -> ReplayResult:
    """replay runs the test ``n`` times with one seed, each time in a fresh sandbox made from ``snapshot`` and deleted after its run.

    NotFound for an unknown snapshot; on an error no sandbox of it is left.
    On an exception in the caller's thread (KeyboardInterrupt), no more runs
    start and the sandboxes of the runs under way are deleted (which ends
    their commands) before it is raised.
    """
    _check(n, parallel, "replay", timeout)
    if not snapshot:
        raise Invalid("replay: no snapshot given")
    client.snapshot(snapshot)  # NotFound before anything is made
    lock = threading.Lock()
    stop = threading.Event()
    live: Set[str] = set()

    def one(i: int) -> Run:
        if stop.is_set():
            raise _Cancelled()
        sb = client.create(from_snapshot=snapshot, meta={"sbx.replay": "1"})
        with lock:
            live.add(sb.id)
        try:
            if stop.is_set():
                raise _Cancelled()
            run = _run_once(sb, cmd, i, int(seed), seed_env, timeout, cwd, env)
        finally:
            client.delete_all([sb])
            with lock:
                live.discard(sb.id)
        if progress:
            with lock:
                progress(run)
        return run

    pool = ThreadPoolExecutor(max_workers=parallel)
    futs: List["Future[Run]"] = []
    try:
        futs += [pool.submit(one, i) for i in range(n)]
        errs = [f.exception() for f in futs]
    except BaseException:
        stop.set()
        for f in futs:
            f.cancel()
        with lock:
            running = list(live)
        try:
            client.delete_all(running)  # their execs end with their sandboxes
        except SbxError:
            pass
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    for e in errs:
        if e is not None:
            raise e
    runs = [f.result() for f in futs]
    pattern = "".join("P" if r.passed else "F" for r in runs)
    return ReplayResult(runs, ReplaySummary(len(runs), pattern.count("F"), int(seed), pattern))
