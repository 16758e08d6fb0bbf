"""sbx: sandboxes that freeze, fork and replay a failing machine, from Python.

A :class:`Client` talks to one sbxd (``$SBX_HOST``, ``$SBX_TOKEN`` as the
``sbx`` command line reads them); the work goes through :class:`Sandbox`
handles::

    import sbx

    c = sbx.Client()
    with c.create(template="base", ttl="30m") as sb:
        r = sb.exec("python3 -c 'print(6*7)'")
        assert r.stdout == "42\\n"
        kids = sb.fork(count=4, memory=True)

Errors are exceptions by kind: :class:`NotFound`, :class:`Conflict`,
:class:`Invalid`, :class:`Forbidden`, :class:`Unavailable` (and
:class:`TooLarge`, :class:`Unauthorized`, :class:`Internal`), each with the
server's ``code`` and ``message``. The flaky-test workflows are
:meth:`Client.hunt`, :meth:`Client.flake_rate` and :meth:`Client.replay`;
the pytest plugin is ``pytest -p sbx.pytest_plugin``.
"""

from .client import MAX_FORKS, MAX_WAITS, Client, Files, Process, Sandbox, Snapshot, argv
from .errors import (
    Conflict,
    Forbidden,
    Internal,
    Invalid,
    NotFound,
    SbxError,
    StreamError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from .explain import Explained, Finding
from .flaky import HuntResult, RateResult, RateSummary, ReplayResult, ReplaySummary, Run, wilson
from .types import (
    Crash,
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
)

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Process", "Files", "Snapshot", "MAX_FORKS", "MAX_WAITS", "argv",
    "SbxError", "NotFound", "Conflict", "Invalid", "Forbidden", "Unavailable", "TooLarge",
    "Unauthorized", "Internal", "StreamError",
    "Result", "ExecInfo", "SandboxInfo", "ResumeResult", "SnapshotInfo", "FileInfo", "LogEvent",
    "Event", "Port", "Metrics", "TemplateInfo", "Crash",
    "Run", "HuntResult", "RateResult", "RateSummary", "ReplayResult", "ReplaySummary", "wilson",
    "Explained", "Finding",
]
