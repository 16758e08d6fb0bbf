"""The values sbx returns: what the API describes, with Python names."""

from __future__ import annotations

import base64
import datetime as _dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from .errors import Invalid

Duration = Union[int, float, str, _dt.timedelta]

_DURATION = re.compile(r"^([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$")


def shape_wire(delay: Optional[Duration], loss: Optional[float]) -> Optional[Dict[str, Any]]:
    """shape_wire is the API's netShape for a delay and a loss (None: neither given)."""
    if delay is None and loss is None:
        return None
    out: Dict[str, Any] = {}
    d = duration_wire(delay, "net_delay")
    if d is not None and d not in ("0", "0s", "0ms"):
        out["delay"] = d
    if loss is not None:
        if isinstance(loss, bool) or not isinstance(loss, (int, float)) or loss != loss or not 0 <= loss < 1:
            raise Invalid("net_loss: %r is not a probability from 0 up to (not including) 1" % (loss,))
        if loss:
            out["loss"] = float(loss)
    return out


def duration_wire(d: Optional[Duration], what: str) -> Optional[str]:
    """duration_wire turns seconds, a timedelta or a string ("90s", "2h", "3600") into the API's form.

    None stays None (not sent). A negative or unreadable duration is
    :class:`~sbx.Invalid`, naming ``what``; a string the client cannot read is
    refused here rather than sent.
    """
    if d is None:
        return None
    if isinstance(d, bool):
        raise Invalid("%s: %r is not a duration (give seconds, a timedelta, or a string like 90s or 2h)" % (what, d))
    if isinstance(d, _dt.timedelta):
        d = d.total_seconds()
    if isinstance(d, (int, float)):
        if d != d or d < 0 or d == float("inf"):
            raise Invalid("%s: %r is not a duration of zero or more seconds" % (what, d))
        if float(d).is_integer():
            return "%ds" % int(d)
        # a positive duration never rounds to 0, which means none
        return "%dms" % max(1, round(d * 1000))
    if isinstance(d, str):
        s = d.strip()
        try:
            v = float(s)
        except ValueError:
            if _DURATION.match(s):
                return s
            # api.ParseDuration's message, the value quoted as Go quotes it
            raise Invalid(
                "%s: %s is not a duration (use seconds, like 90, or a number with a unit, like 90s, 30m or 2h)" % (what, json.dumps(d))
            ) from None
        return duration_wire(v, what)
    raise Invalid("%s: %r is not a duration (give seconds, a timedelta, or a string like 90s or 2h)" % (what, d))


_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(d: Optional[Duration], what: str) -> Optional[float]:
    """duration_seconds is the duration in seconds, as duration_wire reads it (None stays None)."""
    w = duration_wire(d, what)
    if w is None:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, _, u in re.findall(r"([0-9]+(\.[0-9]*)?)(ns|us|µs|ms|s|m|h)", w))


def parse_time(s: Any) -> Optional[_dt.datetime]:
    """parse_time reads an RFC 3339 time as sbxd writes it (nanoseconds cut to microseconds)."""
    if not s or not isinstance(s, str):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", s)
    if not m:
        return None
    frac = (m.group(2) or ".0")[1:7].ljust(6, "0")
    tz = m.group(3)
    if tz == "Z":
        tz = "+00:00"
    try:
        return _dt.datetime.fromisoformat("%s.%s%s" % (m.group(1), frac, tz))
    except ValueError:
        return None


def b64(s: Any) -> bytes:
    """b64 decodes a base64 field (b"" for none)."""
    if not s:
        return b""
    return base64.b64decode(s)


