"""Each OTLP push: the families /metrics serves for one published state, named as :mod:`gpuwear.otlp.names` says,
sent over OTLP/HTTP (protobuf) or OTLP/gRPC by the OpenTelemetry SDK's exporters. Imported only when OTLP is on.

A push is built fresh from the state of the moment and sent once, within ``otlp.timeout_seconds`` (the exporter's
own retries included); one that fails is counted and dropped, never queued: a collector that is down costs one
push's memory. It runs on a thread of its own (the daemon's ``otlp`` loop), never on the tick's or /metrics'.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.re import parse_env_headers
from prometheus_client.core import Metric as Family

from gpuwear import __version__
from gpuwear.config import OtlpConfig, otlp_headers
from gpuwear.otlp.names import PUSHED, Push

log = logging.getLogger(__name__)

SAY_EVERY_SECONDS = 60.0  # a failing push is logged at most this often, with how many failed since


class UnsupportedError(Exception):
    """An OTLP setting this release cannot push with (said in one line; the daemon serves /metrics on)."""


def endpoint_of(config: OtlpConfig, environ: Mapping[str, str], protocol: str = "http/protobuf") -> str:
    """Where the pushes go: the config's endpoint (over HTTP with /v1/metrics where its path is empty), else the SDK's
    variables' (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT as is; OTEL_EXPORTER_OTLP_ENDPOINT, over HTTP with /v1/metrics),
    else the SDK's default (http://localhost:4318/v1/metrics; gRPC: http://localhost:4317)."""
    if protocol == "grpc":
        return config.endpoint or environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or \
            environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4317"
    if config.endpoint:
        return config.endpoint if urlsplit(config.endpoint).path.strip("/") else \
            config.endpoint.rstrip("/") + "/v1/metrics"
    if environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        return environ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/metrics"
    return "http://localhost:4318/v1/metrics"


def protocol_of(config: OtlpConfig, environ: Mapping[str, str]) -> str:
    """The protocol: the config's, else OTEL_EXPORTER_OTLP_METRICS_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL, else
    http/protobuf; UnsupportedError for one other than http/protobuf and grpc (http/json: the SDK has no exporter)."""
    protocol = config.protocol or environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or \
        environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol not in ("http/protobuf", "grpc"):
        raise UnsupportedError(f"OTLP protocol {protocol!r} is not supported: use http/protobuf or grpc "
                               "(otlp.protocol, or OTEL_EXPORTER_OTLP_PROTOCOL)")
    return protocol


def _grpc_exporter(config: OtlpConfig, endpoint: str, headers: dict[str, str] | None) -> Any:
    """The SDK's OTLP/gRPC exporter (the extra gpuwear[otlp-grpc]: grpcio), TLS from otlp.certificate where given."""
    try:
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcExporter
    except ImportError as exc:
        raise UnsupportedError(f"OTLP over gRPC needs its exporter ({exc}): pip install 'gpuwear[otlp-grpc]'") \
            from None
    credentials = None
    if config.certificate or config.client_certificate:
        try:
            credentials = grpc.ssl_channel_credentials(
                Path(config.certificate).read_bytes() if config.certificate else None,
                Path(config.client_key).read_bytes() if config.client_key else None,
                Path(config.client_certificate).read_bytes() if config.client_certificate else None)
        except OSError as exc:
            raise UnsupportedError(f"otlp: {exc.filename}: {exc.strerror or exc}") from None
    return GrpcExporter(endpoint=endpoint, headers=headers, timeout=config.timeout_seconds, credentials=credentials,
                        insecure=True if credentials is None and endpoint.startswith("http://") else None)


def _session() -> Any:
    """The HTTP exporter's requests session: one whose own CA file (otlp.certificate, or the OTEL_* variable the SDK
    reads) wins over REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE, which requests otherwise lets override a session's CA
    (psf/requests #3829: set on many CI and corporate machines, the configured CA was ignored there)."""
    import requests

    class KeepsItsCa(requests.Session):
        last: Any = None  # the last response, whose body may hold a partial success

        def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
            settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
            if isinstance(self.verify, str) and verify is None:
                settings["verify"] = self.verify
            return settings

        def request(self, *args: Any, **kwargs: Any) -> Any:
            self.last = None
            self.last = response = super().request(*args, **kwargs)
            return response

    return KeepsItsCa()


