"""The client: sandboxes, exec, files, captures, lifetime and reach, over sbxd's HTTP API."""

from __future__ import annotations

import io
import json
import os
import posixpath
import signal as _signal
import time
import uuid
from typing import IO, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from . import _http
from ._http import CLIENT_TIMEOUT, SSE, Idle, Transport, broken_stream, quote
from .errors import Conflict, Invalid, NotFound, SbxError, StreamError, TooLarge, Unavailable
from .types import (
    Crash,
    Duration,
    Event,
    ExecInfo,
    FileInfo,
    LogEvent,
    Metrics,
    Port,
    Result,
    ResumeResult,
    SandboxInfo,
    SnapshotInfo,
    TemplateInfo,
    b64,
    duration_seconds,
    duration_wire,
    parse_time,
    shape_wire,
)

Command = Union[str, Sequence[str]]
#: Path is a path in a sandbox: str, or bytes that are UTF-8 (sbxd's file API takes no other; see FileInfo.raw).
Path = Union[str, bytes]

#: CREATE_TOKEN is the meta key of the token each create carries, by which a create whose answer was lost finds its sandbox.
CREATE_TOKEN = "sbx.create"
#: MAX_FORKS is the most children one fork call of the API makes; Sandbox.fork grows a tree past it.
MAX_FORKS = 16
#: MAX_WAITS bounds how many times Sandbox.resume's on_wait hears why one resume waits (a fleet's controller sends at most 8).
MAX_WAITS = 8
#: HEADER_PROGRESS asks for informational answers while a request waits; HEADER_WAITING is the why in each.
HEADER_PROGRESS = "Sbx-Progress"
HEADER_WAITING = "Sbx-Waiting"
#: DEFAULT_MAX_OUTPUT bounds what Sandbox.exec and Process.wait keep of one stream in memory.
DEFAULT_MAX_OUTPUT = 64 << 20
#: DEFAULT_MAX_READ bounds what Files.read reads into memory (use read_to past it).
DEFAULT_MAX_READ = 256 << 20
_LIST_PAGE = 5000
_UNREACHABLE_PREFIX = b"sbx: start ex_"
_UNREACHABLE = b"cannot reach init on @sbx-agent"
_CHUNK = 256 << 10


