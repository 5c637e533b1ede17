"""The front door's server: admission, routing, auth and the workers that render (see :mod:`gpuwear.web`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuwear.collector import Exposition
from gpuwear.web.auth import BasicAuth, TokenBucket, credentials
from gpuwear.web.http import RefusedError, Request, accepts_gzip, read_request, response_head
from gpuwear.web.http import content_type as negotiate
from gpuwear.web.stream import Stream
from gpuwear.web.timeouts import timeout, timeout_at
from gpuwear.web.tls import TlsContexts
from gpuwear.webconfig import WebConfig

log = logging.getLogger(__name__)

BACKLOG = 1024  # connections the kernel queues before they are accepted (capped by net.core.somaxconn)
# a /metrics build of this much CPU (seconds) holds the loop long enough that the next is built off it: the hop
# there and back (0.21-0.25 ms) is then at most 5 % of it
RENDER_OFF_LOOP_SECONDS = 0.005


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


_LANDING = (b"<!doctype html><html><head><meta charset=\"utf-8\"><title>gpuwear</title></head><body>"
            b"<h1>gpuwear</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n")


@dataclass
class _Door:
    """Everything one web config decides, swapped whole on reload."""

    web: WebConfig
    auth: BasicAuth
    tls: TlsContexts | None
    limiter: TokenBucket | None


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
        # /metrics renders on the loop's own thread while a render is light: CPU-bound under the GIL, a render thread
        # buys no parallel work and its hop there and back cost a scrape 0.21-0.25 ms (9 % at 8 GPUs, measured from
        # outside: bench/scrape_outside.md); one whose last build took RENDER_OFF_LOOP_SECONDS of CPU or more (many
        # GPUs: the wear views and verdict, the text) is built on a thread of its own, the loop free for every other
        # connection meanwhile. The page reads the ledger (seconds on a ledger years old): never on the loop
        self._render = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="http-render")
        self._page = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="http-page")
        self._bcrypt = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="http-bcrypt")
        self._bcrypt_bucket = TokenBucket(limits.bcrypt_per_second, limits.bcrypt_burst)
        self._bcrypt_waiting = 0
        self._connections: dict[Stream, None] = {}  # in order of arrival
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
        server = await asyncio.get_running_loop().create_server(lambda: Stream(self._accepted, self._gone),
                                                                sock=self._socket, backlog=BACKLOG)
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

    def _accepted(self, stream: Stream) -> None:
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

    def _gone(self, stream: Stream) -> None:
        self._connections.pop(stream, None)

    def _admit(self, stream: Stream) -> bool:
        """Room for a new connection. At the limit, the client address holding the most connections that
        wait for a request loses its longest-waiting one: a flood from one address (silent, trickling or
        reconnecting as fast as it can) only ever evicts its own connections, never a scraper's. False when
        no connection waits (all are being answered): the new one is refused."""
        if len(self._connections) >= self.limits.max_connections:
            by_address: dict[str, list[Stream]] = {}
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

    async def _serve(self, stream: Stream, door: _Door) -> None:
        loop = asyncio.get_running_loop()
        graceful = False  # a complete answer: closed after what was written, else aborted
        try:
            deadline = loop.time() + self.limits.request_seconds
            if door.tls is not None:
                async with timeout_at(deadline):
                    await stream.handshake()
                if not door.tls.settings.allows_peer(stream.peer_certificate()):
                    log.debug("http: %s: client certificate without an allowed SAN", stream.peer)
                    return
            first = b""
            while True:
                try:
                    request = await read_request(stream.reader, deadline, first)
                except RefusedError as refused:
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
                async with timeout(self.limits.idle_seconds):  # the next request's first byte
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

    async def _answer(self, request: Request, stream: Stream) -> bool:
        """Answer one request; True when the connection is to be closed after it."""
        door = self._door
        connection = request.headers.get("connection", "").lower()
        close = "close" in connection or (request.version == "HTTP/1.0" and "keep-alive" not in connection)
        head = request.method == "HEAD"
        status, headers, body = await self._route(request, door)
        headers += list(door.web.headers)
        await self._send(stream, status, headers, body, head, close)
        return close

    async def _route(self, request: Request, door: _Door) -> tuple[int, list[tuple[str, str]], bytes]:
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
        content_type = negotiate(request.headers.get("accept", ""))
        gzipped = accepts_gzip(request.headers.get("accept-encoding", ""))
        openmetrics = content_type.startswith("application/openmetrics-text")
        # no NVML call: the state the sampler published; the views may wait out a tick being integrated (ms)
        if self.exposition.last_render_seconds < RENDER_OFF_LOOP_SECONDS:
            body = self.exposition.render(openmetrics, gzipped)
        else:
            body = await asyncio.get_running_loop().run_in_executor(self._render, self.exposition.render, openmetrics,
                                                                    gzipped)
        headers = [("Content-Type", content_type), ("Vary", "Accept-Encoding")]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        return 200, headers, body

    async def _authorize(self, auth: BasicAuth, header: str | None) -> int | None:
        """None when allowed; 401, or 429 when too many new credentials are being checked."""
        if not auth.users:
            return None
        given = credentials(header)
        if given is None:
            return 401
        user, password = given
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

    async def _send(self, stream: Stream, status: int, headers: list[tuple[str, str]], body: bytes,
                    head: bool, close: bool) -> None:
        await stream.send(response_head(status, headers, len(body), close) + (b"" if head else body),
                          self.limits.write_seconds)
