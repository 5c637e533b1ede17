"""The front door: /metrics, /, /healthz and /livez over HTTP or HTTPS, with basic auth.

One asyncio loop on one thread serves every connection, so an idle or slow client costs a socket,
never a thread. No client can hold it:

- a whole request (TLS handshake, request line, headers, body) must arrive within 10 s, however
  slowly it trickles; a kept-alive connection waits 90 s for its next request (:class:`Limits`);
- at 256 connections, a new connection evicts the longest-waiting connection of the client address
  that holds the most: a flood from one address evicts its own connections, never a scraper's;
- rendering /metrics and bcrypt run on worker threads, one each; bcrypt checks are bounded (a few a
  second, one at a time) and verified credentials are remembered, so brute force cannot starve scrapes;
- unknown users cost the same bcrypt check as wrong passwords (no user enumeration by timing).

The web config (:mod:`gpuwear.webconfig`) is swapped whole by :meth:`FrontDoor.configure` (SIGHUP);
certificates rotated on disk are picked up at the next connection, as exporter-toolkit does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import hashlib
import hmac
import logging
import os
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

from prometheus_client.exposition import choose_encoder

from gpuwear.collector import Exposition
from gpuwear.webconfig import TlsSettings, WebConfig

log = logging.getLogger(__name__)

MAX_LINE = 8192  # request line or one header line, bytes
MAX_HEAD = 32768  # all header lines together
MAX_BODY = 65536  # a GET with a body (allowed, read and ignored)
BACKLOG = 1024  # connections the kernel queues before they are accepted (capped by net.core.somaxconn)
REMEMBERED = 100  # verified credentials kept (as keyed digests)
TLS_RECHECK_SECONDS = 1.0  # certificate files are looked at no more often than this


@dataclass(frozen=True)
class Limits:
    """What one client may take. The defaults are the daemon's; tests shrink them."""

    request_seconds: float = 10.0  # TLS handshake + request line + headers + body, however slowly they come
    idle_seconds: float = 90.0  # between requests on a kept-alive connection (longer than a 1 m scrape interval)
    write_seconds: float = 10.0  # for the client to take a response
    max_connections: int = 256  # open at once; each is a socket and a few KiB, never a thread
    bcrypt_per_second: float = 5.0  # new credentials checked at most this often, with a burst of bcrypt_burst
    bcrypt_burst: int = 10
    bcrypt_waiting: int = 4  # checks queued behind the one running; more are answered 429 at once


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 501: "Not Implemented", 503: "Service Unavailable",
            505: "HTTP Version Not Supported"}