def argv(cmd: Command) -> List[str]:
    """argv is the command as the API runs it: a str under ``/bin/sh -c``, a list as it is."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise Invalid("exec: an empty command")
        return ["/bin/sh", "-c", cmd]
    out = list(cmd)
    if not out or not all(isinstance(a, str) for a in out):
        raise Invalid("exec: want a non-empty list of str, got %r" % (cmd,))
    return out


def _env_list(env: Optional[Mapping[str, str]]) -> Optional[List[str]]:
    if env is None:
        return None
    out = []
    for k, v in env.items():
        if not k or "=" in k:
            raise Invalid("exec: %r is not an environment variable name" % k)
        out.append("%s=%s" % (k, v))
    return out


class Client:
    """Client talks to one sbxd.

    ``host`` is ``unix:///path/to.sock`` or ``tcp://host:port``; None means
    ``$SBX_HOST``, else ``unix:///run/sbx/sbxd.sock``. ``token`` is the bearer
    token for TCP; None means ``$SBX_TOKEN``. ``timeout`` (seconds) bounds each
    call's connect and each read of its answer, streams of files and listings
    included; an exec's reads idle at most its own timeout plus this one; a
    fork, template build or import at least 10 minutes; a follow (logs and
    events with ``follow``, Process.wait, an exec without a timeout) its
    ``idle_timeout``, by default none. A read that idles past its bound is
    Unavailable. A Client is safe to share between threads. It makes no
    connection until a call; :class:`~sbx.Invalid` for a bad host.
    """

    def __init__(self, host: Optional[str] = None, token: Optional[str] = None, timeout: Optional[float] = 60.0) -> None:
        self._t = Transport(host, token, timeout)

    @property
    def host(self) -> str:
        """host is the address this client talks to."""
        return self._t.host

    def health(self) -> Dict[str, str]:
        """health returns sbxd's ``{"status", "version"}``; Unavailable if it cannot be reached."""
        return dict(self._t.call("GET", "/v1/health"))

    def prometheus(self) -> str:
        """prometheus returns sbxd's metrics in Prometheus's text format (``GET /metrics``)."""
        with self._t.send("GET", "/metrics", accept="text/plain") as r:
            return r.read_limited(16 << 20).decode("utf-8", "replace")

    def storage(self) -> Dict[str, Any]:
        """storage says what uses sbxd's data dir, per sandbox, snapshot, freeze, template and orphan, as ``sbx --json df`` prints it."""
        return dict(self._t.call("GET", "/v1/storage") or {})

    def prune(self, orphans: bool = False, freezes: bool = False, older_than: Optional[Duration] = None, dry_run: bool = False) -> Dict[str, Any]:
        """prune removes orphan images (the default) and, with ``freezes``, freezes not kept; it returns what went, as ``sbx --json prune`` prints it."""
        req: Dict[str, Any] = {"orphans": orphans, "freezes": freezes, "dryRun": dry_run}
        t = duration_wire(older_than, "older_than")
        if t is not None:
            req["olderThan"] = t
        return dict(self._t.call("POST", "/v1/storage/prune", json_body=req) or {})

    # sandboxes

    def create(
        self,
        template: Optional[str] = None,
        name: Optional[str] = None,
        ttl: Optional[Duration] = None,
        memory: Optional[Union[int, str]] = None,
        cpus: Optional[float] = None,
        meta: Optional[Mapping[str, str]] = None,
        from_snapshot: Optional[str] = None,
        network: Optional[str] = None,
        pids: Optional[int] = None,
        disk: Optional[Union[int, str]] = None,
        keep: bool = False,
        monitor: bool = False,
        net_delay: Optional[Duration] = None,
        net_loss: Optional[float] = None,
    ) -> "Sandbox":
        """create makes a sandbox and returns it once it is ready.

        ``template`` defaults to sbxd's default template; ``from_snapshot``
        makes it from a snapshot instead (a memory snapshot carries on its
        processes). ``ttl`` is the idle ttl (seconds, timedelta or "30m"; 0:
        none); ``memory`` and ``disk`` are bytes or "512M"; ``network`` is
        None or "none"; ``monitor`` turns on runtime monitoring (see
        Sandbox.trace); ``net_delay`` and ``net_loss`` hold each packet the
        sandbox sends out that long (at most 10 s) and drop it with that
        probability (explain's network knob). Used as a context manager the sandbox is deleted on
        exit unless ``keep``. Invalid for a bad argument, NotFound for an
        unknown template or snapshot, Conflict for a name in use.

        Each create carries a token of its own in the meta key ``sbx.create``
        (left out of SandboxInfo.meta). When the answer does not come (the
        client's timeout, a broken connection, or an exception such as
        KeyboardInterrupt while waiting), the sandbox sbxd goes on making is
        found by that token and deleted before the error is raised; the
        Unavailable names it, or the token if it could not be deleted.
        """
        req: Dict[str, Any] = {}
        if template:
            req["template"] = template
        if name:
            req["name"] = name
        t = duration_wire(ttl, "ttl")
        if t is not None:
            req["ttl"] = t
        if memory is not None:
            req["memory"] = str(memory)
        if disk is not None:
            req["disk"] = str(disk)
        if cpus is not None:
            req["cpus"] = float(cpus)
        if pids is not None:
            req["pids"] = int(pids)
        token = uuid.uuid4().hex
        req["meta"] = {str(k): str(v) for k, v in (meta or {}).items()}
        req["meta"][CREATE_TOKEN] = token
        if from_snapshot:
            req["from"] = from_snapshot
        if network is not None:
            req["network"] = network
        if monitor:
            req["monitor"] = True
        shape = shape_wire(net_delay, net_loss)
        if shape is not None:
            req["netShape"] = shape
        try:
            d = self._t.call("POST", "/v1/sandboxes", json_body=req)
        except Unavailable as e:
            if not e.sent:
                raise
            raise self._reclaim(token, "create: sbxd at %s gave no answer (%s)" % (self.host, e)) from e
        except SbxError:
            raise
        except BaseException:
            # KeyboardInterrupt and the like: what sbxd makes of the request must not outlive it
            try:
                self._reclaim(token, "create")
            except BaseException:  # noqa: B902 - the first exception is the one to raise
                pass
            raise
        return Sandbox(self, d["id"], SandboxInfo.from_json(d)).keep(keep)

    def _reclaim(self, token: str, what: str) -> Unavailable:
        """_reclaim deletes the sandbox a create of ``token`` made without telling, and returns the Unavailable to raise, naming it."""
        t = Transport(self._t.host, self._t.token, timeout=min(max(self._t.timeout or 0.0, 10.0), 30.0))
        q = [("meta", "%s=%s" % (CREATE_TOKEN, token))]
        deadline = time.monotonic() + 10
        try:
            while True:
                found = [d["id"] for d in t.call("GET", "/v1/sandboxes", query=q) or [] if not d.get("parent")]
                if found:
                    for i in found:
                        try:
                            t.call("DELETE", "/v1/sandboxes/" + quote(i))  # waits for the create to finish
                        except NotFound:
                            pass
                    return Unavailable("%s; the sandbox it made, %s, was deleted" % (what, ", ".join(found)))
                if time.monotonic() > deadline:
                    return Unavailable("%s; sbxd made no sandbox of it within 10 s" % what)
                time.sleep(0.2)
        except SbxError as e:
            return Unavailable("%s; a sandbox may have been made and left: find it with client.list(meta={%r: %r}) (%s)"
                               % (what, CREATE_TOKEN, token, e))

    def sandbox(self, id_or_name: str, keep: bool = False) -> "Sandbox":
        """sandbox returns a handle on an existing sandbox, by id or name; NotFound if there is none.

        Used as a context manager it deletes the sandbox on exit unless ``keep``.
        """
        if not id_or_name:
            raise Invalid("sandbox: no id or name given")
        if id_or_name in (".", ".."):
            # no sandbox can be called that, and in a path it would be another route
            raise NotFound("no sandbox %r" % id_or_name)
        d = self._t.call("GET", "/v1/sandboxes/" + quote(id_or_name))
        return Sandbox(self, d["id"], SandboxInfo.from_json(d)).keep(keep)

    def list(
        self,
        meta: Optional[Mapping[str, str]] = None,
        state: Optional[Union[str, Iterable[str]]] = None,
        parent: Optional[str] = None,
    ) -> List["Sandbox"]:
        """list returns the sandboxes that have every ``meta`` key=value, are in one of ``state``, and (if given) are children of ``parent``."""
        q: List[Any] = []
        for k, v in (meta or {}).items():
            q.append(("meta", "%s=%s" % (k, v)))
        if isinstance(state, str):
            state = [state]
        for s in state or []:
            q.append(("state", s))
        if parent:
            q.append(("parent", parent))
        return [Sandbox(self, d["id"], SandboxInfo.from_json(d)) for d in self._t.call("GET", "/v1/sandboxes", query=q) or []]

    # snapshots

    def snapshot(self, name: str) -> "Snapshot":
        """snapshot returns a handle on the named snapshot; NotFound if there is none."""
        if not name:
            raise Invalid("snapshot: no name given")
        if name in (".", ".."):
            raise NotFound("no snapshot %r" % name)
        return Snapshot(self, SnapshotInfo.from_json(self._t.call("GET", "/v1/snapshots/" + quote(name))))

    def snapshots(self) -> List["Snapshot"]:
        """snapshots lists every snapshot."""
        return [Snapshot(self, SnapshotInfo.from_json(d)) for d in self._t.call("GET", "/v1/snapshots") or []]

    def pull_snapshot(self, ref: str, name: Optional[str] = None) -> "Snapshot":
        """pull_snapshot pulls a snapshot another sbxd pushed (ref: a registry reference, by tag or
        digest) and records it here under name (default: the name it was pushed with). Its files are
        verified against their digests; those already on this node are not fetched again. A
        snapshot pushed with memory is recorded here without it (it boots from its disk)."""
        if not ref:
            raise Invalid("pull: no ref given")
        req: Dict[str, Any] = {"ref": ref}
        if name:
            req["name"] = name
        d = self._t.call("POST", "/v1/snapshots/pull", json_body=req) or {}
        return Snapshot(self, SnapshotInfo.from_json(d.get("snapshot") or {}))

    # templates

    def templates(self) -> List[TemplateInfo]:
        """templates lists the templates."""
        return [TemplateInfo.from_json(d) for d in self._t.call("GET", "/v1/templates") or []]

    def template(self, name: str) -> TemplateInfo:
        """template describes one template; NotFound if there is none."""
        return TemplateInfo.from_json(self._t.call("GET", "/v1/templates/" + quote(name)))

    def build_template(
        self,
        name: str,
        packages: Optional[Sequence[str]] = None,
        force: bool = False,
        on_progress: Optional[Callable[[str], None]] = None,
    ) -> TemplateInfo:
        """build_template builds ``tiny``, ``base`` or base plus Debian ``packages`` as ``name`` (cached unless ``force``).

        ``on_progress`` hears each progress message. Errors are the build's, by kind.
        """
        q: List[Any] = []
        if packages:
            q.append(("packages", ",".join(packages)))
        if force:
            q.append(("force", "1"))
        resp = self._t.send("POST", "/v1/templates/" + quote(name) + "/build", query=q, accept="text/event-stream", stream=True, idle=self._t.slow_idle())
        sse = SSE(resp)
        try:
            for ev, d in sse.events():
                if d.get("message") and on_progress:
                    on_progress(d["message"])
                if d.get("done") and d.get("template"):
                    return TemplateInfo.from_json(d["template"])
        finally:
            sse.close()
        raise broken_stream("build", "", sse)

    def remove_template(self, name: str) -> None:
        """remove_template removes a template's name (its version stays while anything holds it)."""
        self._t.call("DELETE", "/v1/templates/" + quote(name))

    def import_template(self, name: str, tar: IO[bytes], size: int, force: bool = False) -> TemplateInfo:
        """import_template makes template ``name`` from a tar of a root filesystem (``size`` bytes of ``tar``)."""
        q = [("force", "1")] if force else None
        resp = self._t.send(
            "PUT", "/v1/templates/" + quote(name), query=q, body=_Limited(tar, size), length=size,
            content_type="application/x-tar", accept="text/event-stream", stream=True, idle=self._t.slow_idle(),
        )
        sse = SSE(resp)
        try:
            for ev, d in sse.events():
                if d.get("done") and d.get("template"):
                    return TemplateInfo.from_json(d["template"])
        finally:
            sse.close()
        raise broken_stream("import", "", sse)

    # the main job (client-side workflows, see sbx.flaky)

    def hunt(self, cmd: Command, **kw: Any) -> "Any":
        """hunt runs a test until it fails and keeps the failing machine frozen; see :func:`sbx.flaky.hunt`."""
        from .flaky import hunt

        return hunt(self, cmd, **kw)

    def flake_rate(self, cmd: Command, **kw: Any) -> "Any":
        """flake_rate measures a test's failure rate in memory forks; see :func:`sbx.flaky.flake_rate`."""
        from .flaky import flake_rate

        return flake_rate(self, cmd, **kw)

    def replay(self, snapshot: str, seed: int, cmd: Command, **kw: Any) -> "Any":
        """replay runs a test with one seed in fresh sandboxes from a snapshot; see :func:`sbx.flaky.replay`."""
        from .flaky import replay

        return replay(self, snapshot, seed, cmd, **kw)

    def explain(self, ref: str, cmd: Command, **kw: Any) -> "Any":
        """explain says why a flaky test fails: its rate, what its failing runs do that its passing runs
        don't, what makes it worse and when it became certain; see :func:`sbx.explain.explain`."""
        from .explain import explain

        return explain(self, ref, cmd, **kw)

    def delete_all(self, sandboxes: Iterable[Union["Sandbox", str]]) -> List[str]:
        """delete_all deletes the sandboxes (ids or handles), newest first; one already gone is no error.

        It tries every one and then raises the first error, if any. It returns the ids it deleted.
        """
        ids = [s.id if isinstance(s, Sandbox) else s for s in sandboxes]
        first: Optional[BaseException] = None
        done = []
        for i in reversed(ids):
            try:
                self._t.call("DELETE", "/v1/sandboxes/" + quote(i))
                done.append(i)
            except NotFound:
                pass
            except SbxError as e:
                first = first or e
        if first is not None:
            raise first
        return done


