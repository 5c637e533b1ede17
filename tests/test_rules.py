"""The Prometheus alert rules (deploy/prometheus/gpuwear-rules.yml): promtool's check and unit
tests, metadata and runbook anchors, metric names against the golden expositions, and end to
end against a real Prometheus scraping the simulated daemon.

The end-to-end machinery here (daemon + Prometheus, always stopped, logs in failure messages)
is reused by tests/test_dashboards.py. Needs Debian's ``prometheus`` package.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from helpers import free_ports, logs_on_failure, poll_until, require, started

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "gpuwear-rules.yml"
DCGM_COMPAT = REPO / "deploy" / "prometheus" / "dcgm-compat-rules.yml"
RULE_TESTS = sorted((REPO / "deploy" / "prometheus" / "tests").glob("*.yml"))
EXAMPLE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
GOLDEN = sorted((REPO / "tests" / "golden").glob("*.prom"))
RUNBOOK = REPO / "docs" / "alerts.md"
RUNBOOK_URL = "file:///opt/gpuwear/share/doc/gpuwear/alerts.md"  # where install.sh puts it with the default PREFIX
SCENARIOS = REPO / "tests" / "scenarios"
JOB = "gpuwear"
SEVERITIES = {"critical", "warning", "info"}
# Alerts about the daemon or its ledger, not about one GPU: no gpu/uuid label to quote.
DAEMON_ALERTS = {"GpuwearDaemonDown", "GpuwearDaemonAbsent", "GpuwearLedgerNotPersisting",
                 "GpuwearLedgerMovedAside"}
UUID_ALERTS = {"GpuwearGpuMissing"}  # a GPU NVML does not list has no index: named by its UUID alone
PCI_ALERTS = {"GpuwearGpuNotEnumerated"}  # a GPU NVML never listed has neither: named by its PCI address
HOST_ALERTS = {"GpuwearNvswitchFatalSxid"}  # the host's NVLink fabric: no GPU to name, the node

T = TypeVar("T")


# --- rules and metric names ------------------------------------------------------------------

def load_rules(path: Path = RULES) -> list[dict[str, Any]]:
    """Every rule of the file, each with its group's name under ``group``."""
    doc = yaml.safe_load(path.read_text())
    return [{**rule, "group": group["name"]} for group in doc["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in load_rules() if "alert" in rule}


def golden_metric_names() -> set[str]:
    """Metric names the daemon exposes (``# TYPE`` lines of the golden files), with the
    ``_bucket``/``_sum``/``_count`` series of histograms and summaries, plus Prometheus' ``up``."""
    names = {"up"}
    for path in GOLDEN:
        for line in path.read_text().splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(maxsplit=3)
                names.add(name)
                if kind in ("histogram", "summary"):
                    names.update(f"{name}{suffix}" for suffix in ("_sum", "_count"))
                if kind == "histogram":
                    names.add(f"{name}_bucket")
    return names


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_CLAUSES = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset",
             "bool", "atan2", "inf", "nan", "start", "end"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (function names, keywords, label
    matchers, ranges, durations and string literals are not metric names)."""
    text = _STRINGS.sub('""', expr)
    for pattern in (_MATCHERS, _RANGES, _CLAUSES):
        text = pattern.sub(" ", text)
    return {name for name in _IDENTIFIER.findall(text) if name not in _KEYWORDS}


def unknown_metric_names(expr: str, known: set[str]) -> set[str]:
    return promql_metric_names(expr) - known


def template_queries(text: str) -> list[str]:
    """PromQL inside the annotation templates' `query` calls (the backquoted printf formats)."""
    return [q.replace("%s", "x") for q in re.findall(r"`([^`]*)`", text) if "{" in q or "(" in q]


# --- end to end: the daemon and a real Prometheus ---------------------------------------------

DAEMON_READY_SECONDS = 20.0
PROMETHEUS_READY_SECONDS = 60.0
POLL_SECONDS = 0.5
SPEED = 60

# urllib would send even loopback requests through $http_proxy: never use a proxy here.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))






def http_get(url: str) -> tuple[int, str] | None:
    """(status, body), or None when nothing answers."""
    try:
        with _HTTP.open(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None










@dataclass
class Stack:
    """A running daemon and the Prometheus server scraping it."""

    daemon: subprocess.Popen[bytes]
    prometheus: subprocess.Popen[bytes]
    prometheus_addr: str

    def poll(self, what: str, seconds: float, attempt: Callable[[], T | None]) -> T:
        """Call ``attempt`` until it returns something other than None; fail early when a process died."""
        return poll_until(what, seconds, {"gpuwear": self.daemon, "prometheus": self.prometheus}, attempt,
                          POLL_SECONDS)

    def api(self, path: str, **params: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, decoded reply) of a Prometheus API call."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        reply = http_get(f"http://{self.prometheus_addr}/api/v1/{path}{query}")
        assert reply is not None, f"Prometheus did not answer /api/v1/{path}"
        status, body = reply
        return status, json.loads(body)

    def query(self, promql: str) -> list[dict[str, Any]]:
        status, reply = self.api("query", query=promql)
        assert status == 200 and reply["status"] == "success", f"{promql}: {status} {reply}"
        result: list[dict[str, Any]] = reply["data"]["result"]
        return result

    def firing(self) -> list[dict[str, Any]]:
        _, reply = self.api("alerts")
        return [a for a in reply["data"]["alerts"] if a["state"] == "firing"]


@contextmanager
def daemon_and_prometheus(tmp_path: Path, scenario: str, gpus: int, rules: Path | None = None,
                          speed: int = SPEED) -> Iterator[Stack]:
    """The daemon on ``scenario`` at --speed ``speed`` (60), scraped every second by a Prometheus server
    evaluating ``rules`` every second; ready once Prometheus holds all ``gpus`` GPUs."""
    prometheus_bin = require("prometheus")
    daemon_port, prometheus_port = free_ports(2)
    daemon_addr, prometheus_addr = f"127.0.0.1:{daemon_port}", f"127.0.0.1:{prometheus_port}"
    daemon_log, prometheus_log = tmp_path / "gpuwear.log", tmp_path / "prometheus.log"

    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == JOB]
    job["static_configs"] = [{"targets": [daemon_addr]}]
    config["rule_files"] = [str(rules)] if rules is not None else []
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))

    with ExitStack() as stack:
        stack.enter_context(logs_on_failure(daemon_log, prometheus_log))
        daemon = stack.enter_context(started(
            [sys.executable, "-m", "gpuwear", "run", "--simulate", scenario, "--speed", str(speed),
             "--listen", daemon_addr, "--state-dir", str(tmp_path / "state")], daemon_log, tmp_path))
        deadline = time.monotonic() + DAEMON_READY_SECONDS
        while True:
            assert daemon.poll() is None, f"gpuwear exited with code {daemon.returncode} at start"
            reply = http_get(f"http://{daemon_addr}/metrics")
            if reply is not None and "gpuwear_backend_info" in reply[1]:
                break
            assert time.monotonic() < deadline, "the daemon's /metrics did not come up"
            time.sleep(0.1)
        prometheus = stack.enter_context(started(
            [prometheus_bin, f"--config.file={config_path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address={prometheus_addr}"], prometheus_log, tmp_path))
        rig = Stack(daemon, prometheus, prometheus_addr)

        def all_gpus() -> bool | None:
            reply = http_get(f"http://{prometheus_addr}/api/v1/query?query=gpuwear_gpu_up")
            if reply is None or reply[0] != 200:
                return None
            return True if len(json.loads(reply[1])["data"]["result"]) == gpus else None

        rig.poll(f"Prometheus to hold the {gpus} GPUs", PROMETHEUS_READY_SECONDS, all_gpus)
        yield rig


