"""The web config file: TLS, basic auth, headers and rate limit for the HTTP server, in the format of
prometheus/exporter-toolkit (``--web.config.file``, docs/web-configuration.md)::

    tls_server_config:
      cert_file: /etc/gpuwear/tls.crt
      key_file: /etc/gpuwear/tls.key
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Every key the toolkit documents is either applied with its meaning or refused here with the reason
(docs/security.md compares the two key by key); an unknown key is refused, as the toolkit's strict
YAML decoding does. Relative paths are relative to the file. Nothing here listens: :mod:`gpuwear.web` does.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwear.yamlsafe import YamlError, load_yaml

MAX_WEB_CONFIG_BYTES = 256 * 1024

# Go's crypto/tls names (tls.CipherSuites(), the names the toolkit accepts) to OpenSSL's, TLS 1.2 and older.
_CIPHERS_TLS12 = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
# TLS 1.3 suites are accepted and, as in Go, not configurable (OpenSSL enables all three).
_CIPHERS_TLS13 = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
             "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# Go's tls.ClientAuthType names; the two that ask for a certificate without verifying it have no
# equivalent in Python's ssl (it verifies whatever it asks for), and the toolkit calls them insecure.
_CLIENT_AUTH = {"": ssl.CERT_NONE, "NoClientCert": ssl.CERT_NONE,
                "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_CLIENT_AUTH_UNVERIFIED = {"RequestClientCert", "RequireAnyClientCert", "RequireClientCert"}
# The headers the toolkit lets a config add, and their allowed values where it restricts them.
_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (), "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": (), "Content-Security-Policy": ()}
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_TLS_KEYS = {"cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file",
             "client_allowed_sans", "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites",
             "curve_preferences"}


class WebConfigError(ValueError):
    """The web config cannot be used; the message (one line) names the file, the key and the problem."""


@dataclass(frozen=True)
class TlsSettings:
    """``tls_server_config``, checked. Files are read when a context is built, so that a rotated
    certificate is picked up by building a new one (:class:`gpuwear.web.TlsContexts`)."""

    cert_file: Path | None = None
    key_file: Path | None = None
    cert: str | None = None  # inline PEM
    key: str | None = field(default=None, repr=False)  # inline PEM, a secret
    client_ca_file: Path | None = None
    client_ca: str | None = None
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_allowed_sans: tuple[str, ...] | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    ciphers: str | None = None  # an OpenSSL cipher list (TLS 1.2 and older)
    prefer_server_ciphers: bool = True
    curve: str | None = None  # an OpenSSL group name

    def files(self) -> tuple[Path, ...]:
        """The files a context is built from: watched for rotation."""
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p is not None)

    def context(self) -> ssl.SSLContext:
        """A server TLS context from the files as they are now; raises OSError or ssl.SSLError."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = self.min_version
        context.maximum_version = self.max_version
        with _pem_file(self.cert_file, self.cert) as cert, _pem_file(self.key_file, self.key) as key:
            context.load_cert_chain(cert, key)
        if self.ciphers:
            context.set_ciphers(self.ciphers)
        if self.prefer_server_ciphers:
            context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
        if self.curve:
            context.set_ecdh_curve(self.curve)
        if self.client_auth != ssl.CERT_NONE:
            context.verify_mode = self.client_auth
            if self.client_ca_file is not None:
                context.load_verify_locations(cafile=self.client_ca_file)
            else:
                context.load_verify_locations(cadata=self.client_ca)
        return context

    def allows_peer(self, peer: dict[str, Any] | None) -> bool:
        """Whether a client certificate (``SSLObject.getpeercert()``) names an allowed SAN
        (``client_allowed_sans``: DNS, IP, e-mail or URI, exact match); True when not configured."""
        if self.client_allowed_sans is None:
            return True
        names = {_san(kind, value) for kind, value in (peer or {}).get("subjectAltName", ())}
        return any(_san("", allowed) in names for allowed in self.client_allowed_sans)


def _san(kind: str, value: str) -> str:
    """A SAN value compared as Go compares them: IP addresses in canonical form, the rest verbatim."""
    if kind in ("IP Address", ""):
        try:
            return str(ipaddress.ip_address(value.strip()))
        except ValueError:
            pass
    return value


