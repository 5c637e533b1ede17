"""OTLP push (issue 57): received by an in-process OTLP/HTTP receiver and held to /metrics of the same moment."""

from __future__ import annotations

import http.server
import json
import logging
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuwear.config import ConfigError, OtlpConfig, parse_config
from gpuwear.metrics import catalog
from gpuwear.otlp.names import PUSHED
from helpers import free_port
from test_drivers import daemon_over, run, scenario_doc

GOLDEN = Path(__file__).parent / "golden" / "otlp.txt"
DOCS = Path(__file__).parent.parent / "docs" / "otlp.md"


class Receiver:
    """An OTLP/HTTP metrics receiver on a free port: each request decoded (ExportMetricsServiceRequest), answered
    ``status`` (200: taken)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.status = 200
        self.rejected: tuple[int, str] | None = None  # answer a partial success: data points rejected, why
        self.paths: list[str] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append(request)
                receiver.paths.append(self.path)
                answer = ExportMetricsServiceResponse().SerializeToString()
                if receiver.rejected is not None:
                    partial = ExportMetricsServiceResponse()
                    partial.partial_success.rejected_data_points = receiver.rejected[0]
                    partial.partial_success.error_message = receiver.rejected[1]
                    answer = partial.SerializeToString()
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiver(tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    r = Receiver(tls)
    try:
        yield r
    finally:
        r.close()


def points(request: ExportMetricsServiceRequest) -> dict[str, list[tuple[dict[str, str], float, str, str]]]:
    """name -> (attributes, value, unit, kind) of each data point of a push."""
    out: dict[str, list[tuple[dict[str, str], float, str, str]]] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                data = getattr(m, kind)
                for p in data.data_points:
                    attrs = {a.key: a.value.string_value for a in p.attributes}
                    value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                    label = f"{kind}{'' if kind != 'sum' else ' monotonic' if data.is_monotonic else ' up-down'}"
                    out.setdefault(m.name, []).append((attrs, value, m.unit, label))
    return out


def test_a_push_holds_what_metrics_serves_at_the_same_moment(tmp_path: Path,
                                                              request: pytest.FixtureRequest) -> None:
    """Issue 57's done-when: the push, received in process, checked against /metrics read at the same moment (the
    same published state): every series of a pushed family is a data point under its OTLP name with the same
    value, the GPU's identity as hw.* attributes, the host's in the resource; the names, units, kinds and
    attribute keys are a golden list (tests/golden/otlp.txt, --update-golden)."""
    from gpuwear.otlp.push import Pusher

    doc = scenario_doc("r570", "datacenter", [{"at": 5, "gpu": 1, "kind": "ecc", "corrected": 3, "uncorrected": 1},
                                              {"at": 5, "gpu": 1, "kind": "pcie_replays", "count": 4}])
    with daemon_over(doc, tmp_path) as (daemon, clock), receiver() as r:
        run(daemon, clock, 10)
        daemon.source.sampler.record_xid(0, 79)  # as NVML's event listener tells it
        daemon.source.sampler.record_xid(1, 31)
        run(daemon, clock, 20)
        pusher = Pusher(OtlpConfig(enabled=True, endpoint=r.url), daemon.collector.collect,
                        environ={"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test"})
        assert pusher.push() and pusher.pushed == 1 and r.paths == ["/v1/metrics"]
        body = daemon.exposition.render(False).decode()
        daemon.collector.detail = True  # metrics.detail: each code instead of its tier, never both
        assert pusher.push() and len(r.requests) == 2
        daemon.collector.detail = False
    detailed = {(a["hw.id"][-1], a.get("gpuwear.xid"), a.get("gpuwear.xid.tier")): a["gpuwear.error.category"]
                for a, _, _, _ in points(r.requests[1])["hw.errors"] if a["error.type"] == "xid"}
    assert detailed == {("0", "79", None): "fatal", ("1", "31", None): "uncorrectable"}, detailed
    pushed = points(r.requests[0])
    resource = {a.key: a.value.string_value for a in r.requests[0].resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "gpuwear" and resource["host.name"]
    assert resource["deployment.environment.name"] == "test"  # OTEL_RESOURCE_ATTRIBUTES, as the SDK reads it
    want: dict[tuple[str, str], list[float]] = {}
    for family in text_string_to_metric_families(body):
        push = PUSHED.get(family.name + "_total" if family.type == "counter" else family.name)
        if push is None:
            continue
        for s in family.samples:
            if s.name.endswith("_created") or any(s.labels.get(k) != v for k, v in push.only.items()):
                continue
            renamed = [push.labels[k] for k in s.labels if isinstance(push.labels.get(k), tuple)]
            if any(s.labels[k] not in push.labels[k][1] for k in s.labels
                   if isinstance(push.labels.get(k), tuple)):
                assert renamed and family.name == "gpuwear_health_status" and s.labels["status"] == "unknown"
                continue  # not a state of hw.status
            want.setdefault((push.name, s.labels["uuid"]), []).append(s.value)
    got: dict[tuple[str, str], list[float]] = {}
    for name, ps in pushed.items():
        for attrs, value, _, _ in ps:
            got.setdefault((name, attrs["hw.id"]), []).append(value)
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}
    h100 = next(a for a, _, _, _ in pushed["hw.power"] if a["hw.model"] == "NVIDIA H100 80GB HBM3")
    assert h100["hw.type"] == "gpu" and h100["hw.vendor"] == "NVIDIA" and h100["hw.serial_number"]
    assert h100["hw.driver_version"] == "570.195.03"
    assert {a["hw.name"] for a, _, _, _ in pushed["hw.power"]} == {"GPU 0", "GPU 1"}
    errors = {(a["hw.id"][-1], a["error.type"], a.get("gpuwear.error.category"), a.get("gpuwear.ecc.counter")): v
              for a, v, _, _ in pushed["hw.errors"]}
    assert errors[("1", "ecc", "correctable", "aggregate")] == 3
    assert errors[("1", "ecc", "uncorrectable", "volatile")] == 1
    assert errors[("1", "pcie_replay", "correctable", None)] == 4
    assert errors[("0", "pcie_replay", "correctable", None)] == 0
    # issue 57: by NVIDIA's catalog; by default by the alert their code raises (per code: metrics.detail)
    # (issue 56: each card's lifetime count, both tiers, 0 where none)
    xids = {(a["hw.id"][-1], a["gpuwear.xid.tier"]): (a["gpuwear.error.category"], v)
            for a, v, _, _ in pushed["hw.errors"] if a["error.type"] == "xid"}
    assert xids == {("0", "act"): ("fatal", 1), ("0", "watch"): ("uncorrectable", 0),
                    ("1", "act"): ("fatal", 0), ("1", "watch"): ("uncorrectable", 1)}, xids
    shapes = sorted({f"{name} {unit} {kind} {' '.join(sorted({k for a, _, _, _ in ps for k in a}))}"
                     for name, ps in pushed.items() for _, _, unit, kind in ps})
    text = "\n".join(shapes) + "\n"
    if request.config.getoption("--update-golden"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "the pushed names changed; if intended, run pytest --update-golden"


def test_every_family_of_metrics_is_pushed_or_said_not_to_be_in_the_docs(request: pytest.FixtureRequest) -> None:
    """Issue 57, item 3: docs/otlp.md maps every /metrics family (metrics.detail's included) to its OTLP name, or says
    why it is not pushed; generated from gpuwear.otlp.names (--update-golden)."""
    from gpuwear.otlp.names import table

    text = table([(source, m.name) for source, m in catalog(True).in_order()])
    doc = DOCS.read_text()
    start, end = doc.index("<!-- table -->\n") + len("<!-- table -->\n"), doc.index("<!-- end table -->")
    if request.config.getoption("--update-golden"):
        DOCS.write_text(doc[:start] + text + doc[end:])
        doc = DOCS.read_text()
    assert doc[start:doc.index("<!-- end table -->")] == text, "docs/otlp.md's table is stale: --update-golden"
    assert all(f"`{name}`" in text for _, m in catalog(True).in_order() for name in [m.name])


def test_a_collector_that_refuses_is_counted_said_once_a_minute_and_never_queued(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 57, item 4: a refused push is counted (gpuwear_otlp_pushes_total on /metrics, absent with OTLP off) and
    dropped, not kept for later: the next push after the collector is back sends the state of then, and nothing
    else; a line at most once a minute says how many failed."""
    from gpuwear.otlp.push import Pusher

    caplog.set_level(logging.WARNING, logger="gpuwear.otlp.push")
    now = [0.0]
    with daemon_over(scenario_doc("r570", "datacenter"), tmp_path) as (daemon, clock), receiver() as r:
        run(daemon, clock, 5)
        assert "gpuwear_otlp_pushes_total{" not in daemon.exposition.render(False).decode()  # absent: off
        pusher = Pusher(OtlpConfig(enabled=True, endpoint=r.url, timeout_seconds=2.0), daemon.collector.collect,
                        environ={}, clock=lambda: now[0])
        daemon._otlp = pusher  # as Daemon.start sets it (the daemon's own loop is tested below)
        r.status = 400  # refused, not retried by the exporter
        for t in (0.0, 20.0, 40.0, 61.0):
            now[0] = t
            assert not pusher.push()
        assert pusher.failed == 4 and len(r.requests) == 4
        lines = [rec.getMessage() for rec in caplog.records if "OTLP push" in rec.getMessage()]
        assert len(lines) == 2 and "3 not whole since the last line, 4 failed and 0 partly rejected in all" in \
            lines[1], lines
        body = daemon.exposition.render(False).decode()  # no tick since: the counts' change alone renders again
        assert 'gpuwear_otlp_pushes_total{result="failed"} 4.0' in body
        r.status = 200
        run(daemon, clock, 1)
        assert pusher.push() and len(r.requests) == 5  # one request: the state of now, nothing kept from before
        assert 'gpuwear_otlp_pushes_total{result="ok"} 1.0' in daemon.exposition.render(False).decode()
        # taken, but with data points rejected (OTLP's partial success): counted apart and said, not as ok
        r.rejected = (7, "hw.errors: unknown unit")
        now[0] = 200.0
        assert pusher.push() and (pusher.pushed, pusher.partial) == (1, 1)
        assert 'gpuwear_otlp_pushes_total{result="partial"} 1.0' in daemon.exposition.render(False).decode()
        said = [rec.getMessage() for rec in caplog.records if "OTLP push" in rec.getMessage()][-1]
        assert "partly rejected (the collector rejected 7 data point(s) of it: hw.errors: unknown unit)" in said, said


def test_otlp_is_off_unless_asked_and_the_sdk_is_not_imported_then(tmp_path: Path) -> None:
    """Issue 57, items 1 and 2: off by default and with OTEL_EXPORTER_OTLP_ENDPOINT alone (operators inject it into
    every pod); on with otlp.enabled or OTEL_METRICS_EXPORTER=otlp, off with enabled: false whatever it says. With it
    off, a running daemon imports nothing of the OpenTelemetry SDK; a protocol the SDK has no exporter for is refused
    in one line at start."""
    assert not OtlpConfig().on({}) and not OtlpConfig().on({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert OtlpConfig().on({"OTEL_METRICS_EXPORTER": "prometheus,otlp"})
    assert OtlpConfig(enabled=True).on({}) and not OtlpConfig(enabled=False).on({"OTEL_METRICS_EXPORTER": "otlp"})
    for bad, words in (({"enabled": "yes"}, "otlp.enabled: expected auto, true or false"),
                       ({"endpoint": "collector:4318"}, "otlp.endpoint: expected an http:// or https:// URL"),
                       ({"headers": "api-key"}, "otlp.headers: expected key=value pairs"),
                       ({"protocol": "udp"}, "otlp.protocol: expected one of")):
        with pytest.raises(ConfigError, match=words):
            parse_config({"otlp": bad})
    script = f"""
import json, os, sys, time
from gpuwear.config import Config
from gpuwear.service import Daemon, open_source
os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
config = Config(listen="127.0.0.1:{free_port()}", state_dir={str(tmp_path)!r})
daemon = Daemon(config, open_source(config, "demo", 600.0, False))
daemon.start()
time.sleep(1.0)
daemon.stop()
print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []
    from gpuwear.otlp.push import Pusher, UnsupportedError

    with pytest.raises(UnsupportedError, match="OTLP protocol 'http/json' is not supported: use http/protobuf or grpc"):
        Pusher(OtlpConfig(enabled=True), lambda: [], environ={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


@pytest.mark.slow
def test_the_daemon_pushes_on_its_own_loop_and_a_reload_applies_otlp_changes(tmp_path: Path) -> None:
    """The running daemon pushes on its own loop, and a reload (SIGHUP) applies the otlp section at once (issue 57:
    only a restart did): off at start, turned on (interval 1 s) it pushes to the endpoint's /v1/metrics and /metrics
    counts the pushes; a new endpoint gets the next pushes, the count carried on; turned off, the pushes stop and the
    count's series goes."""
    from gpuwear.config import load_config
    from gpuwear.service import Daemon, open_source
    from helpers import fetch

    path = tmp_path / "config.yaml"
    base = f"listen: 127.0.0.1:{free_port()}\nstate_dir: {tmp_path}\n"

    def pushes_ok(daemon: Daemon) -> float | None:
        status, body = fetch(f"http://127.0.0.1:{daemon.port}/metrics")
        assert status == 200
        ok = [float(line.split()[-1]) for line in body.splitlines()
              if line.startswith('gpuwear_otlp_pushes_total{result="ok"}')]
        return ok[0] if ok else None

    def wait(r: Receiver, n: int) -> None:
        deadline = time.monotonic() + 60
        while len(r.requests) < n:
            assert time.monotonic() < deadline, f"{len(r.requests)} OTLP pushes of {n} within 60 s"
            time.sleep(0.05)

    with receiver() as first, receiver() as second:
        path.write_text(base)
        config = load_config(str(path))
        daemon = Daemon(config, open_source(config, "demo", 60.0, False), config_path=str(path))
        daemon.start()
        try:
            assert pushes_ok(daemon) is None
            path.write_text(base + f"otlp:\n  enabled: true\n  endpoint: {first.url}\n  interval_seconds: 1\n")
            assert daemon.reload()
            wait(first, 2)
            counted = pushes_ok(daemon)
            assert counted is not None and counted >= 1
            path.write_text(base + f"otlp:\n  enabled: true\n  endpoint: {second.url}\n  interval_seconds: 1\n")
            assert daemon.reload()
            taken = len(first.requests)
            wait(second, 2)
            assert len(first.requests) <= taken + 1  # one push in flight at the reload, at most
            assert (pushes_ok(daemon) or 0) >= counted + 2  # carried on, not begun again
            path.write_text(base + "otlp:\n  enabled: false\n")
            assert daemon.reload()
            stopped = len(second.requests)
            time.sleep(2.5)  # two and a half intervals: a loop still pushing would have pushed twice
            assert len(second.requests) <= stopped + 1 and pushes_ok(daemon) is None
        finally:
            daemon.stop()
    assert set(first.paths) == set(second.paths) == {"/v1/metrics"}
    assert "hw.temperature" in points(second.requests[-1])


def _pki(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed (EC keys: quick to make)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.crt"), "-days", "1",
            "-subj", "/CN=test CA")
    for name, san in (("server", "IP:127.0.0.1"), ("client", "DNS:gpuwear.example")):
        (folder / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        openssl("req", *ec, "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.csr"), "-subj",
                f"/CN={name}")
        openssl("x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA", str(folder / "ca.crt"), "-CAkey",
                str(folder / "ca.key"), "-CAcreateserial", "-out", str(folder / f"{name}.crt"), "-days", "1",
                "-extfile", str(folder / f"{name}.ext"))


def test_a_collector_that_asks_for_a_client_certificate_gets_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 57, item 1 (TLS): otlp.client_certificate and client_key (mutual TLS) were not there, only the CA file.
    A collector over https that requires a client certificate signed by its CA takes the push with them and refuses
    it without; one without the other, or a file that cannot be read, is refused at start in one line. On a machine
    whose environment names a CA bundle for requests (REQUESTS_CA_BUNDLE, as this one's and many CI machines' do),
    otlp.certificate still decides: requests let the variable override it (psf/requests #3829), and the push failed."""
    from gpuwear.otlp.push import Pusher, UnsupportedError

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ssl.get_default_verify_paths().openssl_cafile)
    _pki(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "ca.crt"))
    tls.load_cert_chain(str(tmp_path / "server.crt"), str(tmp_path / "server.key"))
    tls.verify_mode = ssl.CERT_REQUIRED
    with daemon_over(scenario_doc("r570", "datacenter"), tmp_path / "d") as (daemon, clock), receiver(tls) as r:
        run(daemon, clock, 3)
        trust = OtlpConfig(enabled=True, endpoint=r.url, timeout_seconds=5.0, certificate=str(tmp_path / "ca.crt"))
        mutual = replace(trust, client_certificate=str(tmp_path / "client.crt"),
                         client_key=str(tmp_path / "client.key"))
        assert Pusher(mutual, daemon.collector.collect, environ={}).push() and len(r.requests) == 1
        assert "hw.temperature" in points(r.requests[0])
        no_client = replace(trust, timeout_seconds=1.0)
        assert not Pusher(no_client, daemon.collector.collect, environ={}).push() and len(r.requests) == 1
    with pytest.raises(UnsupportedError, match=r"client_certificate and otlp\.client_key go together"):
        Pusher(replace(trust, client_key=str(tmp_path / "client.key")), lambda: [], environ={})
    with pytest.raises(UnsupportedError, match=r"otlp\.client_key .*nope\.key: not a file this user can read"):
        Pusher(replace(mutual, client_key=str(tmp_path / "nope.key")), lambda: [], environ={})


def test_the_same_push_over_grpc(tmp_path: Path) -> None:
    """Issue 57, item 1: OTLP/gRPC (otlp.protocol grpc, the extra gpuwear[otlp-grpc]) pushes the same data points as
    OTLP/HTTP for the same published state, to an in-process gRPC receiver of the collector's MetricsService."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

    from gpuwear.otlp.push import Pusher

    got: list[ExportMetricsServiceRequest] = []

    class Service(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: ExportMetricsServiceRequest, context: Any) -> ExportMetricsServiceResponse:  # noqa: N802
            got.append(request)
            return ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with daemon_over(scenario_doc("r570", "datacenter"), tmp_path) as (daemon, clock), receiver() as r:
            run(daemon, clock, 10)
            over_grpc = Pusher(OtlpConfig(enabled=True, endpoint=f"http://127.0.0.1:{port}", protocol="grpc"),
                               daemon.collector.collect, environ={})
            over_http = Pusher(OtlpConfig(enabled=True, endpoint=r.url), daemon.collector.collect, environ={})
            assert over_grpc.protocol == "grpc" and over_grpc.push() and over_http.push()
            over_grpc.close()
    finally:
        server.stop(None)

    def values(request: ExportMetricsServiceRequest) -> list[tuple[str, str, float]]:
        return sorted((name, json.dumps(a, sort_keys=True), v) for name, ps in points(request).items()
                      for a, v, _, _ in ps)

    assert len(got) == 1 and values(got[0]) == values(r.requests[0]) and len(values(got[0])) > 40