def rules_without_holds(path: Path) -> Path:
    """A copy of the rules with every ``for:`` set to 0s (alerts fire at their first evaluation)."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "0s"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


# --- static checks ----------------------------------------------------------------------------

def test_promtool_check_rules_passes_without_warnings() -> None:
    check = subprocess.run([require("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                           check=False)
    output = check.stdout + check.stderr
    assert check.returncode == 0, output
    assert "SUCCESS" in output, output
    assert "warn" not in output.lower(), output


def test_the_fleet_rules_check_keep_few_labels_and_count_the_critical_xids() -> None:
    """Issue 56, item 2: recording rules for a fleet's long-range questions, checked by promtool, every series with
    at most job, instance, gpu, uuid (and name on the product series), far under Mimir's 30 labels, and its
    incidents the XIDs GpuwearXidCritical reads (the tier act)."""
    fleet = REPO / "deploy" / "prometheus" / "gpuwear-fleet-rules.yml"
    check = subprocess.run([require("promtool"), "check", "rules", str(fleet)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0 and "warn" not in (check.stdout + check.stderr).lower(), check.stdout + check.stderr
    rules = [r for g in yaml.safe_load(fleet.read_text())["groups"] for r in g["rules"]]
    kept = {"job", "instance", "gpu", "uuid"}
    for r in rules:
        by = {label.strip() for group in re.findall(r"by \(([^)]*)\)", r["expr"]) for label in group.split(",")}
        extra = {"gpuwear:gpu_product": {"name"}, "gpuwear:health_reason:max1h": {"code"}}.get(r["record"], set())
        assert by and by <= kept | extra, r["record"]
    (incidents,) = [r for r in rules if r["record"] == "gpuwear:xid_critical_events:lifetime"]
    critical = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                    if r.get("alert") == "GpuwearXidCritical")
    selectors = set(re.findall(r"gpuwear_xid_\w+(\{[^}]*\})?", critical["expr"]))
    assert selectors == {'{tier="act"}'} and selectors <= set(re.findall(r"gpuwear_xid_\w+(\{[^}]*\})?",
                                                                          incidents["expr"]))
    assert "../gpuwear-fleet-rules.yml" in (REPO / "deploy" / "prometheus" / "tests" / "fleet.yml").read_text()


@pytest.mark.slow
def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool rule tests in deploy/prometheus/tests/"
    run = subprocess.run([require("promtool"), "test", "rules", *map(str, RULE_TESTS)], capture_output=True,
                         text=True, check=False, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alerts())
    assert not names - fires, f"alerts never tested firing: {sorted(names - fires)}"
    assert not names - silent, f"alerts never tested silent: {sorted(names - silent)}"
    assert not (fires | silent) - names, f"tests for alerts that do not exist: {sorted((fires | silent) - names)}"


def test_alert_groups() -> None:
    groups = {rule["group"] for rule in alerts().values()}
    assert groups == {"gpuwear-thermal-stress", "gpuwear-health", "gpuwear-operations", "gpuwear-wear-budget"}


@pytest.mark.parametrize("name", sorted(alerts()))
def test_alert_metadata(name: str) -> None:
    rule = alerts()[name]
    assert name.startswith("Gpuwear"), name
    assert rule["labels"]["severity"] in SEVERITIES, rule["labels"]
    annotations = rule["annotations"]
    assert set(annotations) >= {"summary", "description", "runbook_url"}, annotations
    assert annotations["runbook_url"] == f"{RUNBOOK_URL}#{name.lower()}"  # absolute (install.sh sets it)
    if name in UUID_ALERTS:
        for label in ("$labels.uuid", "$labels.instance"):
            assert label in annotations["description"], f"{name}: description does not quote {label}"
        assert "$labels.uuid" in annotations["summary"], f"{name}: summary does not name the GPU"
    elif name in PCI_ALERTS:
        for label in ("$labels.pci_address", "$labels.instance"):
            assert label in annotations["description"], f"{name}: description does not quote {label}"
        assert "$labels.pci_address" in annotations["summary"], f"{name}: summary does not name the GPU"
    elif name in HOST_ALERTS:
        assert "$labels.instance" in annotations["description"], f"{name}: description does not quote the node"
        assert "$labels.instance" in annotations["summary"], f"{name}: summary does not name the node"
    elif name not in DAEMON_ALERTS:
        for label in ("$labels.gpu", "$labels.uuid", "$labels.instance"):
            assert label in annotations["description"], f"{name}: description does not quote {label}"
        assert "$labels.gpu" in annotations["summary"], f"{name}: summary does not name the GPU"


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_anchors() -> set[str]:
    return {_slug(line.lstrip("#")) for line in RUNBOOK.read_text().splitlines() if line.startswith("#")}


def test_runbook_has_a_section_for_every_alert() -> None:
    anchors = runbook_anchors()
    missing = sorted(name for name, rule in alerts().items()
                     if rule["annotations"]["runbook_url"].split("#", 1)[1] not in anchors)
    assert not missing, f"docs/alerts.md has no section for {missing}"
    assert "loading-the-rules" in anchors


def test_rule_expressions_use_only_exported_metrics() -> None:
    """Every name a rule reads is exported, or recorded by a rule of the same file (the XID alerts' held counts)."""
    rules = load_rules()
    known = golden_metric_names() | {rule["record"] for rule in rules if "record" in rule}
    for rule in rules:
        assert not unknown_metric_names(rule["expr"], known), (rule.get("alert"), rule["expr"])
        for text in rule.get("annotations", {}).values():
            for query in template_queries(text):
                assert not unknown_metric_names(query, known), (rule.get("alert"), query)


def test_the_dcgm_names_read_only_exported_metrics_and_are_each_tested() -> None:
    """deploy/prometheus/dcgm-compat-rules.yml: DCGM's names from gpuwear's metrics (or the label helper), each one
    recorded once; tests/dcgm-compat.yml (run by the promtool test above) checks most of them value by value."""
    compat = load_rules(DCGM_COMPAT)
    known = golden_metric_names() | {"gpuwear:dcgm_labels"}
    names = [rule["record"] for rule in compat]
    assert len(set(names)) == len(names) and names[0] == "gpuwear:dcgm_labels"
    assert all(name.startswith("DCGM_FI_DEV_") for name in names[1:]), names
    for rule in compat:
        assert not unknown_metric_names(rule["expr"], known), (rule["record"], rule["expr"])
    tested = set(re.findall(r"expr: (DCGM_FI_DEV_\w+)", (DCGM_COMPAT.parent / "tests" / "dcgm-compat.yml").read_text()))
    assert len(tested) >= 12 and tested <= set(names), sorted(tested - set(names))


def test_metric_name_check_can_fail() -> None:
    known = golden_metric_names()
    assert "gpuwear_temperature_celsius" in known and "up" in known
    # a made-up name, a misspelling, and a histogram series of a gauge are all rejected
    assert unknown_metric_names('rate(gpuwear_made_up_total{gpu="0"}[5m]) > 0', known) == {"gpuwear_made_up_total"}
    assert unknown_metric_names("gpuwear_temperature_celcius > 80", known) == {"gpuwear_temperature_celcius"}
    assert unknown_metric_names("gpuwear_sample_duration_seconds_bucket", known) == {
        "gpuwear_sample_duration_seconds_bucket"}
    # functions, keywords, clauses, matchers, durations and strings are not metric names
    expr = ('sum without(range) (increase(gpuwear_lifetime_thermal_cycles_total{range=~"20-40|40\\\\+"}[1h])) '
            '> 6 or on(instance) label_replace(vector(0), "xid", "none", "", "") unless '
            'gpuwear_xid_events_total offset 14d and bool_metric_x')
    assert promql_metric_names(expr) == {"gpuwear_lifetime_thermal_cycles_total", "gpuwear_xid_events_total",
                                         "bool_metric_x"}
    assert template_queries('{{ with printf `gpuwear_nope{uuid="%s"}` $labels.uuid | query }}') == [
        'gpuwear_nope{uuid="x"}']


def test_scenarios_for_the_end_to_end_tests_load() -> None:
    from gpuwear.sim.simulated import load_scenario

    overheat = load_scenario(str(SCENARIOS / "overheat.yaml"))
    assert [g.product.key for g in overheat.gpus] == ["rtx4090", "h100-sxm"]
    assert {f.kind for f in overheat.faults} >= {"remap_rows", "xid"}
    cool = load_scenario(str(SCENARIOS / "cool.yaml"))
    assert not cool.faults


# --- end to end -------------------------------------------------------------------------------

# Expected to fire on tests/scenarios/overheat.yaml (GPU 0: overheating RTX 4090, GPU 1: H100
# with an XID 79, an uncorrectable ECC error and a failed row remap).
OVERHEAT_REQUIRED = {
    ("GpuwearGpuTemperatureNearSlowdown", "0"), ("GpuwearHardwareThermalSlowdown", "0"),
    ("GpuwearThermalThrottling", "0"), ("GpuwearRowRemapFailure", "1"), ("GpuwearRowRemapPending", "1"),
    ("GpuwearUncorrectableEccError", "1"), ("GpuwearXidCritical", "1"), ("GpuwearHealthAct", "1"),
}
# May also fire there, on either card (both run hot in a 45 °C room; fans at full speed);
# anything else is a false alarm.
OVERHEAT_ALLOWED = {"GpuwearGpuTemperatureNearSlowdown", "GpuwearMemoryTemperatureNearMax", "GpuwearFanAtMaximum",
                    "GpuwearThermalThrottling", "GpuwearHardwareThermalSlowdown", "GpuwearThermalAgingFast",
                    "GpuwearHealthWatch", "GpuwearRapidThermalCycling"}
ALERT_WAIT_SECONDS = 90.0
QUIET_SECONDS = 16.0
SETTLE_SECONDS = 3.0  # rule evaluations after the first scrape (absent(up) holds until then)


def _assert_rules_healthy(rig: Stack) -> None:
    _, reply = rig.api("rules")
    rules = [rule for group in reply["data"]["groups"] for rule in group["rules"]]
    assert len(rules) == len(load_rules()), f"Prometheus loaded {len(rules)} rules"
    broken = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
    assert not broken, f"rules failing to evaluate: {broken}"


@pytest.mark.slow
@pytest.mark.e2e
def test_overheat_scenario_fires_the_expected_alerts(tmp_path: Path) -> None:
    rules = rules_without_holds(tmp_path / "rules.yml")
    with daemon_and_prometheus(tmp_path, str(SCENARIOS / "overheat.yaml"), gpus=2, rules=rules) as rig:
        time.sleep(SETTLE_SECONDS)
        seen: dict[tuple[str, str], dict[str, Any]] = {}

        def required_seen() -> bool | None:
            for alert in rig.firing():
                seen.setdefault((alert["labels"]["alertname"], alert["labels"].get("gpu", "")), alert)
            return True if OVERHEAT_REQUIRED <= set(seen) else None

        try:
            rig.poll("the expected alerts to fire", ALERT_WAIT_SECONDS, required_seen)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; missing {sorted(OVERHEAT_REQUIRED - set(seen))}, "
                                 f"firing {sorted(seen)}") from None
        _assert_rules_healthy(rig)
        unexpected = {key for key in seen if key not in OVERHEAT_REQUIRED and key[0] not in OVERHEAT_ALLOWED}
        assert not unexpected, f"false alarms: {sorted(unexpected)}"
        for alert in seen.values():
            text = " ".join(alert["annotations"].values())
            assert "<no value>" not in text and "error expanding" not in text, alert
            assert alert["labels"]["severity"] in SEVERITIES
        near = seen[("GpuwearGpuTemperatureNearSlowdown", "0")]["annotations"]["description"]
        assert "its slowdown threshold is 95 °C" in near, near  # the card's own limit, read by a query template
        xid = seen[("GpuwearXidCritical", "1")]
        assert xid["labels"]["tier"] == "act" and xid["labels"]["severity"] == "critical", xid
        assert xid["annotations"]["summary"].endswith("reported XID 79"), xid  # the code, read by a query template
        assert seen[("GpuwearHealthAct", "1")]["annotations"]["description"].count("row_remap_failure") == 1


