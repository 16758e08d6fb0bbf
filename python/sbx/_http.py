"""The transport: HTTP/1.1 to sbxd over its unix socket or TCP, and server-sent events.

Each call opens its own connection, so a Client is safe to share between
threads, and a stream that is abandoned closes only its own socket.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import Invalid, SbxError, StreamError, Unavailable, error_from_body, stream_error

DEFAULT_HOST = "unix:///run/sbx/sbxd.sock"

# bounds on what sbxd (and through it, a sandbox) can make the client hold
MAX_ERROR_BODY = 64 << 10
MAX_JSON_BODY = 64 << 20
MAX_SSE_LINE = 8 << 20

Query = Union[Mapping[str, Any], Sequence[Tuple[str, Any]], None]


class _ClientTimeout:
    """_ClientTimeout is the type of CLIENT_TIMEOUT."""


#: CLIENT_TIMEOUT, as send's ``idle``, is the client's own timeout.
CLIENT_TIMEOUT = _ClientTimeout()
Idle = Union[float, None, _ClientTimeout]


class _UnixConnection(http.client.HTTPConnection):
    """An HTTPConnection whose socket is a unix socket."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("sbxd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


#: MAX_INFORMATIONAL bounds the informational (1xx) answers one request may
#: get before its answer: more are not sbx's.
MAX_INFORMATIONAL = 64

InfoCallback = Callable[[int, http.client.HTTPMessage], None]


class _InfoResponse(http.client.HTTPResponse):
    """An HTTPResponse that reads past informational answers (102, 103...), telling on_info of each.

    http.client skips only a 100 Continue: any other 1xx it takes for the
    answer itself, so a fleet's 102 Processing (a resume saying why it waits)
    would end the request there.
    """

    def __init__(self, sock: socket.socket, *args: Any, on_info: Optional[InfoCallback] = None, **kw: Any) -> None:
        super().__init__(sock, *args, **kw)
        self._on_info = on_info
        self._infos = 0

    def _read_status(self):  # type: ignore[no-untyped-def]
        while True:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if not 100 < status < 200 or status == 101:
                return version, status, reason
            self._infos += 1
            if self._infos > MAX_INFORMATIONAL:
                raise http.client.HTTPException("more than %d informational answers: not sbx's" % MAX_INFORMATIONAL)
            headers = http.client.parse_headers(self.fp)
            if self._on_info is not None:
                self._on_info(status, headers)