class _Limited(io.RawIOBase):
    """_Limited reads exactly size bytes of f (fewer is an error: the length was promised)."""

    def __init__(self, f: IO[bytes], size: int) -> None:
        self._f = f
        self._left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        if n < 0 or n > self._left:
            n = self._left
        b = self._f.read(min(n, _CHUNK))
        if not b:
            raise Invalid("upload: the file ended %d bytes before its size" % self._left)
        self._left -= len(b)
        return b


class Sandbox:
    """Sandbox is a handle on one sandbox; ``info`` is what was last known of it.

    As a context manager it deletes the sandbox on exit, unless it was made
    with ``keep=True`` or :meth:`keep` was called in the block — so a failing
    block can keep its evidence: ``with client.create(...) as sb: ...``.
    """

    def __init__(self, client: Client, id: str, info: Optional[SandboxInfo] = None) -> None:
        self.client = client
        self.id = id
        self.info_cache = info
        self.keep_on_exit = False
        self.files = Files(self)

    def __repr__(self) -> str:
        return "Sandbox(%r)" % self.id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sandbox) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: Any) -> None:
        if self.keep_on_exit:
            return
        try:
            self.delete()
        except NotFound:
            pass
        except SbxError as e:
            if exc is not None:
                # the block's own exception is the one to see; this one only rides along as a note
                note = getattr(exc, "add_note", None)
                if note is not None:
                    note("sbx: and the delete of %s on leaving the block failed, so it is left behind: %s" % (self.id, e))
                return
            cls = type(e) if type(e) in (Unavailable, Conflict, SbxError) else SbxError
            raise cls("leaving the with block of %s: its delete failed, and the sandbox is left behind: delete it "
                      "with `sbx delete %s` (%s)" % (self.id, self.id, e), code=e.code, status=e.status) from e

    def keep(self, keep: bool = True) -> "Sandbox":
        """keep makes the context manager leave the sandbox on exit (returns self)."""
        self.keep_on_exit = keep
        return self

    @property
    def _t(self) -> Transport:
        return self.client._t

    def _path(self, *suffix: str) -> str:
        return "/v1/sandboxes/" + quote(self.id) + "".join("/" + s for s in suffix)

    def _set(self, d: Dict[str, Any]) -> SandboxInfo:
        self.info_cache = SandboxInfo.from_json(d)
        return self.info_cache

    @property
    def name(self) -> str:
        """name is the sandbox's name as last known ("" for none)."""
        return self.info_cache.name if self.info_cache else ""

    def info(self) -> SandboxInfo:
        """info asks sbxd for the sandbox now; NotFound once it is gone."""
        return self._set(self._t.call("GET", self._path()))

    @property
    def state(self) -> str:
        """state asks sbxd for the sandbox's state now."""
        return self.info().state

    def delete(self, with_snapshots: bool = False, keep_freezes: bool = False) -> List[str]:
        """delete deletes the sandbox; with ``with_snapshots`` also the snapshots taken from it, whose names it returns.

        Its freezes (and crash captures) go with it, unless ``keep_freezes`` or
        promoted with Snapshot.keep.
        """
        q = []
        if with_snapshots:
            q.append(("withSnapshots", "1"))
        if keep_freezes:
            q.append(("keepFreezes", "1"))
        d = self._t.call("DELETE", self._path(), query=q or None)
        return list((d or {}).get("snapshots") or [])

    # exec

    def _exec_req(self, cmd: Command, timeout: Optional[Duration], env: Optional[Mapping[str, str]], cwd: Optional[str], user: Optional[str], detach: bool) -> Dict[str, Any]:
        req: Dict[str, Any] = {"cmd": argv(cmd)}
        t = duration_wire(timeout, "timeout")
        if t is not None and t not in ("0s", "0ms"):
            req["timeout"] = t
        e = _env_list(env)
        if e:
            req["env"] = e
        if cwd:
            req["cwd"] = cwd
        if user:
            req["user"] = user
        if detach:
            req["detach"] = True
        return req

    def exec(
        self,
        cmd: Command,
        timeout: Optional[Duration] = 30,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
        on_crash: bool = False,
    ) -> Result:
        """exec runs cmd and waits for it; a command that fails is a Result, not an exception.

        A str runs under ``/bin/sh -c``; a list runs as argv. ``timeout``
        (default 30 s; None or 0: none) is enforced by the sandbox: the
        command is killed and exits 124 with ``timed_out``. Past
        ``max_output`` bytes of stdout or stderr, exec stops reading and
        raises TooLarge naming the exec, which goes on (use exec_stream or
        start for big output). NotFound: no such sandbox; Conflict: it is
        not running; StreamError: the stream broke, naming the exec.

        ``on_crash`` (as the Go client's WithOnCrash): when the command or a
        process it started died of a signal that dumps core, wait for the
        sandbox's capture of it and return it as ``Result.crash``; when the
        boot's one capture was spent already, ``Result.crash_missed`` says on
        what. A sandbox made with crash capture off is Invalid, before anything runs.
        """
        before = self._check_crashes("exec") if on_crash else -1
        out: List[bytearray] = [bytearray(), bytearray()]

        def keep(i: int) -> Callable[[bytes], None]:
            def f(b: bytes) -> None:
                if len(out[i]) + len(b) > max_output:
                    raise _OutputTooLarge()
                out[i] += b

            return f

        x = self._exec_stream(self._exec_req(cmd, timeout, env, cwd, user, False), keep(0), keep(1), max_output, self._exec_idle(timeout))
        res = _result(x, bytes(out[0]), bytes(out[1]))
        if on_crash and x.state == "exited":
            self._find_crash(x, res, before)
        return res

    def crashes(self) -> List[Crash]:
        """crashes lists the crashes the sandbox caught, oldest first, each held at its faulting instruction in a freeze (its snapshot)."""
        return [c for c in (Crash.from_event(ev) for ev in self.events()) if c is not None]

    def _check_crashes(self, op: str) -> int:
        """_check_crashes refuses a sandbox that catches no crash and returns its count of crashes so far (-1 if unknown)."""
        if self.info().meta.get("sbx.crashes") == "off":
            raise Invalid("%s in %s: the sandbox was made with crash capture off (meta sbx.crashes=off, sbx new --no-crash-capture): "
                          "it catches no crash; run it in a sandbox made without that" % (op, self.id))
        return self._crash_count()

    def _crash_count(self) -> int:
        try:
            return int(self.files.read(_CRASH_COUNT, 64).decode().strip())
        except NotFound:
            return 0  # init writes it at the first crash
        except (SbxError, ValueError, UnicodeDecodeError):
            return -1

    def _find_crash(self, x: ExecInfo, res: Result, before: int) -> None:
        """_find_crash fills res.crash or res.crash_missed, as the Go client's findCrash."""
        code = x.exit_code if x.exit_code is not None else -1
        died = _core_signal(code)
        after = self._crash_count()
        if not died and not (before >= 0 and after > before):
            return
        rec: Dict[str, Any] = {}
        try:
            d = json.loads(self.files.read(_FREEZE_RECORD, 64 << 10))
            if isinstance(d, dict):
                rec = d
        except (SbxError, ValueError, UnicodeDecodeError):
            pass
        c = rec.get("crash") if isinstance(rec.get("crash"), dict) else None
        name = str(rec.get("name") or "")
        ours = False
        if c is not None and name:
            probe = Crash(pid=int(rec.get("pid") or 0), signal="", snapshot=name, pgid=int(c.get("pgid") or 0),
                          ancestors=[int(a) for a in (c.get("ancestors") or []) if isinstance(a, int)])
            ours = (x.pid <= 0 or probe.of(x.pid)) and _during(parse_time(rec.get("failedAt")), x)
        if not ours:
            if died:
                res.crash_missed = self._missed_why(rec, name, c)
            return
        if rec.get("state") in ("failed", "unsupported"):
            res.crash_missed = "the sandbox could not capture the crash of %s (%s): %s" % (rec.get("pid"), (c or {}).get("signal", ""), rec.get("error", ""))
            return
        deadline = time.monotonic() + _CRASH_WAIT
        try:
            for ev in self.events(follow=True, idle_timeout=_CRASH_WAIT):
                if ev.type == "frozen" and ev.detail.get("name") == name:
                    cr = Crash.from_event(ev)
                    if cr is not None:
                        res.crash = cr
                    else:
                        res.crash_missed = "the sandbox caught the crash of %s as %s, but sbxd could not keep it: %s" % (
                            rec.get("pid"), name, ev.detail.get("error", ""))
                    return
                if time.monotonic() > deadline:
                    break
        except (SbxError, OSError):
            pass  # the stream broke or stayed idle: said below
        res.crash_missed = "the sandbox caught the crash of %s as %s, but sbxd had not recorded it after %ds (it may yet: sbx crashes %s)" % (
            rec.get("pid"), name, _CRASH_WAIT, self.id)

    def _missed_why(self, rec: Dict[str, Any], name: str, c: Optional[Dict[str, Any]]) -> str:
        one = ("a sandbox catches one crash per boot (gVisor arms one capture per boot): after sbx stop and sbx resume, "
               "in a copy, or in a new sandbox the next is caught")
        if not name:
            return "the sandbox made no capture of it (see sbx logs %s --stream console)" % self.id
        if c is not None:
            at = ""
            for cr in self.crashes():
                if cr.snapshot == name and cr.at is not None:
                    at = " at " + cr.at.strftime("%Y-%m-%dT%H:%M:%SZ")
            return "not caught: this boot's capture was spent on an earlier crash, of %s (%s, %s)%s, snapshot %s; %s" % (
                rec.get("pid"), c.get("exe", ""), c.get("signal", ""), at, name, one)
        return "not caught: this boot's capture was spent on the freeze %s (%s); %s" % (
            name, ("%s %s" % (rec.get("reason", ""), rec.get("cmd", ""))).strip(), one)

    def exec_stream(
        self,
        cmd: Command,
        on_stdout: Optional[Callable[[bytes], Any]] = None,
        on_stderr: Optional[Callable[[bytes], Any]] = None,
        timeout: Optional[Duration] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
    ) -> int:
        """exec_stream runs cmd, hands each chunk of output to on_stdout / on_stderr as it comes, and returns the exit code.

        Nothing is kept in memory. ``timeout`` defaults to none. An exception
        raised by a callback stops the reading (the command goes on) and is
        raised as it is.
        """
        x = self._exec_stream(self._exec_req(cmd, timeout, env, cwd, user, False), on_stdout, on_stderr, None, self._exec_idle(timeout))
        return int(x.exit_code if x.exit_code is not None else -1)

    def _exec_idle(self, timeout: Optional[Duration]) -> Optional[float]:
        """_exec_idle bounds the wait for an exec's next event: its timeout T plus the client's (none without either)."""
        t = duration_seconds(timeout, "timeout")
        if not t or self._t.timeout is None:
            return None
        return t + self._t.timeout

    def _exec_stream(self, req: Dict[str, Any], on_out: Optional[Callable[[bytes], Any]], on_err: Optional[Callable[[bytes], Any]], max_output: Optional[int], idle: Optional[float]) -> ExecInfo:
        # Workaround of a race in sbxd (reported, not fixed here): a sandbox that has just booted
        # is "ready" before its init listens, and an exec then ends 125 with "sbx: start ID:
        # cannot reach init ...: connection refused" — a command that never ran (the agent sent
        # no request, so the exec has no pid). Only that answer, pid-less, with nothing else said, is tried again, for 5 s.
        deadline = time.monotonic() + 5
        pause = 0.05
        while True:
            held: List[bytes] = []
            said = [False]

            def out(b: bytes) -> Any:
                said[0] = True
                if held:
                    for h in held:
                        if on_err is not None:
                            on_err(h)
                    held.clear()
                return on_out(b) if on_out is not None else None

            def err(b: bytes) -> Any:
                if not said[0] and not held and _UNREACHABLE_PREFIX in b[:64] and _UNREACHABLE in b:
                    held.append(b)
                    return None
                said[0] = True
                if held:
                    for h in held:
                        if on_err is not None:
                            on_err(h)
                    held.clear()
                return on_err(b) if on_err is not None else None

            resp = self._t.send("POST", self._path("exec"), json_body=req, accept="text/event-stream", stream=True, idle=idle)
            x = _follow(resp, "exec", self.id, out, err, max_output)
            if held and not said[0] and x.exit_code == 125 and x.pid == 0 and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
                continue
            for h in held:
                if on_err is not None:
                    on_err(h)
            return x

    def start(
        self,
        cmd: Command,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[Duration] = None,
        on_crash: bool = False,
    ) -> "Process":
        """start starts cmd detached and returns at once; the command outlives the client and sbxd keeps its output.

        Detached commands are started by the sandbox's init: they live on
        through stop and resume and are carried into memory snapshots and forks.
        ``on_crash`` only checks that the sandbox catches crashes (Invalid if it
        was made with crash capture off): a detached command's crash is read
        later with :meth:`crashes`.
        """
        if on_crash:
            self._check_crashes("start")
        d = self._t.call("POST", self._path("exec"), json_body=self._exec_req(cmd, timeout, env, cwd, user, True))
        return Process(self, d["id"], int(d.get("pid") or 0))

    def process(self, exec_id: str) -> "Process":
        """process returns a handle on an exec of this sandbox by its id (nothing is asked of sbxd)."""
        return Process(self, exec_id)

    def execs(self) -> List[ExecInfo]:
        """execs lists the sandbox's execs, ended ones included, oldest first."""
        return [ExecInfo.from_json(d) for d in self._t.call("GET", self._path("execs")) or []]

    # captures

    def snapshot(self, name: Optional[str] = None, memory: bool = False) -> "Snapshot":
        """snapshot takes a named snapshot (a name is made up when None): the disk, and with ``memory`` the processes and memory.

        The sandbox keeps running. Conflict for a name in use; Invalid for a bad name.
        """
        if name is None:
            name = "snap-%s-%s" % (self.id[3:], uuid.uuid4().hex[:8])
        d = self._t.call("POST", self._path("snapshots"), json_body={"name": name, "memory": bool(memory)})
        return Snapshot(self.client, SnapshotInfo.from_json(d))

    def fork(
        self,
        count: int = 1,
        memory: bool = False,
        name: Optional[str] = None,
        ttl: Optional[Duration] = None,
        meta: Optional[Mapping[str, str]] = None,
        monitor: bool = False,
        net_delay: Optional[Duration] = None,
        net_loss: Optional[float] = None,
    ) -> List["Sandbox"]:
        """fork makes ``count`` new sandboxes from this one, now, and returns them ready.

        ``monitor`` turns on runtime monitoring in each child, from its start (see trace).
        Disk-only by default (the children boot fresh on a copy of the disk);
        with ``memory`` they carry on the processes and memory. Past 16 it
        grows a tree, 16 per call, breadth-first. All or nothing: on any
        error every child made is deleted and the error raised. ``meta`` is
        merged into the parent's; ``name`` names a single child.
        ``net_delay`` and ``net_loss`` shape what leaves each child (see
        Client.create); given neither, the children keep the parent's, and
        ``net_delay=0`` alone gives them none.
        """
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            # the messages of api.CheckForkCount and api.ForkRequest.Validate
            raise Invalid("count %r is out of range: a fork makes at least 1 sandbox" % (count,))
        if count > 1 and name:
            raise Invalid("name: only a single fork can be named")
        req: Dict[str, Any] = {}
        if memory:
            req["memory"] = True
        if monitor:
            req["monitor"] = True
        if name:
            req["name"] = name
        t = duration_wire(ttl, "ttl")
        if t is not None:
            req["ttl"] = t
        if meta:
            req["meta"] = {str(k): str(v) for k, v in meta.items()}
        shape = shape_wire(net_delay, net_loss)
        if shape is not None:
            req["netShape"] = shape
        announced: List[str] = []
        made: List[Sandbox] = []
        parents = [self.id]
        try:
            while len(made) < count:
                nxt: List[str] = []
                for p in parents:
                    if len(made) == count:
                        break
                    r = dict(req, count=min(MAX_FORKS, count - len(made)))
                    kids = self._fork_once(p, r, announced)
                    nxt += [k.id for k in kids]
                    made += kids
                parents = nxt
        except BaseException:
            try:
                self.client.delete_all(announced)
            except SbxError:
                pass
            raise
        return made

    def _fork_once(self, parent: str, req: Dict[str, Any], announced: List[str]) -> List["Sandbox"]:
        """_fork_once is one fork call of the API (at most 16 children); the ids sbxd announces go to ``announced``."""
        resp = self._t.send("POST", "/v1/sandboxes/" + quote(parent) + "/fork", json_body=req, accept="text/event-stream", stream=True,
                            idle=self._t.slow_idle())
        sse = SSE(resp)
        ids: List[str] = []
        ready: List[Dict[str, Any]] = []
        try:
            for name, d in sse.events():
                ev = name or d.get("event", "")
                if ev == "sandbox.forking":
                    ids = list(d.get("ids") or [])
                    announced.extend(ids)
                elif ev == "sandbox.ready" and d.get("sandbox"):
                    ready.append(d["sandbox"])
                elif ev == "done":
                    kids = d.get("sandboxes") or ready
                    announced.extend(k["id"] for k in kids)
                    if not kids:
                        raise SbxError("fork %s: done without children" % parent)
                    return [Sandbox(self.client, k["id"], SandboxInfo.from_json(k)) for k in kids]
        finally:
            sse.close()
        raise broken_stream("fork", parent, sse, children=ids)

    def stop(self, wait: bool = True) -> SandboxInfo:
        """stop hibernates the sandbox: no CPU, no memory, its processes and memory kept in an image.

        With ``wait`` (the default) it returns once the sandbox is stopped.
        Conflict if it is not running.
        """
        return self._set(self._t.call("POST", self._path("stop"), query=[("wait", "1")] if wait else None))

    def resume(self, require_memory: bool = False, on_wait: Optional[Callable[[str], None]] = None) -> ResumeResult:
        """resume brings a stopped sandbox back; the result says whether its memory was restored and, if not, why.

        With ``require_memory`` a resume that cannot restore the memory is
        refused (the image is kept) instead of booting from the disk.
        Through a fleet's controller such a resume waits for a node where its
        memory restores; ``on_wait`` then hears why it waits, while it waits
        (again when the why changes, at most MAX_WAITS times). The why is the
        fleet's words, from what its nodes publish. One sbxd never waits.
        """
        heard = [0]

        def info(status: int, headers: Any) -> None:
            why = headers.get(HEADER_WAITING, "")
            if on_wait is not None and status == 102 and why and heard[0] < MAX_WAITS:
                heard[0] += 1
                on_wait(why)

        body = {"requireMemory": True} if require_memory else {}
        if on_wait is None:
            d = self._t.call("POST", self._path("resume"), json_body=body)
        else:
            d = self._t.call("POST", self._path("resume"), json_body=body, extra_headers={HEADER_PROGRESS: "102"}, on_info=info)
        info_ = self._set(d)
        return ResumeResult(info_.memory_restored, info_.resume_reason, info_)

    # lifetime

    def set_ttl(self, ttl: Duration) -> SandboxInfo:
        """set_ttl sets the idle ttl: seconds, a timedelta, or a string like "30m" (0: none); Invalid for a bad one."""
        t = duration_wire(ttl, "ttl")
        if t is None:
            raise Invalid("ttl of %s: none given (0 means no ttl)" % self.id)
        return self._set(self._t.call("POST", self._path("ttl"), json_body={"ttl": t}))

    def set_persistent(self, persistent: bool = True) -> SandboxInfo:
        """set_persistent exempts the sandbox from the idle reaper (or not); Forbidden where sbxd caps lifetimes."""
        return self._set(self._t.call("POST", self._path("persist"), json_body={"persistent": bool(persistent)}))

    # reach

    def logs(self, stream: str = "console", follow: bool = False, tail: Optional[int] = None, idle_timeout: Optional[float] = None) -> Iterator[LogEvent]:
        """logs yields the chunks of a log stream: console, events, runtime or exec/EXEC_ID.

        With ``follow`` it goes on until the caller stops iterating (close the
        generator to drop the connection), waiting at most ``idle_timeout``
        seconds for each chunk (default: no bound); without, each read waits
        at most the client's timeout. A stream that breaks is StreamError.
        """
        q: List[Any] = [("stream", stream)]
        if follow:
            q.append(("follow", "1"))
        if tail is not None:
            if tail < 0:
                raise Invalid("logs of %s: tail %d is negative" % (self.id, tail))
            q.append(("tail", str(tail)))
        resp = self._t.send("GET", self._path("logs"), query=q, accept="text/event-stream", stream=True,
                            idle=idle_timeout if follow else CLIENT_TIMEOUT)
        return self._log_events(resp)

    def _log_events(self, resp: _http.Response) -> Iterator[LogEvent]:
        sse = SSE(resp)
        try:
            for name, d in sse.events():
                if name in ("log", ""):
                    from .types import parse_time

                    yield LogEvent(d.get("stream", ""), b64(d.get("data")), parse_time(d.get("time")))
                elif name == "eof":
                    return
        finally:
            sse.close()
        raise broken_stream("logs", self.id, sse)

    def events(self, follow: bool = False, after: int = 0, idle_timeout: Optional[float] = None) -> Iterator[Event]:
        """events yields the sandbox's lifecycle events after sequence number ``after``; with ``follow``, new ones as they come.

        A follow waits at most ``idle_timeout`` seconds for each event (default: no bound); without, the client's timeout.
        """
        q: List[Any] = []
        if follow:
            q.append(("follow", "1"))
        if after:
            q.append(("after", str(int(after))))
        resp = self._t.send("GET", self._path("events"), query=q, accept="text/event-stream", stream=True,
                            idle=idle_timeout if follow else CLIENT_TIMEOUT)
        return self._events(resp, after)

    def _events(self, resp: _http.Response, last: int) -> Iterator[Event]:
        sse = SSE(resp)
        try:
            for name, d in sse.events():
                if name in ("event", ""):
                    ev = Event.from_json(d)
                    last = ev.seq
                    yield ev
                elif name == "eof":
                    return
        finally:
            sse.close()
        raise broken_stream("events", self.id, sse, last_seq=last)

    def preview_url(self, port: int, private: bool = False, ttl: Optional[Duration] = None) -> str:
        """preview_url publishes ``port`` through sbxd's preview proxy and returns its URL (with a signed token when ``private``)."""
        req: Dict[str, Any] = {"port": int(port)}
        if private:
            req["private"] = True
        t = duration_wire(ttl, "ttl")
        if t is not None:
            req["ttl"] = t
        return str(self._t.call("POST", self._path("preview"), json_body=req)["url"])

    def previews(self) -> List[Dict[str, Any]]:
        """previews lists the published ports: ``{"url", "port", "private"}`` each."""
        d = self._t.call("GET", self._path("preview"))
        if isinstance(d, dict):
            d = d.get("previews") or []
        return list(d or [])

    def unpreview(self, port: int) -> None:
        """unpreview withdraws a published port."""
        self._t.call("DELETE", self._path("preview", str(int(port))))

    def ports(self) -> List[Port]:
        """ports lists the TCP ports listening inside the sandbox."""
        d = self._t.call("GET", self._path("ports")) or []
        if isinstance(d, dict):
            d = d.get("ports") or []
        return [Port(int(p.get("port") or 0), p.get("address", ""), p.get("proto", "tcp"), int(p.get("pid") or 0), p.get("command", "")) for p in d]

    def trace(self) -> Dict[str, Any]:
        """trace returns what runtime monitoring kept of a sandbox made with ``monitor=True``, as the API has it.

        ``{"sandboxId", "events": [{"timeNs", "pid", "kind", "path", "addr", "argv", "result", "errno", ...}],
        "dropped", "sentryDropped", "limit", "connected"}``: the syscalls on files and sockets, the
        execs and the exits, in order. NotFound for no such sandbox; Conflict for one not monitored.
        """
        return dict(self._t.call("GET", self._path("trace")) or {})

    def metrics(self) -> Metrics:
        """metrics returns the sandbox's resource use now."""
        d = self._t.call("GET", self._path("metrics"))
        return Metrics(float(d.get("cpuSeconds") or 0), int(d.get("memoryBytes") or 0), int(d.get("processes") or 0), int(d.get("diskBytes") or 0))


