"""Small helpers shared by the tests that start the daemon."""

from __future__ import annotations

import ctypes
import socket
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# urllib would send even loopback requests through $http_proxy: never use a proxy here.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with _HTTP.open(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for(url: str, needle: str, seconds: float = 20.0) -> str:
    """Poll ``url`` until its body contains ``needle``; returns the body."""
    deadline = time.monotonic() + seconds
    last = ""
    while time.monotonic() < deadline:
        try:
            _, last = fetch(url)
            if needle in last:
                return last
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} did not show {needle!r} within {seconds}s; last body: {last[:500]!r}")


def real_nvml_present() -> bool:
    """True on a machine with an NVIDIA driver (libnvidia-ml loads)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True
