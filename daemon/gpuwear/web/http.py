"""HTTP/1.1 framing of the front door: a request read within its limits (RFC 9112; anything else refused with
the status that says why, never a traceback), and the head of a response."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from gpuwear.web.timeouts import timeout_at

MAX_LINE = 8192  # request line or one header line, bytes
MAX_HEAD = 32768  # all header lines together
MAX_BODY = 65536  # a GET with a body (allowed, read and ignored)

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 501: "Not Implemented", 503: "Service Unavailable",
            505: "HTTP Version Not Supported"}


class RefusedError(Exception):
    """A request answered with an error status, then the connection closed."""

    def __init__(self, status: int) -> None:
        self.status = status


@dataclass
class Request:
    """One request as read: its method, path (no query), HTTP version and headers (names lowercase)."""

    method: str
    path: str
    version: str
    headers: dict[str, str]


async def read_request(reader: asyncio.StreamReader, deadline: float, first: bytes) -> Request | None:
    """The next request, or None when the client closed before sending one. Raises RefusedError on a
    request that breaks the limits or HTTP, TimeoutError past the deadline."""
    async with timeout_at(deadline):
        try:
            line = first + await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise RefusedError(414) from None
        except asyncio.IncompleteReadError as exc:
            if first or exc.partial:
                raise
            return None
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3:
            raise RefusedError(400)
        method, target, version = parts
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise RefusedError(505 if version.startswith("HTTP/") else 400)
        headers: dict[str, str] = {}
        size = 0
        while True:
            try:
                raw = await reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError:
                raise RefusedError(431) from None
            size += len(raw)
            if size > MAX_HEAD:
                raise RefusedError(431)
            if raw == b"\r\n":
                break
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep or not name or name != name.strip() or " " in name:
                raise RefusedError(400)
            key = name.lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        if "transfer-encoding" in headers:
            raise RefusedError(501)
        length = headers.get("content-length", "0")
        if not (length.isascii() and length.isdigit()):  # 1*DIGIT (RFC 9110): "²" passes str.isdigit alone
            raise RefusedError(400)
        if len(length.lstrip("0")) > len(str(MAX_BODY)):  # never int() of 5,000 digits
            raise RefusedError(413)
        body = int(length)
        if body > MAX_BODY:
            raise RefusedError(413)
        if body:
            await reader.readexactly(body)
    if target.lower().startswith(("http://", "https://")):  # absolute-form, which a server must accept (RFC 9112)
        target = "/" + target.split("://", 1)[1].partition("/")[2]
    return Request(method, target.split("?", 1)[0], version, headers)


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(seconds: float | None = None) -> str:
    """An HTTP date (RFC 9110's IMF-fixdate, "Sun, 06 Nov 1994 08:49:37 GMT") of Unix ``seconds`` (now by default),
    in English whatever the locale: email.utils.formatdate(usegmt=True)'s answer (tested), without the email
    package (about 0.5 MiB resident)."""
    t = time.gmtime(seconds)
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT")


def response_head(status: int, headers: list[tuple[str, str]], length: int, close: bool) -> bytes:
    """A response's status line and headers (Date, Content-Length, then ``headers``; Connection: close when the
    connection ends after it), with the blank line that ends them."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"Date: {http_date()}",
             f"Content-Length: {length}", *(f"{k}: {v}" for k, v in headers)]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
_ESCAPINGS = ("allow-utf-8", "underscores", "dots", "values")


def content_type(accept: str) -> str:
    """The exposition format an ``Accept`` header asks for, as its Content-Type: what prometheus_client's
    ``choose_encoder`` (0.26) answers, without loading it, for the two formats the daemon writes (OpenMetrics 1.0.0
    and the text format, whose 0.0.4 body is also a valid 1.0.0 one: gpuwear's names need no escaping). The first
    listed type that is either, in the header's order (q ignored, as there); ``version=1.0.0`` echoed with its
    ``escaping`` (underscores unless one of the four schemes is named); a version the daemon does not write passed
    over, where prometheus_client would claim it; anything else text 0.0.4."""
    for accepted in (accept or "").split(","):
        kind, *params = accepted.split(";")
        kind = kind.strip()
        if kind not in ("application/openmetrics-text", "text/plain"):
            continue
        pairs = [p.strip().split("=", 1) for p in params if "=" in p]
        version = next((value for key, value in pairs if key == "version"), "")
        escaping = next((value for key, value in pairs if key == "escaping"), "")
        escaping = escaping if escaping in _ESCAPINGS else "underscores"
        if kind == "application/openmetrics-text" and not version:
            return OPENMETRICS
        if version == "1.0.0":
            return f"{OPENMETRICS if kind != 'text/plain' else 'text/plain; version=1.0.0; charset=utf-8'}; " \
                   f"escaping={escaping}"
    return TEXT


def accepts_gzip(header: str) -> bool:
    """Whether ``Accept-Encoding`` allows gzip (``gzip`` or ``*``, without ``q=0``)."""
    for item in header.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "x-gzip", "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False