class _OutputTooLarge(Exception):
    pass


# where the sandbox's init keeps the record of the boot's freeze and the count of its crashes
_FREEZE_RECORD = "/run/sbx/freeze/record.json"
_CRASH_COUNT = "/run/sbx/crashes/count"
# how long on_crash waits for sbxd to record a capture the sandbox made
_CRASH_WAIT = 120
# how far a crash's time may lie outside its exec's start and end
_CRASH_SLACK = 2.0
# signals whose default action dumps core
_CORE_SIGNALS = {_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGILL, _signal.SIGFPE, _signal.SIGABRT,
                 _signal.SIGTRAP, _signal.SIGSYS, _signal.SIGQUIT, _signal.SIGXCPU, _signal.SIGXFSZ}


def _core_signal(code: int) -> bool:
    """_core_signal is True when an exit code (128+N, or -N) is a death by a signal that dumps core."""
    if code < 0:
        code = 128 - code
    return 128 < code < 128 + 65 and (code - 128) in {int(s) for s in _CORE_SIGNALS}


def _during(t: Any, x: ExecInfo) -> bool:
    """_during is True when t falls within the exec's run (with _CRASH_SLACK)."""
    if t is None or x.started_at is None:
        return t is not None
    if (t - x.started_at).total_seconds() < -_CRASH_SLACK:
        return False
    return x.ended_at is None or (t - x.ended_at).total_seconds() <= _CRASH_SLACK