@dataclass
class SandboxInfo:
    """SandboxInfo is a sandbox as sbxd describes it (``GET /v1/sandboxes/{id}``).

    ``state`` is one of creating, ready, stopping, stopped, error, lost.
    ``memory_restored`` and ``resume_reason`` say how it came back after a
    resume, a memory fork or a memory snapshot. ``raw`` is the JSON as it came.
    """

    id: str
    state: str
    template: str = ""
    name: str = ""
    reason: str = ""
    ttl: str = ""
    meta: Dict[str, str] = field(default_factory=dict)
    cpus: float = 0.0
    memory_bytes: int = 0
    address: str = ""
    parent: str = ""
    from_snapshot: str = ""
    memory_restored: bool = False
    resume_reason: str = ""
    persistent: bool = False
    network: str = ""
    net_delay: str = ""  # what leaves the sandbox is held this long ("100ms"), see Client.create
    net_loss: float = 0.0  # and dropped with this probability
    template_version: str = ""
    created_at: Optional[_dt.datetime] = None
    last_activity: Optional[_dt.datetime] = None
    reap_at: Optional[_dt.datetime] = None
    reap_reason: str = ""
    node: str = ""  # the fleet node that holds it ("" outside a fleet)
    agent: str = ""  # the in-sandbox agent build its processes run on
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxInfo":
        """from_json reads the API's form."""
        return cls(
            id=d.get("id", ""),
            state=d.get("state", ""),
            template=d.get("template", ""),
            name=d.get("name", ""),
            reason=d.get("reason", ""),
            ttl=d.get("ttl", ""),
            meta={k: v for k, v in (d.get("meta") or {}).items() if k != "sbx.create"},  # the client's own, see Client.create
            cpus=float(d.get("cpus") or 0),
            memory_bytes=int(d.get("memoryBytes") or 0),
            address=d.get("address", ""),
            parent=d.get("parent", ""),
            from_snapshot=d.get("from", ""),
            memory_restored=bool(d.get("memoryRestored")),
            resume_reason=d.get("resumeReason", ""),
            persistent=bool(d.get("persistent")),
            network=d.get("network", ""),
            net_delay=(d.get("netShape") or {}).get("delay", ""),
            net_loss=float((d.get("netShape") or {}).get("loss") or 0),
            template_version=d.get("templateVersion", ""),
            created_at=parse_time(d.get("createdAt")),
            last_activity=parse_time(d.get("lastActivity")),
            reap_at=parse_time(d.get("reapAt")),
            reap_reason=d.get("reapReason", ""),
            node=d.get("node", ""),
            agent=d.get("agent", ""),
            raw=d,
        )


@dataclass
class ResumeResult:
    """ResumeResult says how a stopped sandbox came back.

    ``memory_restored`` is True when its processes and memory were restored;
    otherwise it booted from its disk and ``reason`` says why.
    """

    memory_restored: bool
    reason: str
    info: SandboxInfo


@dataclass
class ExecInfo:
    """ExecInfo is one exec as sbxd has it: ``state`` running, exited or lost."""

    id: str
    sandbox_id: str
    cmd: List[str]
    state: str
    pid: int = 0
    exit_code: Optional[int] = None
    timed_out: bool = False
    detached: bool = False
    started_at: Optional[_dt.datetime] = None
    ended_at: Optional[_dt.datetime] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecInfo":
        """from_json reads the API's form."""
        return cls(
            id=d.get("id", ""),
            sandbox_id=d.get("sandboxId", ""),
            cmd=list(d.get("cmd") or []),
            state=d.get("state", ""),
            pid=int(d.get("pid") or 0),
            exit_code=d.get("exitCode"),
            timed_out=bool(d.get("timedOut")),
            detached=bool(d.get("detached")),
            started_at=parse_time(d.get("startedAt")),
            ended_at=parse_time(d.get("endedAt")),
        )


@dataclass
class Result:
    """Result is how an exec ended, with its output.

    ``exit_code`` is the command's (128+N for a death by signal N; 124 when
    the sandbox killed it at its timeout, with ``timed_out``); -1 if it has
    not ended. ``stdout`` and ``stderr`` are the output decoded as UTF-8 (bad
    bytes replaced); ``stdout_bytes`` and ``stderr_bytes`` are the bytes.
    """

    exit_code: int
    stdout: str
    stderr: str
    exec_id: str
    timed_out: bool = False
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)
    state: str = "exited"
    #: with ``on_crash``: the crash of the command or of a process it started, as the sandbox caught it
    crash: Optional["Crash"] = None
    #: with ``on_crash``: why the command's death by a core-dumping signal was not caught (the boot's one capture spent, naming on what)
    crash_missed: str = ""

    @property
    def ok(self) -> bool:
        """ok is True when the command exited 0."""
        return self.exit_code == 0


@dataclass
class Crash:
    """Crash is a crash a sandbox caught: process ``pid`` held at its faulting instruction in the freeze ``snapshot``.

    In a copy resumed from ``snapshot`` the process is still stopped there,
    its signal pending, for ``gdb -p``. ``count`` is how many crashes that
    boot had when it was caught (one is caught per boot). ``pgid`` and
    ``ancestors`` tell which exec it came from (:meth:`of`). All of it is
    the sandbox's word.
    """

    pid: int
    signal: str
    snapshot: str
    at: Optional[_dt.datetime] = None
    tid: int = 0
    exe: str = ""
    cmd: str = ""
    fault_addr: str = ""
    ip: str = ""
    count: int = 0
    pgid: int = 0
    ancestors: List[int] = field(default_factory=list)

    def of(self, pid: int) -> bool:
        """of is True when the crash was of process ``pid`` or of one it started (a child, a grandchild, its group)."""
        return pid > 0 and (self.pid == pid or self.pgid == pid or pid in self.ancestors)

    @classmethod
    def from_event(cls, ev: "Event") -> Optional["Crash"]:
        """from_event reads a crash from a ``frozen`` event whose freeze caught one (None for any other event)."""
        d = ev.detail
        c = d.get("crash")
        if ev.type != "frozen" or not isinstance(c, dict) or d.get("outcome") != "ok" or not d.get("name"):
            return None
        try:
            pid = int(d.get("pid") or 0)
        except (TypeError, ValueError):
            return None
        if pid <= 0:
            return None

        def num(v: Any) -> int:
            try:
                return int(v or 0)
            except (TypeError, ValueError):
                return 0

        raw = c.get("ancestors")
        anc: List[Any] = raw if isinstance(raw, list) else []
        return cls(pid=pid, signal=str(c.get("signal") or ""), snapshot=str(d.get("name")),
                   at=parse_time(d.get("failedAt")) or ev.time, tid=num(c.get("tid")), exe=str(c.get("exe") or ""),
                   cmd=str(d.get("cmd") or ""), fault_addr=str(c.get("faultAddr") or ""), ip=str(c.get("ip") or ""),
                   count=num(c.get("count")), pgid=num(c.get("pgid")), ancestors=[num(a) for a in anc])


