"""The exceptions of sbx: one class per kind of error the server reports.

Every error sbxd answers is ``{"error": {"code": ..., "message": ...}}``; the
code picks the class (``not_found`` is :class:`NotFound`, and so on), and the
exception carries the server's ``code``, ``message`` and HTTP ``status``.
A connection that cannot be made or that breaks is :class:`Unavailable`; a
stream that breaks before its end is :class:`StreamError`, which is an
:class:`Unavailable` naming what goes on without it.
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Type

__all__ = [
    "SbxError",
    "NotFound",
    "Conflict",
    "Invalid",
    "Forbidden",
    "Unavailable",
    "TooLarge",
    "Unauthorized",
    "Internal",
    "StreamError",
    "error_from_body",
]


class SbxError(Exception):
    """SbxError is the base of every error sbx raises.

    ``code`` is the server's wire code (``"not_found"``, ...), ``message``
    what it said, ``status`` the HTTP status (0 when no answer came).
    """

    code = "internal"

    def __init__(self, message: str, code: Optional[str] = None, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status

    def __str__(self) -> str:
        return self.message


class NotFound(SbxError):
    """NotFound: no such sandbox, exec, snapshot, template or file (404)."""

    code = "not_found"


class Conflict(SbxError):
    """Conflict: the object is in the wrong state for the call, or a name is taken (409)."""

    code = "conflict"


class Invalid(SbxError):
    """Invalid: a bad argument, such as a duration or name the server cannot read (400)."""

    code = "invalid"


class Forbidden(SbxError):
    """Forbidden: refused by the daemon's policy, e.g. persistence under a lifetime cap (403)."""

    code = "forbidden"


class Unavailable(SbxError):
    """Unavailable: sbxd cannot be reached, is shutting down, or the connection broke (503).

    ``sent`` says the request had gone out when the connection broke, so sbxd may have acted on it.
    """

    code = "unavailable"
    sent = False


class TooLarge(SbxError):
    """TooLarge: a request or an answer is past a limit (413), e.g. exec's ``max_output``."""

    code = "too_large"


class Unauthorized(SbxError):
    """Unauthorized: the TCP listener wants a valid bearer token (401); set ``SBX_TOKEN``."""

    code = "unauthorized"


class Internal(SbxError):
    """Internal: sbxd failed in a way that is not the caller's (500)."""

    code = "internal"


class StreamError(Unavailable):
    """StreamError: a stream from sbxd broke before its end.

    What the stream watched goes on without it, and the error names it:
    ``exec_id`` the exec (its command runs on; wait for it again with
    ``sandbox.process(exec_id).wait()``), ``children`` the sandboxes a fork
    had announced, ``last_seq`` the last event a follow of events handed over.
    """

    def __init__(
        self,
        op: str,
        sandbox_id: str = "",
        cause: str = "",
        exec_id: str = "",
        children: Optional[List[str]] = None,
        last_seq: int = 0,
    ) -> None:
        self.op = op
        self.sandbox_id = sandbox_id
        self.exec_id = exec_id
        self.children = list(children or [])
        self.last_seq = last_seq
        self.cause = cause
        what = op + (" of " + sandbox_id if sandbox_id else "")
        goes_on = ""
        if exec_id:
            what = "%s %s in %s" % (op, exec_id, sandbox_id)
            goes_on = "; exec %s goes on in the sandbox" % exec_id
        elif self.children:
            goes_on = "; the fork goes on (children %s)" % ", ".join(self.children)
        elif last_seq:
            goes_on = "; the last event seen was %d" % last_seq
        super().__init__(
            "%s: the stream from sbxd broke before its end%s: %s" % (what, goes_on, cause or "unexpected end"),
            status=0,
        )


_BY_CODE: Dict[str, Type[SbxError]] = {
    c.code: c for c in (NotFound, Conflict, Invalid, Forbidden, Unavailable, TooLarge, Unauthorized, Internal)
}
_BY_STATUS: Dict[int, Type[SbxError]] = {
    404: NotFound,
    409: Conflict,
    400: Invalid,
    403: Forbidden,
    503: Unavailable,
    413: TooLarge,
    401: Unauthorized,
    500: Internal,
}


def error_class(code: str, status: int = 0) -> Type[SbxError]:
    """error_class returns the exception class of a wire code (or, failing that, an HTTP status)."""
    if code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 400 <= status < 500:
        return Invalid
    return Internal


def error_from_body(status: int, reason: str, body: bytes) -> SbxError:
    """error_from_body turns a non-2xx answer into the exception its code names.

    A body that is not ``{"error": {...}}`` gets the class its status stands for
    and a message quoting the start of the body.
    """
    code, message = "", ""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            code = str(doc["error"].get("code") or "")
            message = str(doc["error"].get("message") or "")
    except ValueError:
        pass
    cls = error_class(code, status)
    if not code:
        code = cls.code
    if not message:
        text = body.decode("utf-8", "replace").strip()
        if len(text) > 200:
            text = text[:200] + "..."
        message = "sbxd answered %d %s" % (status, reason) + (": " + text if text else "")
    return cls(message, code=code, status=status)


def stream_error(code: str, message: str) -> SbxError:
    """stream_error is the exception an ``error`` event of a stream carries."""
    if not message:
        message = "the server reported an error without a message"
    cls = error_class(code)
    return cls(message, code=code or cls.code)