def _result(x: ExecInfo, out: bytes, err: bytes) -> Result:
    code = x.exit_code if x.exit_code is not None else -1
    return Result(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), x.id, x.timed_out, out, err, x.state)


def _follow(
    resp: _http.Response,
    op: str,
    sandbox_id: str,
    on_out: Optional[Callable[[bytes], Any]],
    on_err: Optional[Callable[[bytes], Any]],
    max_output: Optional[int],
    exec_id: str = "",
    allow_eof: bool = False,
) -> ExecInfo:
    """_follow reads an exec's stream to its exit event and returns the exec; see Sandbox.exec for the errors."""
    sse = SSE(resp)
    started: Optional[ExecInfo] = None
    try:
        for name, d in sse.events():
            ev = name or d.get("event", "")
            if ev == "started" and d.get("exec"):
                started = ExecInfo.from_json(d["exec"])
                exec_id = started.id
            elif ev in ("stdout", "stderr"):
                fn = on_out if ev == "stdout" else on_err
                if fn is not None:
                    try:
                        fn(b64(d.get("data")))
                    except _OutputTooLarge:
                        raise TooLarge(
                            "%s %s in %s: the output passed %d bytes; the command goes on (read it with "
                            "exec_stream, logs(stream='exec/%s') or start(...).wait(on_stdout=...))"
                            % (op, exec_id, sandbox_id, max_output or 0, exec_id)
                        ) from None
            elif ev == "exit":
                if not d.get("exec"):
                    raise SbxError("%s in %s: exit event without the exec" % (op, sandbox_id))
                return ExecInfo.from_json(d["exec"])
            elif ev == "eof" and allow_eof:
                return ExecInfo(exec_id, sandbox_id, [], "running", exit_code=None)
    except Unavailable as e:
        if isinstance(e, StreamError):
            raise
        raise StreamError(op, sandbox_id, cause=str(e), exec_id=exec_id) from e
    finally:
        sse.close()
    raise broken_stream(op, sandbox_id, sse, exec_id=exec_id)