class Response:
    """Response is a 2xx answer whose body is still to be read; close it when done."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, transport: "Transport") -> None:
        self._conn = conn
        self.raw = resp
        self.status = resp.status
        self._t = transport

    def read(self, n: int = -1) -> bytes:
        """read returns up to n bytes of the body (all of it for -1); Unavailable if the connection breaks."""
        try:
            return self.raw.read(n) if n >= 0 else self.raw.read()
        except (OSError, http.client.HTTPException) as e:
            lost = Unavailable("the connection to sbxd at %s broke before its answer: %s" % (self._t.host, e))
            lost.sent = True
            raise lost from e

    def read_limited(self, limit: int) -> bytes:
        """read_limited reads the whole body, refusing one longer than limit."""
        b = self.read(limit + 1)
        if len(b) > limit:
            raise SbxError("sbxd answered more than %d bytes" % limit)
        return b

    def json(self) -> Any:
        """json decodes the body (at most MAX_JSON_BODY bytes)."""
        b = self.read_limited(MAX_JSON_BODY)
        try:
            return json.loads(b.decode("utf-8")) if b else None
        except ValueError as e:
            raise SbxError("sbxd answered something that is not JSON: %s" % e) from e

    def close(self) -> None:
        """close drops the connection (and with it the stream, on the client's side only)."""
        try:
            self.raw.close()
        finally:
            self._conn.close()

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transport:
    """Transport sends requests to one sbxd."""

    def __init__(self, host: Optional[str] = None, token: Optional[str] = None, timeout: Optional[float] = 60.0) -> None:
        if not host:
            host = os.environ.get("SBX_HOST") or DEFAULT_HOST
        if token is None:
            token = os.environ.get("SBX_TOKEN") or None
        self.host = host
        self.token = token
        self.timeout = timeout
        scheme, sep, rest = host.partition("://")
        if not sep or not rest:
            raise Invalid("host %r: want unix:///path/to.sock or tcp://host:port" % host)
        self._https = False
        if scheme == "unix":
            self._unix: Optional[str] = rest
            self._netloc = ""
        elif scheme in ("tcp", "http", "https"):
            self._unix = None
            self._netloc = rest.rstrip("/")
            self._https = scheme == "https"
            if not self._netloc:
                raise Invalid("host %r: no address after %s://" % (host, scheme))
        else:
            raise Invalid("host %r: unknown scheme %r; want unix:// or tcp://" % (host, scheme))

    def slow_idle(self) -> Optional[float]:
        """slow_idle is how long a fork, build or import may be silent: the client's timeout, and at least 10 minutes."""
        return None if self.timeout is None else max(self.timeout, 600.0)

    def _connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._unix is not None:
            return _UnixConnection(self._unix, timeout)
        if self._https:
            return http.client.HTTPSConnection(self._netloc, timeout=timeout)
        return http.client.HTTPConnection(self._netloc, timeout=timeout)

    def send(
        self,
        method: str,
        path: str,
        query: Query = None,
        body: Any = None,
        json_body: Any = None,
        content_type: Optional[str] = None,
        accept: Optional[str] = None,
        length: Optional[int] = None,
        stream: bool = False,
        idle: Idle = CLIENT_TIMEOUT,
        extra_headers: Optional[Mapping[str, str]] = None,
        on_info: Optional[InfoCallback] = None,
    ) -> Response:
        """send performs one request and returns its 2xx answer, or raises the error it names.

        The connect and the request are bounded by the client's timeout. The
        reads of the answer (its headers included) may each wait ``idle``
        seconds: the client's timeout by default, None for no bound (a follow
        the caller bounds itself). ``body`` may be bytes or a file object of
        ``length`` bytes. A read that idles past it is Unavailable.
        ``extra_headers`` are sent besides the request's own; ``on_info`` hears each
        informational answer (status and headers) before the answer.
        """
        url = path
        if query:
            items = list(query.items()) if isinstance(query, Mapping) else list(query)
            url += "?" + urllib.parse.urlencode([(k, v) for k, v in items if v is not None])
        headers: Dict[str, str] = dict(extra_headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode("utf-8")
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        if accept:
            headers["Accept"] = accept
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        if body is None and method in ("POST", "PUT"):
            body = b""
        if isinstance(body, (bytes, bytearray)):
            headers["Content-Length"] = str(len(body))
        elif body is not None:
            if length is None:
                raise Invalid("%s %s: a streamed body needs its length" % (method, path))
            headers["Content-Length"] = str(length)
        conn = self._connection(self.timeout)
        conn.response_class = lambda sock, *a, **kw: _InfoResponse(sock, *a, on_info=on_info, **kw)  # type: ignore[assignment]
        sent = False
        try:
            try:
                conn.connect()
            except OSError as e:
                raise Unavailable("cannot reach sbxd at %s: %s" % (self.host, e)) from e
            sent = True
            conn.request(method, url, body=body, headers=headers)
            if not isinstance(idle, _ClientTimeout) and conn.sock is not None:
                # the answer of an exec or a follow starts with its first event, however long that takes
                conn.sock.settimeout(idle)
            resp = conn.getresponse()
        except SbxError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            if not sent:
                raise Unavailable("cannot reach sbxd at %s: %s" % (self.host, e)) from e
            lost = Unavailable("the connection to sbxd at %s broke before its answer: %s" % (self.host, e))
            lost.sent = True  # the request may have been acted on
            raise lost from e
        if resp.status // 100 == 3:
            conn.close()
            raise SbxError("%s %s: sbxd answered %d %s (to %s): the path is not one of the API's"
                           % (method, path, resp.status, resp.reason, resp.getheader("Location", "")), status=resp.status)
        if resp.status // 100 != 2:
            try:
                data = resp.read(MAX_ERROR_BODY)
            except (OSError, http.client.HTTPException):
                data = b""
            conn.close()
            raise error_from_body(resp.status, resp.reason, data)
        return Response(conn, resp, self)

    def call(self, method: str, path: str, query: Query = None, json_body: Any = None,
             extra_headers: Optional[Mapping[str, str]] = None, on_info: Optional[InfoCallback] = None) -> Any:
        """call sends a request with a JSON body (if any) and returns the decoded JSON answer (None if empty)."""
        with self.send(method, path, query=query, json_body=json_body, extra_headers=extra_headers, on_info=on_info) as r:
            return r.json()


class SSE:
    """SSE reads the server-sent events of a Response: ``(name, data)`` with data decoded from JSON.

    An ``error`` event is raised as the exception its code names. A stream that
    ends without its last event makes :meth:`events` stop; ``broken`` then says
    why (the read error), and ``ended`` that the end came without a final event.
    """

    def __init__(self, resp: Response) -> None:
        self.resp = resp
        self.broken = ""

    def _lines(self) -> Iterator[bytes]:
        raw = self.resp.raw
        while True:
            try:
                line = raw.readline(MAX_SSE_LINE + 1)
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.broken = str(e) or type(e).__name__
                return
            if not line:
                return
            if len(line) > MAX_SSE_LINE:
                self.broken = "an event line longer than %d bytes" % MAX_SSE_LINE
                return
            yield line.rstrip(b"\r\n")

    def events(self) -> Iterator[Tuple[str, Any]]:
        """events yields each complete event; an event cut off by the end is dropped."""
        name, data, seen = "", [], False  # type: str, List[bytes], bool
        for line in self._lines():
            if not line:
                if not seen:
                    continue
                payload = b"\n".join(data)
                try:
                    doc = json.loads(payload.decode("utf-8")) if payload else {}
                except ValueError as e:
                    raise SbxError("decode %r event: %s" % (name, e)) from e
                if name == "error":
                    raise stream_error(*error_event(doc))
                yield name, doc
                name, data, seen = "", [], False
                continue
            if line.startswith(b":"):
                continue
            field, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if field == b"event":
                name, seen = value.decode("utf-8", "replace"), True
            elif field == b"data":
                data.append(value)
                seen = True

    def close(self) -> None:
        """close drops the stream's connection."""
        self.resp.close()


def error_event(doc: Any) -> Tuple[str, str]:
    """error_event is the code and message of an ``error`` event's data: the one
    error envelope, ``{"error": {"code": ..., "message": ...}}`` (alone or in the
    stream's frame), or the flat ``{"error": MESSAGE, "code": CODE}`` of an sbxd
    older than it."""
    doc = doc if isinstance(doc, dict) else {}
    err = doc.get("error")
    if isinstance(err, dict):
        return str(err.get("code") or ""), str(err.get("message") or "")
    return str(doc.get("code") or ""), str(err or "")


def broken_stream(op: str, sandbox_id: str, sse: SSE, **kw: Any) -> StreamError:
    """broken_stream is the StreamError of a stream that ended before its last event."""
    return StreamError(op, sandbox_id, cause=sse.broken or "the stream ended early", **kw)


def quote(s: str) -> str:
    """quote escapes one path segment; Invalid for "", "." and "..", which no escape keeps from being a different route."""
    if s in ("", ".", ".."):
        raise Invalid("%r cannot name anything in a path of the API" % s)
    return urllib.parse.quote(s, safe="")
