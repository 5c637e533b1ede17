"""TLS and HTTP basic auth for /metrics, in the Prometheus exporter web-config format.

The file is the one exporters read with ``--web.config.file`` (prometheus/exporter-toolkit)::

    tls_server_config:
      cert_file: /etc/gpuwear/tls.crt
      key_file: /etc/gpuwear/tls.key
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Both sections are optional. Relative paths are relative to the file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class WebConfigError(ValueError):
    """The web config cannot be used; the message names the file and the problem."""


@dataclass
class WebConfig:
    cert_file: Path | None = None
    key_file: Path | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _verified: set[bytes] = field(default_factory=set)  # digests of credentials already checked
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server TLS context, or None without TLS."""
        if self.cert_file is None or self.key_file is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header is allowed (always, when no users are set).

        bcrypt is slow on purpose; a credential that passed once is remembered (as a
        keyed digest, never in clear) so that scrapes stay fast, as exporter-toolkit does."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        digest = hmac.new(hashed, f"{user}:{password}".encode(), hashlib.sha256).digest()
        with self._lock:
            if digest in self._verified:
                return True
        import bcrypt  # only where basic auth is configured

        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            self._verified.add(digest)
        return True


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check a web config file; raises :class:`WebConfigError`."""
    p = Path(path)
    try:
        data: Any = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise WebConfigError(f"{p}: cannot read: {exc}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise WebConfigError(f"{p}: expected a mapping")
    unknown = set(data) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise WebConfigError(f"{p}: {sorted(unknown)[0]}: unknown key")
    config = WebConfig()
    tls = data.get("tls_server_config")
    if tls is not None:
        if not isinstance(tls, dict) or not tls.get("cert_file") or not tls.get("key_file"):
            raise WebConfigError(f"{p}: tls_server_config needs cert_file and key_file")
        config.cert_file = (p.parent / str(tls["cert_file"])).resolve()
        config.key_file = (p.parent / str(tls["key_file"])).resolve()
        try:
            config.ssl_context()
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"{p}: tls_server_config: cannot load the certificate or key: {exc}") from None
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise WebConfigError(f"{p}: basic_auth_users: expected user: bcrypt-hash pairs")
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{p}: basic_auth_users.{user}: expected a bcrypt hash ($2y$...), never a password")
        config.users[str(user)] = hashed.encode()
    return config