class Process:
    """Process is one exec of a sandbox: a command ``start`` started, or one named by ``sandbox.process(id)``."""

    def __init__(self, sandbox: Sandbox, id: str, pid: int = 0) -> None:
        self.sandbox = sandbox
        self.id = id
        self.pid = pid

    def __repr__(self) -> str:
        return "Process(%r, %r)" % (self.sandbox.id, self.id)

    def _path(self, *suffix: str) -> str:
        return self.sandbox._path("execs", quote(self.id), *suffix)

    def info(self) -> ExecInfo:
        """info returns the exec as sbxd has it now; NotFound for an unknown exec or sandbox."""
        return ExecInfo.from_json(self.sandbox._t.call("GET", self._path()))

    def wait(
        self,
        on_stdout: Optional[Callable[[bytes], Any]] = None,
        on_stderr: Optional[Callable[[bytes], Any]] = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
        idle_timeout: Optional[float] = None,
    ) -> Result:
        """wait waits for the exec to end and returns its Result with all its output from the start.

        With callbacks the output goes to them instead of the Result. A
        stream that breaks is StreamError naming the exec (it goes on). It
        waits at most ``idle_timeout`` seconds for each event (default: no
        bound, as the exec may run for ever).
        """
        return self._output(True, on_stdout, on_stderr, max_output, idle_timeout)

    def output(self, max_output: int = DEFAULT_MAX_OUTPUT) -> Result:
        """output returns the output kept so far without waiting; ``exit_code`` is -1 and ``state`` "running" while it runs."""
        return self._output(False, None, None, max_output, CLIENT_TIMEOUT)

    def _output(self, follow: bool, on_out: Optional[Callable[[bytes], Any]], on_err: Optional[Callable[[bytes], Any]], max_output: int, idle: Idle) -> Result:
        bufs: List[bytearray] = [bytearray(), bytearray()]

        def keep(i: int, fn: Optional[Callable[[bytes], Any]]) -> Callable[[bytes], Any]:
            if fn is not None:
                return fn

            def f(b: bytes) -> None:
                if len(bufs[i]) + len(b) > max_output:
                    raise _OutputTooLarge()
                bufs[i] += b

            return f

        resp = self.sandbox._t.send("GET", self._path("output"), query=[("follow", "1")] if follow else None, accept="text/event-stream", stream=True, idle=idle)
        x = _follow(resp, "wait" if follow else "output", self.sandbox.id, keep(0, on_out), keep(1, on_err), max_output, exec_id=self.id, allow_eof=not follow)
        return _result(x, bytes(bufs[0]), bytes(bufs[1]))

    def signal(self, sig: int = _signal.SIGTERM) -> None:
        """signal sends ``sig`` to the exec's process group; Conflict once it has ended, NotFound for an unknown exec."""
        n = int(sig)
        if n <= 0 or n > 64:
            raise Invalid("signal %s of %s: %d is not a signal number (1 to 64)" % (self.id, self.sandbox.id, n))
        self.sandbox._t.call("POST", self._path("signal"), json_body={"signal": n})

    def kill(self) -> None:
        """kill sends SIGKILL to the exec's process group (see signal)."""
        self.signal(_signal.SIGKILL)


