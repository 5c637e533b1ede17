"""One connection of the front door: bytes in through an asyncio.StreamReader, bytes out through the transport,
with TLS through an ``ssl.SSLObject`` over memory buffers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from typing import Any

from gpuwear.web.http import MAX_LINE
from gpuwear.web.timeouts import timeout


class Stream(asyncio.Protocol):
    """One connection: bytes in through an asyncio.StreamReader, bytes out through the transport; with TLS,
    through an ``ssl.SSLObject`` over memory buffers. (asyncio's own TLS layer keeps a 256 KiB buffer per
    connection from the moment it starts, which made 300 silent connections cost 90 MiB, and its
    StreamWriter.start_tls breaks when the client leaves as the handshake ends.)"""

    def __init__(self, accepted: Callable[[Stream], None], gone: Callable[[Stream], None]) -> None:
        self._accepted, self._gone = accepted, gone  # told when the connection is made and when it is lost
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
        self._accepted(self)

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
        self._gone(self)

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

    async def send(self, data: bytes, seconds: float) -> None:
        """Write, and wait until all of it is with the kernel, for at most ``seconds`` (then TimeoutError)."""
        assert self.transport is not None
        if self._lost:
            raise ConnectionResetError("the client left")
        if self._tls is not None:
            self._tls.write(data)  # into the memory buffer: always all of it
            self._flush()
        else:
            self.transport.write(data)
        if not self._writable.is_set():  # the kernel took only part of it (a timer only then: most answers fit)
            async with timeout(seconds):
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
            async with timeout(seconds):
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