_LANDING = (b"<!doctype html><html><head><meta charset=\"utf-8\"><title>gpuwear</title></head><body>"
            b"<h1>gpuwear</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n")


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class BasicAuth:
    """The users of one web config. A credential that passed bcrypt once is remembered (a keyed digest,
    never the password) so that scrapes stay fast, as exporter-toolkit's cache does."""

    def __init__(self, users: dict[str, bytes] | None) -> None:
        self.users = dict(users or {})
        self._key = os.urandom(32)
        self._remembered: OrderedDict[bytes, None] = OrderedDict()
        costs = [h[4:6] for h in self.users.values()]
        # unknown users are checked against a real hash of the most common cost: the same work as a wrong password
        self._dummy = max(self.users.values(), key=lambda h: (costs.count(h[4:6]), h[4:6]), default=b"")

    def _digest(self, user: str, password: bytes) -> bytes:
        return hmac.new(self._key, user.encode() + b"\0" + password, hashlib.sha256).digest()

    def remembered(self, user: str, password: bytes) -> bool:
        """Whether this credential passed before (cheap)."""
        digest = self._digest(user, password)
        if digest in self._remembered:
            self._remembered.move_to_end(digest)
            return True
        return False

    def verify(self, user: str, password: bytes) -> bool:
        """bcrypt, on a worker thread (tens of milliseconds at cost 10). bcrypt reads 72 bytes at most:
        a longer password is refused, after the same work."""
        import bcrypt  # only where basic auth is configured

        hashed = self.users.get(user)
        ok = bcrypt.checkpw(password[:72], hashed if hashed is not None else self._dummy)
        if not (ok and hashed is not None and len(password) <= 72):
            return False
        self._remembered[self._digest(user, password)] = None
        while len(self._remembered) > REMEMBERED:
            self._remembered.popitem(last=False)
        return True


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from an ``Authorization: Basic`` header; None when absent or malformed."""
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).partition(b":")
        return (user.decode(), password) if sep else None
    except (binascii.Error, UnicodeDecodeError):
        return None


class TlsContexts:
    """The TLS context for new connections, rebuilt when the certificate, key or CA files change on disk
    (looked at once a second at most); a broken new file is logged once and the last good context kept."""

    def __init__(self, settings: TlsSettings) -> None:
        self.settings = settings
        self._stamp = self._stat()
        self._context = settings.context()
        self._checked = time.monotonic()
        self._refused: object = None

    def _stat(self) -> tuple[tuple[int, int, int] | None, ...]:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self.settings.files():
            try:
                st = os.stat(path)
                stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                stamps.append(None)
        return tuple(stamps)

    def current(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < TLS_RECHECK_SECONDS:
            return self._context
        self._checked = now
        stamp = self._stat()
        if stamp != self._stamp and stamp != self._refused:
            try:
                self._context = self.settings.context()
                self._stamp = stamp
                log.info("TLS: certificate files changed on disk; new connections use them")
            except (OSError, ssl.SSLError, ValueError) as exc:
                self._refused = stamp  # said once per change
                log.warning("TLS: certificate files changed on disk but cannot be used (%s); keeping the "
                            "previous certificate", exc)
        return self._context


@dataclass
class _Door:
    """Everything one web config decides, swapped whole on reload."""

    web: WebConfig
    auth: BasicAuth
    tls: TlsContexts | None
    limiter: TokenBucket | None


class _RefusedError(Exception):
    """A request answered with an error status, then the connection closed."""

    def __init__(self, status: int) -> None:
        self.status = status


class _Stream(asyncio.Protocol):
    """One connection: bytes in through an asyncio.StreamReader, bytes out through the transport; with TLS,
    through an ``ssl.SSLObject`` over memory buffers. (asyncio's own TLS layer keeps a 256 KiB buffer per
    connection from the moment it starts, which made 300 silent connections cost 90 MiB, and its
    StreamWriter.start_tls breaks when the client leaves as the handshake ends.)"""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        self.reader = asyncio.StreamReader(limit=MAX_LINE)
        self.transport: asyncio.Transport | None = None
        self.address = ""  # the client's IP address
        self.peer: object = None
        self.waiting_since = 0.0  # loop time; the connection waits for a request while not busy
        self.busy = False
        self.task: asyncio.Task[None] | None = None
        self._tls: ssl.SSLObject | None = None
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._handshake: asyncio.Future[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets TCP_NODELAY only on sockets made with proto=IPPROTO_TCP, which create_server's are
            # not: without it, a TLS answer's second record waited 40 ms for the client's delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=0)  # pause_writing until all is with the kernel: send() waits
        self.reader.set_transport(transport)  # flow control: reading pauses while the buffer is full
        self.peer = transport.get_extra_info("peername")
        self.address = str(self.peer[0]) if isinstance(self.peer, tuple) else ""
        self.door._accepted(self)

    def data_received(self, data: bytes) -> None:
        if self._tls is None:
            self.reader.feed_data(data)
        else:
            self._incoming.write(data)
            self._pump()

    def eof_received(self) -> bool:
        if self._tls is not None:
            self._incoming.write_eof()
            self._pump()
        self.reader.feed_eof()
        return True  # stay open to answer a client that half-closed

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is None:
            self.reader.feed_eof()
        else:
            self.reader.set_exception(exc)
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(ConnectionResetError("the client left during the TLS handshake"))
        self._writable.set()
        self.door._gone(self)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _pump(self) -> None:
        """Run TLS on what came in: the handshake, then records decrypted into the reader; send what TLS wrote."""
        assert self._tls is not None and self._handshake is not None
        try:
            if not self._handshake.done():
                try:
                    self._tls.do_handshake()
                    self._handshake.set_result(None)
                except ssl.SSLWantReadError:
                    pass
            if self._handshake.done():
                while True:
                    try:
                        chunk = self._tls.read(65536)
                    except ssl.SSLWantReadError:
                        break
                    if not chunk:  # close_notify
                        self.reader.feed_eof()
                        break
                    self.reader.feed_data(chunk)
        except (ssl.SSLError, OSError) as exc:
            if not self._handshake.done():
                self._handshake.set_exception(exc)
            else:
                self.reader.set_exception(exc)
        self._flush()

    def _flush(self) -> None:
        data = self._outgoing.read()
        if data and self.transport is not None and not self._lost:
            self.transport.write(data)

    def begin_tls(self, context: ssl.SSLContext, loop: asyncio.AbstractEventLoop) -> None:
        """Be a TLS server on this connection, from its first byte (call before any data arrives)."""
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._handshake = loop.create_future()

    async def handshake(self) -> None:
        """Returns once the TLS handshake is done; raises if it failed or the client left."""
        assert self._handshake is not None
        await self._handshake

    def peer_certificate(self) -> dict[str, Any] | None:
        return self._tls.getpeercert() if self._tls is not None else None

    async def send(self, data: bytes) -> None:
        """Write, and wait until all of it is with the kernel."""
        assert self.transport is not None
        if self._lost:
            raise ConnectionResetError("the client left")
        if self._tls is not None:
            self._tls.write(data)  # into the memory buffer: always all of it
            self._flush()
        else:
            self.transport.write(data)
        await self._writable.wait()
        if self._lost:
            raise ConnectionResetError("the client left before taking the answer")

    async def linger(self, seconds: float = 1.0, limit: int = 1 << 20) -> None:
        """After an error answer to a request not read to its end: say we are done writing, then read and
        drop what the client still sends for a moment, so that closing is not a reset that destroys the
        answer in flight (a lingering close, as Apache and nginx do)."""
        assert self.transport is not None
        if self._tls is None and self.transport.can_write_eof():
            self.transport.write_eof()
        dropped = 0
        with contextlib.suppress(TimeoutError, ConnectionError, OSError, ssl.SSLError):
            async with asyncio.timeout(seconds):
                while dropped < limit:
                    chunk = await self.reader.read(65536)
                    if not chunk:
                        return
                    dropped += len(chunk)

    def close(self) -> None:
        """After a complete answer: what was written goes out (with TLS, then close_notify), then the
        connection closes."""
        if self._tls is not None and self._handshake is not None and self._handshake.done() and not self._lost:
            with contextlib.suppress(ssl.SSLError, ValueError):
                self._tls.unwrap()
            self._flush()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def release(self) -> None:
        """Once the connection is served: drop OpenSSL's state for it (tens of KiB) and the references that make
        a cycle with its task (the task's frames hold the stream; a failed handshake's exception holds them), so
        that reference counting frees it now. Left to the cyclic collector, which the daemon runs rarely, 270
        connections' worth were waiting after a churn of aborted handshakes, and RSS grew 18 MiB per 10,000."""
        self._tls = None
        self._handshake = None
        self.task = None