class Files:
    """Files moves files in and out of a sandbox as streams; paths are the sandbox's (``~`` is the user's home)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def _q(self, path: Path, **kw: Any) -> List[Any]:
        if not isinstance(path, (str, bytes)) or not path:
            raise Invalid("files of %s: no path given" % self.sandbox.id)
        if isinstance(path, bytes):
            try:
                path = path.decode("utf-8")
            except UnicodeDecodeError:
                # sbxd hands a path to the sandbox as UTF-8 text, bad bytes made U+FFFD: it would be another file
                raise Invalid("files of %s: the path %s is not UTF-8, and sbxd's file API takes only UTF-8 paths "
                              "(a name that is not can be listed, with its bytes in FileInfo.raw, but not addressed)"
                              % (self.sandbox.id, _show(path))) from None
        return [("path", path)] + [(k, v) for k, v in kw.items() if v is not None]

    def open(self, path: Path) -> _http.Response:
        """open returns a stream of the file's bytes (``.read(n)``, ``.close()``); NotFound for no such file."""
        return self.sandbox._t.send("GET", self.sandbox._path("files"), query=self._q(path), stream=True)

    def read(self, path: Path, max_size: int = DEFAULT_MAX_READ) -> bytes:
        """read returns the whole file; TooLarge past ``max_size`` bytes (read_to streams any size)."""
        with self.open(path) as r:
            b = r.read(max_size + 1)
            if len(b) > max_size:
                raise TooLarge("read %s in %s: the file is larger than %d bytes (use read_to)" % (_show(path), self.sandbox.id, max_size))
            return b

    def read_to(self, path: Path, fileobj: IO[bytes]) -> int:
        """read_to copies the file into ``fileobj`` a chunk at a time and returns the bytes copied."""
        n = 0
        with self.open(path) as r:
            while True:
                b = r.read(_CHUNK)
                if not b:
                    return n
                fileobj.write(b)
                n += len(b)

    def write(self, path: Path, data: Union[bytes, str], mode: Optional[int] = None, parents: bool = True) -> None:
        """write writes ``data`` (str as UTF-8) to the file, making its parent folders unless ``parents`` is False."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        self.write_from(path, io.BytesIO(data), size=len(data), mode=mode, parents=parents)

    def write_from(self, path: Path, fileobj: IO[bytes], size: Optional[int] = None, mode: Optional[int] = None, parents: bool = True) -> int:
        """write_from streams ``size`` bytes of ``fileobj`` into the file (a chunk at a time) and returns the size.

        ``size`` defaults to what is left of a file or seekable stream; a
        pipe needs it given (sbxd wants the length first).
        """
        if size is None:
            size = _remaining(fileobj)
            if size is None:
                raise Invalid("write %s in %s: give size= for a stream that cannot tell its length" % (_show(path), self.sandbox.id))
        if size < 0:
            raise Invalid("write %s in %s: negative size %d" % (_show(path), self.sandbox.id, size))
        p = str(self._q(path)[0][1])
        if parents:
            parent = posixpath.dirname(p.rstrip("/"))
            if parent and parent not in ("/", "~", "."):
                self.mkdir(parent)
        q = self._q(p, mode=("%04o" % mode) if mode is not None else None)
        with self.sandbox._t.send("PUT", self.sandbox._path("files"), query=q, body=_Limited(fileobj, size), length=size, content_type="application/octet-stream") as r:
            r.read(_http.MAX_ERROR_BODY)
        return size

    def stat(self, path: Path) -> FileInfo:
        """stat describes the file (the link itself for a symlink); NotFound for none."""
        return FileInfo.from_json(self.sandbox._t.call("GET", self.sandbox._path("fs", "stat"), query=self._q(path)))

    def exists(self, path: Path) -> bool:
        """exists says whether there is a file at path."""
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def list(self, path: Path) -> List[FileInfo]:
        """list lists a directory, every page of it (a name that is not UTF-8 has its bytes in FileInfo.raw)."""
        out: List[FileInfo] = []
        after = b""
        while True:
            q = self._q(path, limit=str(_LIST_PAGE), after=after or None)
            page = [FileInfo.from_json(d) for d in self.sandbox._t.call("GET", self.sandbox._path("fs", "ls"), query=q) or []]
            out += page
            if len(page) < _LIST_PAGE:
                return out
            # the next page starts after the last name as it is, not as JSON could carry it (as the Go client)
            nxt = page[-1].name_bytes
            if nxt <= after or len(out) > (1 << 20):
                raise SbxError("list %s in %s: the sandbox's listing does not end (%d entries so far)" % (_show(path), self.sandbox.id, len(out)))
            after = nxt

    def remove(self, path: Path, recursive: bool = False) -> None:
        """remove removes a file or empty folder (a whole tree with ``recursive``); NotFound for none."""
        self.sandbox._t.call("DELETE", self.sandbox._path("files"), query=self._q(path, recursive="1" if recursive else None))

    def mkdir(self, path: Path, mode: Optional[int] = None) -> None:
        """mkdir makes the folder and its parents (no error if it is there)."""
        self.sandbox._t.call("POST", self.sandbox._path("fs", "mkdir"), query=self._q(path, mode=("%04o" % mode) if mode is not None else None))

    def rename(self, src: str, dst: str) -> None:
        """rename renames src to dst inside the sandbox (replacing a file at dst)."""
        self.sandbox._t.call("POST", self.sandbox._path("fs", "rename"), json_body={"from": src, "to": dst})

    def read_tar(self, path: Path) -> _http.Response:
        """read_tar returns a stream of a tar of the folder or file at path."""
        return self.sandbox._t.send("GET", self.sandbox._path("files"), query=self._q(path, tar="1"), stream=True)

    def write_tar(self, path: Path, fileobj: IO[bytes], size: Optional[int] = None) -> None:
        """write_tar extracts a tar (``size`` bytes of ``fileobj``) under the folder at path."""
        if size is None:
            size = _remaining(fileobj)
            if size is None:
                raise Invalid("write tar %s in %s: give size= for a stream that cannot tell its length" % (_show(path), self.sandbox.id))
        with self.sandbox._t.send("PUT", self.sandbox._path("files"), query=self._q(path, tar="1"), body=_Limited(fileobj, size), length=size, content_type="application/x-tar") as r:
            r.read(_http.MAX_ERROR_BODY)

    def upload_dir(self, local_dir: str, path: str, exclude: Sequence[str] = (".git", "__pycache__", ".pytest_cache")) -> None:
        """upload_dir copies a local folder's contents under ``path`` in the sandbox (through a tar spooled to a temporary file)."""
        import tarfile
        import tempfile

        if not os.path.isdir(local_dir):
            raise Invalid("upload %s: not a directory" % local_dir)
        skip = set(exclude)
        with tempfile.TemporaryFile() as tmp:
            with tarfile.open(fileobj=tmp, mode="w") as tf:
                for entry in sorted(os.listdir(local_dir)):
                    if entry in skip:
                        continue
                    tf.add(os.path.join(local_dir, entry), arcname=entry, filter=lambda ti: None if os.path.basename(ti.name) in skip else ti)
            size = tmp.tell()
            tmp.seek(0)
            self.mkdir(path)
            self.write_tar(path, tmp, size)