@contextmanager
def _pem_file(path: Path | None, inline: str | None) -> Iterator[Path]:
    """The file to load: the configured one, or inline PEM in a private temporary file (Python's ssl
    loads certificates and keys from files only)."""
    if path is not None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="gpuwear-tls-") as folder:  # mode 0700
        pem = Path(folder) / "pem"
        fd = os.open(pem, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(inline or "")
        yield pem


@dataclass(frozen=True)
class WebConfig:
    """A checked web config; the defaults (no file) are plain HTTP without auth."""

    path: Path | None = None
    tls: TlsSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()
    rate_limit: tuple[float, int] | None = None  # (seconds between requests, burst)
    notes: tuple[str, ...] = ()  # what the log should say about it at load (e.g. http2)


def _duration(value: Any, where: str) -> float:
    """A Go duration ("1s", "100ms", "1m30s", "0") in seconds."""
    if value == 0 or value == "0":
        return 0.0
    text = value if isinstance(value, str) else ""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise WebConfigError(f"{where}: expected a duration such as 1s or 100ms, got {_short(value)}")
    return sum(float(n) * _DURATION_SECONDS[u] for n, u in parts)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mapping(value: Any, where: str, keys: set[str] | None = None) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: expected a mapping, got {_short(value)}")
    for key in value:
        if not isinstance(key, str) or (keys is not None and key not in keys):
            known = f" (known: {', '.join(sorted(keys))})" if keys is not None else ""
            name = f"{where} {key}" if where.endswith(":") else f"{where}.{key}"
            raise WebConfigError(f"{name}: unknown key{known}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise WebConfigError(f"{where}: expected a string, got {_short(value)}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise WebConfigError(f"{where}: expected a list of strings, got {_short(value)}")
    return [_string(v, f"{where}[{i}]") for i, v in enumerate(value)]


def _tls(data: Any, folder: Path, where: str) -> TlsSettings | None:
    tls = _mapping(data, where, _TLS_KEYS)
    text = {k: _string(v, f"{where}.{k}") for k, v in tls.items()
            if k in ("cert", "key", "client_ca", "cert_file", "key_file", "client_ca_file", "client_auth_type",
                     "min_version", "max_version") and v is not None}
    enabled = {"cert", "key", "client_ca", "cert_file", "key_file", "client_ca_file", "client_auth_type"}
    if not any(text.get(k) for k in enabled):  # as the toolkit: no TLS is plain HTTP (other keys unused)
        return None
    for inline, named in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if text.get(inline) and text.get(named):
            raise WebConfigError(f"{where}: {inline} and {named} both given; use one")
    if not text.get("cert") and not text.get("cert_file"):
        raise WebConfigError(f"{where}: missing one of cert or cert_file")
    if not text.get("key") and not text.get("key_file"):
        raise WebConfigError(f"{where}: missing one of key or key_file")
    auth_name = text.get("client_auth_type", "")
    if auth_name in _CLIENT_AUTH_UNVERIFIED:
        raise WebConfigError(f"{where}.client_auth_type: {auth_name} (a certificate asked for but not verified) "
                             "is not supported: use RequireAndVerifyClientCert (or VerifyClientCertIfGiven)")
    if auth_name not in _CLIENT_AUTH:
        raise WebConfigError(f"{where}.client_auth_type: unknown {auth_name!r} (known: NoClientCert, "
                             "VerifyClientCertIfGiven, RequireAndVerifyClientCert)")
    client_auth = _CLIENT_AUTH[auth_name]
    has_ca = bool(text.get("client_ca") or text.get("client_ca_file"))
    if has_ca and client_auth == ssl.CERT_NONE:
        raise WebConfigError(f"{where}: client CAs configured without a client_auth_type")
    if client_auth != ssl.CERT_NONE and not has_ca:
        raise WebConfigError(f"{where}.client_auth_type: {auth_name} needs client_ca_file or client_ca "
                             "(the CAs that sign the clients' certificates)")
    sans = tls.get("client_allowed_sans")
    allowed = tuple(_strings(sans, f"{where}.client_allowed_sans")) if sans is not None else None
    if allowed is not None and client_auth == ssl.CERT_NONE:
        raise WebConfigError(f"{where}.client_allowed_sans: needs a client_auth_type that verifies certificates")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = text.get(key, default)
        if name not in _VERSIONS:
            raise WebConfigError(f"{where}.{key}: unknown TLS version {name!r} (known: {', '.join(_VERSIONS)})")
        versions[key] = _VERSIONS[name]
    if versions["min_version"] > versions["max_version"]:
        raise WebConfigError(f"{where}: min_version is above max_version")
    suites = _strings(tls.get("cipher_suites"), f"{where}.cipher_suites")
    for name in suites:
        if name not in _CIPHERS_TLS12 and name not in _CIPHERS_TLS13:
            raise WebConfigError(f"{where}.cipher_suites: unknown cipher {name!r} (Go's crypto/tls names, "
                                 "e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
    curves = _strings(tls.get("curve_preferences"), f"{where}.curve_preferences")
    for name in curves:
        if name not in _CURVES:
            raise WebConfigError(f"{where}.curve_preferences: unknown curve {name!r} (known: {', '.join(_CURVES)})")
    if len(curves) > 1:
        raise WebConfigError(f"{where}.curve_preferences: Python's ssl sets a single curve; list one")
    for name in curves:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ecdh_curve(_CURVES[name])
        except (ssl.SSLError, ValueError):  # Python 3.10's ssl sets only curves of EC keys: not X25519
            usable = [c for c in _CURVES if c != name]
            raise WebConfigError(f"{where}.curve_preferences: {name} cannot be set by this Python's ssl module "
                                 f"(Python {sys.version_info[0]}.{sys.version_info[1]}; X25519 needs 3.11 or newer); "
                                 f"list one of {', '.join(usable)}") from None
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise WebConfigError(f"{where}.prefer_server_cipher_suites: expected true or false, got {_short(prefer)}")

    def file(key: str) -> Path | None:
        return (folder / text[key]).absolute() if text.get(key) else None

    settings = TlsSettings(
        cert_file=file("cert_file"), key_file=file("key_file"), cert=text.get("cert") or None,
        key=text.get("key") or None, client_ca_file=file("client_ca_file"), client_ca=text.get("client_ca") or None,
        client_auth=client_auth, client_allowed_sans=allowed, min_version=versions["min_version"],
        max_version=versions["max_version"],
        ciphers=":".join(_CIPHERS_TLS12[n] for n in suites if n in _CIPHERS_TLS12) or None,
        prefer_server_ciphers=prefer, curve=_CURVES[curves[0]] if curves else None)
    try:
        for path in settings.files():
            path.open("rb").close()
        settings.context()
    except (ssl.SSLError, ValueError) as exc:  # before OSError, of which ssl.SSLError is a kind
        raise WebConfigError(f"{where}: the certificate, key, CAs or ciphers cannot be used: {exc}") from None
    except OSError as exc:
        raise WebConfigError(f"{where}: cannot read {exc.filename or 'a file'}: {exc.strerror or exc}") from None
    return settings


def parse_web_config(data: Any, path: Path) -> WebConfig:
    """A :class:`WebConfig` from parsed YAML; raises :class:`WebConfigError` naming the first problem."""
    p = str(path)
    doc = _mapping(data, f"{p}:", {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"})
    notes: list[str] = []
    tls = _tls(doc.get("tls_server_config"), path.parent, f"{p}: tls_server_config")
    users: dict[str, bytes] = {}
    for user, hashed in _mapping(doc.get("basic_auth_users"), f"{p}: basic_auth_users").items():
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise WebConfigError(f"{p}: basic_auth_users.{user}: expected a bcrypt hash ($2y$10$ and 53 characters, "
                                 "from htpasswd -nBC 10), never a password")
        users[user] = hashed.encode()
    server = _mapping(doc.get("http_server_config"), f"{p}: http_server_config", {"http2", "headers"})
    http2 = server.get("http2", True)
    if not isinstance(http2, bool):
        raise WebConfigError(f"{p}: http_server_config.http2: expected true or false, got {_short(http2)}")
    if "http2" in server and http2 and tls is not None:
        notes.append("http_server_config.http2: gpuwear serves HTTP/1.1 only (what Prometheus scrapes with)")
    headers = []
    for name, value in _mapping(server.get("headers"), f"{p}: http_server_config.headers", set(_HEADERS)).items():
        value = _string(value, f"{p}: http_server_config.headers.{name}")
        if _HEADERS[name] and value and value not in _HEADERS[name]:
            raise WebConfigError(f"{p}: http_server_config.headers.{name}: expected one of "
                                 f"{', '.join(_HEADERS[name])}, got {_short(value)}")
        if any(c in value for c in "\r\n\0"):
            raise WebConfigError(f"{p}: http_server_config.headers.{name}: a line break in a header value")
        if value:  # blank: unset
            headers.append((name, value))
    limit = _mapping(doc.get("rate_limit"), f"{p}: rate_limit", {"interval", "burst"})
    rate_limit = None
    interval = _duration(limit.get("interval", 0), f"{p}: rate_limit.interval")
    if interval > 0:
        burst = limit.get("burst", 0)
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise WebConfigError(f"{p}: rate_limit.burst: expected a whole number of requests >= 1 "
                                 f"(0 would refuse every request), got {_short(burst)}")
        rate_limit = (interval, burst)
    return WebConfig(path, tls, users, tuple(headers), rate_limit, tuple(notes))


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check a web config file, and the certificates it names; raises :class:`WebConfigError`."""
    p = Path(path).absolute()
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_WEB_CONFIG_BYTES + 1)
    except OSError as exc:
        raise WebConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        data = load_yaml(raw, str(p), max_bytes=MAX_WEB_CONFIG_BYTES)
    except YamlError as exc:
        raise WebConfigError(str(exc)) from None
    return parse_web_config(data, p)