def rejected(body: bytes | None) -> tuple[int, str]:
    """The data points a collector's answer says it rejected, and why: OTLP's partial success
    (ExportMetricsServiceResponse.partial_success: "the request was only partially accepted"); (0, "") for a whole
    success or an answer that is not one."""
    if not body:
        return 0, ""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    answer = ExportMetricsServiceResponse()
    try:
        answer.ParseFromString(body)
    except Exception:  # not protobuf (a proxy's page): nothing said about points
        return 0, ""
    return int(answer.partial_success.rejected_data_points), str(answer.partial_success.error_message)[:200]


def _gpu_identity(families: list[Family]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Each GPU's hw.* identity attributes by UUID (gpuwear_gpu_info), and the host's driver's
    (gpuwear_driver_info)."""
    cards: dict[str, dict[str, str]] = {}
    driver: dict[str, str] = {}
    for family in families:
        if family.name == "gpuwear_gpu_info":
            for s in family.samples:
                card = {"hw.model": s.labels.get("name", "")}
                if s.labels.get("serial"):
                    card["hw.serial_number"] = s.labels["serial"]
                cards[s.labels["uuid"]] = card
        elif family.name == "gpuwear_driver_info":
            for s in family.samples:
                driver = {"hw.driver_version": s.labels.get("driver_version", "")}
    return cards, driver


def _attributes(labels: Mapping[str, str], push: Push, card: Mapping[str, str]) -> dict[str, str] | None:
    """A series' attributes (None: not pushed, by ``push.only`` or a value its renaming lacks)."""
    if any(labels.get(k) != v for k, v in push.only.items()):
        return None
    out = {"hw.id": labels["uuid"], "hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.name": f"GPU {labels['gpu']}",
           **card, **push.fixed}
    for label, value in labels.items():
        if label in ("gpu", "uuid") or label in push.only:
            continue
        rename = push.labels.get(label, f"gpuwear.{label}")
        if isinstance(rename, tuple):
            name, values = rename
            if value not in values:
                return None
            out[name] = values[value]
        else:
            out[rename] = value
    if (d := push.derived) is not None and d.label in labels:
        out[d.attribute] = d.values.get(labels[d.label], d.default)
    return out


def metrics_data(families: Iterable[Family], resource: Resource, start_ns: int, now_ns: int) -> MetricsData:
    """One push: every family :data:`gpuwear.otlp.names.PUSHED` names, its series as data points at ``now_ns``
    (sums cumulative from ``start_ns``), families pushed under one name (hw.errors) as one metric."""
    families = list(families)
    cards, driver = _gpu_identity(families)
    exported = {f.name + "_total" if f.type == "counter" else f.name for f in families if f.samples}
    points: dict[str, list[NumberDataPoint]] = {}
    kinds: dict[str, tuple[str, str, bool, bool]] = {}  # name -> (unit, description, counter, up-down counter)
    for family in families:
        counter = family.type == "counter"
        push = PUSHED.get(family.name + "_total" if counter else family.name)  # (a counter family's name has none)
        if push is None or push.unless in exported:
            continue
        kinds.setdefault(push.name, (push.unit, family.documentation, counter, push.updown))
        for s in family.samples:
            if counter and not s.name.endswith("_total"):  # a counter's _created sample
                continue
            attributes = _attributes(s.labels, push, {**cards.get(s.labels.get("uuid", ""), {}), **driver})
            if attributes is not None:
                points.setdefault(push.name, []).append(NumberDataPoint(attributes, start_ns, now_ns, s.value))
    metrics = []
    for name, data_points in points.items():
        unit, description, counter, updown = kinds[name]
        data: Sum | Gauge = Sum(data_points, AggregationTemporality.CUMULATIVE, counter) if counter or updown \
            else Gauge(data_points)
        metrics.append(Metric(name, description, unit, data))
    scope = ScopeMetrics(InstrumentationScope("gpuwear", __version__), metrics, "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])


def resource(environ: Mapping[str, str]) -> Resource:
    """The host's identity: OTEL_RESOURCE_ATTRIBUTES (key=value pairs, as the SDK reads them), service.name
    (OTEL_SERVICE_NAME, else the attributes', else gpuwear), service.version and host.name."""
    given = parse_env_headers(environ.get("OTEL_RESOURCE_ATTRIBUTES", ""), liberal=True)
    name = environ.get("OTEL_SERVICE_NAME") or given.get("service.name") or "gpuwear"
    return Resource.create({**given, "service.name": name, "service.version": __version__,
                            "host.name": given.get("host.name") or socket.gethostname()})


class Pusher:
    """Pushes the families of ``families()`` (one published state's, what /metrics serves) every
    ``otlp.interval_seconds`` when :meth:`push` is called by the daemon's loop; counts ``pushed`` and ``failed``."""

    def __init__(self, config: OtlpConfig, families: Callable[[], Iterable[Family]],
                 environ: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        environ = os.environ if environ is None else environ
        self.protocol = protocol_of(config, environ)
        self.endpoint = endpoint_of(config, environ, self.protocol)
        headers: dict[str, str] | None = None
        if config.headers:
            headers = {**parse_env_headers(environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS")
                                           or environ.get("OTEL_EXPORTER_OTLP_HEADERS", ""), liberal=True),
                       **otlp_headers(config.headers)}
        self.config = config
        self._families = families
        if bool(config.client_certificate) != bool(config.client_key):
            raise UnsupportedError("otlp.client_certificate and otlp.client_key go together (a client certificate "
                                   "and its private key, PEM files)")
        for name in ("certificate", "client_certificate", "client_key"):  # said at start, not at each push
            if (path := getattr(config, name)) and not os.access(path, os.R_OK):
                raise UnsupportedError(f"otlp.{name} {path}: not a file this user can read")
        self._http = None if self.protocol == "grpc" else _session()
        self._exporter = _grpc_exporter(config, self.endpoint, headers) if self._http is None else \
            OTLPMetricExporter(endpoint=self.endpoint, headers=headers, timeout=config.timeout_seconds,
                               certificate_file=config.certificate or None,
                               client_certificate_file=config.client_certificate or None,
                               client_key_file=config.client_key or None, session=self._http)
        for exporter in ("http", "grpc"):  # their failures are said here, once a minute at most
            logging.getLogger(f"opentelemetry.exporter.otlp.proto.{exporter}").setLevel(logging.CRITICAL)
        self._resource = resource(environ)
        self._start_ns = time.time_ns()
        self._clock = clock
        self._lock = threading.Lock()
        self.pushed = 0
        self.failed = 0
        self.partial = 0  # taken, with some data points rejected (HTTP only: the gRPC exporter hides the answer)
        self._unsaid = 0  # failures since the last line about them
        self._said: float | None = None

    def push(self) -> bool:
        """Build and send one push now; True when the collector took it."""
        with self._lock:
            try:
                data = metrics_data(self._families(), self._resource, self._start_ns, time.time_ns())
                ok = self._exporter.export(data, timeout_millis=self.config.timeout_seconds * 1000.0) \
                    == MetricExportResult.SUCCESS
                why = "the collector did not take it"
            except Exception as exc:  # the SDK's, a bad endpoint: counted and said, never raised into the loop
                ok, why = False, f"{type(exc).__name__}: {exc}"
            if ok:
                answer = getattr(self._http, "last", None)
                points, why = rejected(answer.content if answer is not None else None)
                if not points:
                    self.pushed += 1
                    return True
                self.partial += 1
                why = f"the collector rejected {points} data point(s) of it: {why or 'no reason given'}"
            else:
                self.failed += 1
            self._unsaid += 1
            now = self._clock()
            if self._said is None or now - self._said >= SAY_EVERY_SECONDS:
                log.warning("OTLP push to %s %s (%s); %d not whole since the last line, %d failed and %d partly "
                            "rejected in all", self.endpoint, "failed" if not ok else "partly rejected", why[:300],
                            self._unsaid, self.failed, self.partial)
                self._said, self._unsaid = now, 0
            return ok

    def close(self) -> None:
        self._exporter.shutdown()