@dataclass
class SnapshotInfo:
    """SnapshotInfo describes a named capture: always the disk, and memory when ``memory``."""

    name: str
    id: str
    sandbox_id: str
    template: str
    memory: bool
    size_bytes: int = 0
    paused: str = ""
    created_at: Optional[_dt.datetime] = None
    kept: bool = False
    node: str = ""  # the fleet node that holds it (through a fleet's controller only)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SnapshotInfo":
        """from_json reads the API's form."""
        return cls(
            name=d.get("name", ""),
            id=d.get("id", ""),
            sandbox_id=d.get("sandboxId", ""),
            template=d.get("template", ""),
            memory=bool(d.get("memory")),
            size_bytes=int(d.get("sizeBytes") or 0),
            paused=d.get("paused", ""),
            created_at=parse_time(d.get("createdAt")),
            kept=bool(d.get("kept")),
            node=d.get("node", ""),
        )


@dataclass
class FileInfo:
    """FileInfo describes one file inside a sandbox (the link itself for a symlink).

    A name that is not UTF-8 comes with U+FFFD in ``name`` and ``path``, and
    its bytes in ``raw`` (b"" for a UTF-8 name), so two such names are told
    apart; ``name_bytes`` is the name as it is. sbxd's file API takes only
    UTF-8 paths, so such a file can be listed but not addressed.
    """

    name: str
    path: str
    size: int
    mode: str
    is_dir: bool
    link: str = ""
    mod_time: Optional[_dt.datetime] = None
    raw: bytes = b""

    @property
    def name_bytes(self) -> bytes:
        """name_bytes is the file's name as it is."""
        return self.raw or self.name.encode("utf-8")

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileInfo":
        """from_json reads the API's form."""
        return cls(
            name=d.get("name", ""),
            path=d.get("path", ""),
            size=int(d.get("size") or 0),
            mode=d.get("mode", ""),
            is_dir=bool(d.get("isDir")),
            link=d.get("link", ""),
            mod_time=parse_time(d.get("modTime")),
            raw=b64(d.get("raw")),
        )


@dataclass
class LogEvent:
    """LogEvent is one chunk of a log stream: ``stream`` (console, events, runtime, exec/ID/...) and its bytes."""

    stream: str
    data: bytes
    time: Optional[_dt.datetime] = None


@dataclass
class Event:
    """Event is one lifecycle event of a sandbox (created, forked, snapshot, stopped, resumed, ...)."""

    seq: int
    sandbox_id: str
    type: str
    time: Optional[_dt.datetime] = None
    detail: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Event":
        """from_json reads the API's form."""
        return cls(
            seq=int(d.get("seq") or 0),
            sandbox_id=d.get("sandboxId", ""),
            type=d.get("type", ""),
            time=parse_time(d.get("time")),
            detail=dict(d.get("detail") or {}),
        )


@dataclass
class Port:
    """Port is a TCP port listening inside a sandbox."""

    port: int
    address: str = ""
    proto: str = "tcp"
    pid: int = 0
    command: str = ""


@dataclass
class Metrics:
    """Metrics are a sandbox's resource use now."""

    cpu_seconds: float
    memory_bytes: int
    processes: int
    disk_bytes: int


@dataclass
class TemplateInfo:
    """TemplateInfo describes a template: the version (content digest) its name points at."""

    name: str
    version: str
    size_bytes: int
    source: str
    created_at: Optional[_dt.datetime] = None
    default_user: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "TemplateInfo":
        """from_json reads the API's form."""
        return cls(
            name=d.get("name", ""),
            version=d.get("version", ""),
            size_bytes=int(d.get("sizeBytes") or 0),
            source=d.get("source", ""),
            created_at=parse_time(d.get("createdAt")),
            default_user=(d.get("defaults") or {}).get("user", ""),
        )