@dataclass
class _Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]


class FrontDoor:
    """Serves until :meth:`close`; binds at construction (an OSError then names a port in use)."""

    def __init__(self, address: tuple[str, int], exposition: Exposition, web: WebConfig,
                 health: Callable[[], str | None], alive: Callable[[], str | None],
                 limits: Limits | None = None, page: Callable[[], bytes] | None = None) -> None:
        self.exposition = exposition
        self.page = page  # the HTML of / (rendered on a thread of its own), else a link to /metrics
        self.limits = limits = limits or Limits()
        self.health = health  # None when healthy, else what is wrong
        self.alive = alive  # the same for the sampling loop alone (a restart can cure it)
        self._door = self._make_door(web)
        host, port = address
        if host == "":  # every interface, IPv4 and IPv6, as Go's ":PORT"
            dual = socket.has_dualstack_ipv6()
            self._socket = socket.create_server(("", port), family=socket.AF_INET6 if dual else socket.AF_INET,
                                                backlog=BACKLOG, dualstack_ipv6=dual)
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._socket = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self._socket.setblocking(False)
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._loop_exception)
        self._render = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="http-render")
        # the page reads the ledger (seconds on a ledger years old): never on the thread /metrics waits for
        self._page = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="http-page")
        self._bcrypt = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="http-bcrypt")
        self._bcrypt_bucket = TokenBucket(limits.bcrypt_per_second, limits.bcrypt_burst)
        self._bcrypt_waiting = 0
        self._connections: dict[_Stream, None] = {}  # in order of arrival
        self._stop = asyncio.Event()  # bound to the loop at its first use, on the loop's thread
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)
        self.evicted = 0  # connections closed to make room (for tests and the bench)

    @staticmethod
    def _make_door(web: WebConfig) -> _Door:
        limiter = TokenBucket(1.0 / web.rate_limit[0], web.rate_limit[1]) if web.rate_limit else None
        return _Door(web, BasicAuth(dict(web.users)), TlsContexts(web.tls) if web.tls else None, limiter)

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def web(self) -> WebConfig:
        return self._door.web

    def configure(self, web: WebConfig) -> None:
        """Use a new web config for every request from now on (remembered credentials are forgotten);
        raises OSError or ssl.SSLError, keeping the old one, if its certificates cannot be loaded."""
        self._door = self._make_door(web)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop accepting, drop every connection, end the thread; returns within about a second."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=1.5)
        else:  # never started: the loop did not take the socket
            self._socket.close()
        self._render.shutdown(wait=False, cancel_futures=True)
        self._page.shutdown(wait=False, cancel_futures=True)
        self._bcrypt.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.get_running_loop().create_server(lambda: _Stream(self), sock=self._socket,
                                                                backlog=BACKLOG)
        async with server:
            await self._stop.wait()
            server.close()
            tasks = [c.task for c in self._connections if c.task is not None]
            for stream in list(self._connections):
                stream.abort()
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=0.5)
                for task in pending:  # waiting on a worker thread (a render, a bcrypt check)
                    task.cancel()
                if pending:  # let them end, so that closing the loop destroys no pending task
                    await asyncio.wait(pending, timeout=0.2)

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        level = logging.DEBUG if exc is None or isinstance(exc, OSError) else logging.WARNING
        log.log(level, "http: %s: %r", context.get("message"), exc)

    def _accepted(self, stream: _Stream) -> None:
        """A new connection (from the protocol): make room for it, then serve it on a task of its own."""
        stream.waiting_since = self._loop.time()
        if not self._admit(stream):
            if self._door.tls is None and stream.transport is not None:  # never blocks: the transport buffers it
                stream.transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                       b"Connection: close\r\n\r\n")
                stream.close()
            else:
                stream.abort()
            return
        door = self._door
        if door.tls is not None:
            stream.begin_tls(door.tls.current(), self._loop)
        stream.task = self._loop.create_task(self._serve(stream, door))

    def _gone(self, stream: _Stream) -> None:
        self._connections.pop(stream, None)

    def _admit(self, stream: _Stream) -> bool:
        """Room for a new connection. At the limit, the client address holding the most connections that
        wait for a request loses its longest-waiting one: a flood from one address (silent, trickling or
        reconnecting as fast as it can) only ever evicts its own connections, never a scraper's. False when
        no connection waits (all are being answered): the new one is refused."""
        if len(self._connections) >= self.limits.max_connections:
            by_address: dict[str, list[_Stream]] = {}
            for c in self._connections:  # in order of arrival
                if not c.busy:
                    by_address.setdefault(c.address, []).append(c)
            if not by_address:
                return False
            heaviest = max(by_address.values(), key=len)
            oldest = min(heaviest, key=lambda c: c.waiting_since)
            del self._connections[oldest]
            oldest.abort()
            self.evicted += 1
        self._connections[stream] = None
        return True

    async def _serve(self, stream: _Stream, door: _Door) -> None:
        loop = asyncio.get_running_loop()
        graceful = False  # a complete answer: closed after what was written, else aborted
        try:
            deadline = loop.time() + self.limits.request_seconds
            if door.tls is not None:
                async with asyncio.timeout_at(deadline):
                    await stream.handshake()
                if not door.tls.settings.allows_peer(stream.peer_certificate()):
                    log.debug("http: %s: client certificate without an allowed SAN", stream.peer)
                    return
            first = b""
            while True:
                try:
                    request = await self._read_request(stream.reader, deadline, first)
                except _RefusedError as refused:
                    stream.busy = True
                    await self._send(stream, refused.status, [], b"", False, True)
                    await stream.linger()
                    graceful = True
                    return
                if request is None:
                    graceful = True
                    return
                stream.busy = True
                close = await self._answer(request, stream)
                if close:
                    graceful = True
                    return
                stream.busy = False
                stream.waiting_since = loop.time()
                async with asyncio.timeout(self.limits.idle_seconds):  # the next request's first byte
                    first = await stream.reader.read(1)
                if not first:
                    graceful = True
                    return
                deadline = loop.time() + self.limits.request_seconds
        except (TimeoutError, ConnectionError, ssl.SSLError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("http: %s: %s %s", stream.peer, type(exc).__name__, exc)
        except asyncio.CancelledError:  # only at shutdown
            pass
        except Exception:  # a bug here must not end the listener
            log.exception("http: %s: error while serving", stream.peer)
        finally:
            self._connections.pop(stream, None)
            if graceful:
                stream.close()
            else:
                stream.abort()
            stream.release()

    async def _read_request(self, reader: asyncio.StreamReader, deadline: float, first: bytes) -> _Request | None:
        """The next request, or None when the client closed before sending one. Raises _RefusedError on a
        request that breaks the limits or HTTP, TimeoutError past the deadline."""
        async with asyncio.timeout_at(deadline):
            try:
                line = first + await reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError:
                raise _RefusedError(414) from None
            except asyncio.IncompleteReadError as exc:
                if first or exc.partial:
                    raise
                return None
            parts = line.decode("latin-1").rstrip("\r\n").split(" ")
            if len(parts) != 3:
                raise _RefusedError(400)
            method, target, version = parts
            if version not in ("HTTP/1.0", "HTTP/1.1"):
                raise _RefusedError(505 if version.startswith("HTTP/") else 400)
            headers: dict[str, str] = {}
            size = 0
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n")
                except asyncio.LimitOverrunError:
                    raise _RefusedError(431) from None
                size += len(raw)
                if size > MAX_HEAD:
                    raise _RefusedError(431)
                if raw == b"\r\n":
                    break
                name, sep, value = raw.decode("latin-1").partition(":")
                if not sep or not name or name != name.strip() or " " in name:
                    raise _RefusedError(400)
                key = name.lower()
                headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
            if "transfer-encoding" in headers:
                raise _RefusedError(501)
            length = headers.get("content-length", "0")
            if not (length.isascii() and length.isdigit()):  # 1*DIGIT (RFC 9110): "²" passes str.isdigit alone
                raise _RefusedError(400)
            if len(length.lstrip("0")) > len(str(MAX_BODY)):  # never int() of 5,000 digits
                raise _RefusedError(413)
            body = int(length)
            if body > MAX_BODY:
                raise _RefusedError(413)
            if body:
                await reader.readexactly(body)
        if target.lower().startswith(("http://", "https://")):  # absolute-form, which a server must accept (RFC 9112)
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        return _Request(method, target.split("?", 1)[0], version, headers)

    async def _answer(self, request: _Request, stream: _Stream) -> bool:
        """Answer one request; True when the connection is to be closed after it."""
        door = self._door
        connection = request.headers.get("connection", "").lower()
        close = "close" in connection or (request.version == "HTTP/1.0" and "keep-alive" not in connection)
        head = request.method == "HEAD"
        status, headers, body = await self._route(request, door)
        headers += list(door.web.headers)
        await self._send(stream, status, headers, body, head, close)
        return close

    async def _route(self, request: _Request, door: _Door) -> tuple[int, list[tuple[str, str]], bytes]:
        text = "text/plain; charset=utf-8"
        if door.limiter is not None and not door.limiter.take():  # web config rate_limit, as the toolkit
            return 429, [("Content-Type", text)], b"too many requests\n"
        if request.method not in ("GET", "HEAD"):
            return 405, [("Allow", "GET, HEAD"), ("Content-Type", text)], b"method not allowed\n"
        if request.path in ("/healthz", "/livez"):  # healthz: the daemon and every GPU; livez: the loop only
            problem = self.health() if request.path == "/healthz" else self.alive()
            return 503 if problem else 200, [("Content-Type", text)], (problem or "ok").encode() + b"\n"
        if request.path not in ("/metrics", "/"):
            return 404, [("Content-Type", text)], b"not found\n"
        denied = await self._authorize(door.auth, request.headers.get("authorization"))
        if denied == 401:
            return 401, [("WWW-Authenticate", 'Basic realm="gpuwear"'), ("Content-Type", text)], b"unauthorized\n"
        if denied == 429:
            return 429, [("Retry-After", "1"), ("Content-Type", text)], b"too many login attempts\n"
        if request.path == "/":
            page = _LANDING
            if self.page is not None:
                page = await asyncio.get_running_loop().run_in_executor(self._page, self.page)
            return 200, [("Content-Type", "text/html; charset=utf-8")], page
        _, content_type = choose_encoder(request.headers.get("accept", ""))
        gzipped = _accepts_gzip(request.headers.get("accept-encoding", ""))
        openmetrics = content_type.startswith("application/openmetrics-text")
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(self._render, self.exposition.render, openmetrics, gzipped)
        headers = [("Content-Type", content_type), ("Vary", "Accept-Encoding")]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        return 200, headers, body

    async def _authorize(self, auth: BasicAuth, header: str | None) -> int | None:
        """None when allowed; 401, or 429 when too many new credentials are being checked."""
        if not auth.users:
            return None
        credentials = _credentials(header)
        if credentials is None:
            return 401
        user, password = credentials
        if auth.remembered(user, password):
            return None
        if self._bcrypt_waiting > self.limits.bcrypt_waiting or not self._bcrypt_bucket.take():
            return 429
        self._bcrypt_waiting += 1
        try:
            ok = await asyncio.get_running_loop().run_in_executor(self._bcrypt, auth.verify, user, password)
        finally:
            self._bcrypt_waiting -= 1
        return None if ok else 401

    async def _send(self, stream: _Stream, status: int, headers: list[tuple[str, str]], body: bytes,
                    head: bool, close: bool) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}", f"Date: {formatdate(usegmt=True)}",
                 f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers)]
        if close:
            lines.append("Connection: close")
        async with asyncio.timeout(self.limits.write_seconds):
            await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body))


def _accepts_gzip(header: str) -> bool:
    """Whether ``Accept-Encoding`` allows gzip (``gzip`` or ``*``, without ``q=0``)."""
    for item in header.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "x-gzip", "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False