@pytest.mark.slow
@pytest.mark.e2e
def test_cool_scenario_stays_silent(tmp_path: Path) -> None:
    rules = rules_without_holds(tmp_path / "rules.yml")
    with daemon_and_prometheus(tmp_path, str(SCENARIOS / "cool.yaml"), gpus=2, rules=rules) as rig:
        time.sleep(SETTLE_SECONDS)
        fired: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + QUIET_SECONDS
        while time.monotonic() < deadline:
            for alert in rig.firing():
                fired.setdefault(alert["labels"]["alertname"], alert)
            time.sleep(POLL_SECONDS)
        _assert_rules_healthy(rig)
        assert not fired, f"alerts fired on idle cards in a cool room: {json.dumps(fired, indent=1)}"
        # the rules did see the daemon: both "ok", the RTX 4090's memory health a reason of severity unknown (no ECC,
        # no memory sensor)
        verdicts = {s["metric"]["gpu"]: s["metric"]["status"] for s in rig.query("gpuwear_health_status == 1")}
        assert verdicts == {"0": "ok", "1": "ok"}, verdicts
        unknown = {s["metric"]["gpu"] for s in rig.query('gpuwear_health_reason{severity="unknown"} == 1')}
        assert unknown == {"0"}, unknown


def test_the_shipped_prometheus_config_loads_the_rules(tmp_path: Path) -> None:
    """deploy/prometheus/prometheus.yml with gpuwear-rules.yml beside it, as the docs install them: promtool finds
    every alert. Before: the example had no rule_files, so a Prometheus set up from it never alerted."""
    promtool = require("promtool")
    for source in (EXAMPLE_CONFIG, RULES):
        (tmp_path / source.name).write_text(source.read_text())
    out = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    rules = len([r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]])
    assert f"SUCCESS: {rules} rules found" in out.stdout + out.stderr, out.stdout + out.stderr