def _show(path: Path) -> str:
    """_show is a path as a message shows it (a bytes path with its bad bytes escaped)."""
    return path.decode("utf-8", "backslashreplace") if isinstance(path, bytes) else path


def _remaining(f: IO[bytes]) -> Optional[int]:
    try:
        pos = f.tell()
        if hasattr(f, "fileno"):
            try:
                return os.fstat(f.fileno()).st_size - pos
            except (OSError, io.UnsupportedOperation):
                pass
        end = f.seek(0, io.SEEK_END)
        f.seek(pos)
        return end - pos
    except (OSError, io.UnsupportedOperation, AttributeError):
        return None


class Snapshot:
    """Snapshot is a handle on a named snapshot; ``info`` describes it. A snapshot outlives its sandbox."""

    def __init__(self, client: Client, info: SnapshotInfo) -> None:
        self.client = client
        self.info = info
        self.name = info.name

    def __repr__(self) -> str:
        return "Snapshot(%r)" % self.name

    def create(self, **kw: Any) -> Sandbox:
        """create makes one sandbox from the snapshot (keyword arguments as Client.create)."""
        return self.client.create(from_snapshot=self.name, **kw)

    def fork(self, count: int = 1, ttl: Optional[Duration] = None, meta: Optional[Mapping[str, str]] = None, parallel: int = 4) -> List[Sandbox]:
        """fork makes ``count`` sandboxes from the snapshot (with its memory, if it has it), ``parallel`` at a time; all or nothing.

        On any error, KeyboardInterrupt included, no more creates start, the
        ones under way are waited for, and every sandbox made is deleted
        before the exception is raised (as the Go client's Fork).
        """
        import threading
        from concurrent.futures import ThreadPoolExecutor

        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise Invalid("fork of snapshot %s: want at least 1 sandbox, got %r" % (self.name, count))
        if not isinstance(parallel, int) or parallel < 1:
            raise Invalid("fork of snapshot %s: want a parallelism of at least 1, got %r" % (self.name, parallel))
        duration_wire(ttl, "ttl")
        made: List[Sandbox] = []
        errors: List[BaseException] = []
        stop = threading.Event()

        def one(_: int) -> None:
            if errors or stop.is_set():
                return
            try:
                sb = self.client.create(from_snapshot=self.name, ttl=ttl, meta=meta)
                made.append(sb)
            except BaseException as e:
                errors.append(e)

        pool = ThreadPoolExecutor(max_workers=min(parallel, count))
        try:
            try:
                for f in [pool.submit(one, i) for i in range(count)]:
                    f.result()
            finally:
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)  # the creates under way end, and are in made
            if errors:
                raise errors[0]
        except BaseException:
            try:
                self.client.delete_all(made)
            except SbxError:
                pass
            raise
        return made

    def delete(self) -> None:
        """delete removes the snapshot; NotFound if it is gone."""
        self.client._t.call("DELETE", "/v1/snapshots/" + quote(self.name))

    def push(self, ref: str) -> str:
        """push sends the snapshot (its disk, and its memory if it has one) to an OCI registry: ref is a
        repository with a tag or not (127.0.0.1:5000/sbx/flaky:run-7). It returns the artifact by
        digest, which pull_snapshot of it gets exactly."""
        if not ref:
            raise Invalid("push of snapshot %s: no ref given" % self.name)
        d = self.client._t.call("POST", "/v1/snapshots/" + quote(self.name) + "/push", json_body={"ref": ref}) or {}
        return str(d.get("ref", ""))

    def keep(self) -> "Snapshot":
        """keep promotes the snapshot (a freeze, above all): it outlives its sandbox and counts in no freeze quota; NotFound if it is gone."""
        self.info = SnapshotInfo.from_json(self.client._t.call("POST", "/v1/snapshots/" + quote(self.name) + "/keep") or {})
        return self
