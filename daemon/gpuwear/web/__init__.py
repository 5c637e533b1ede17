"""The front door: /metrics, /, /healthz and /livez over HTTP or HTTPS, with basic auth.

One asyncio loop on one thread serves every connection, so an idle or slow client costs a socket,
never a thread. No client can hold it:

- a whole request (TLS handshake, request line, headers, body) must arrive within 10 s, however
  slowly it trickles; a kept-alive connection waits 90 s for its next request (:class:`Limits`);
- at 256 connections, a new connection evicts the longest-waiting connection of the client address
  that holds the most: a flood from one address evicts its own connections, never a scraper's;
- /metrics is built on the loop while a build is light; one whose last build took 5 ms of CPU or more (many
  GPUs: the wear views and verdict, the text) is built on a worker thread, as the page and bcrypt always are, one
  each; bcrypt checks are bounded (a few a second, one at a time) and verified credentials are remembered, so
  brute force cannot starve scrapes;
- unknown users cost the same bcrypt check as wrong passwords (no user enumeration by timing).

The web config (:mod:`gpuwear.webconfig`) is swapped whole by :meth:`FrontDoor.configure` (SIGHUP);
certificates rotated on disk are picked up at the next connection, as exporter-toolkit does.

One module a job: ``http`` (a request read within its limits, a response's head), ``stream`` (a connection's
bytes, TLS over memory buffers), ``auth`` (basic auth and its bcrypt budget), ``tls`` (certificates reloaded),
``door`` (the server: admission, routes, workers).
"""

from gpuwear.web.auth import BasicAuth, TokenBucket
from gpuwear.web.door import FrontDoor, Limits
from gpuwear.web.tls import TlsContexts

__all__ = ["BasicAuth", "FrontDoor", "Limits", "TlsContexts", "TokenBucket"]
