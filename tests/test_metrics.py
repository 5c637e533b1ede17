"""The metric table and the exposition: golden files per scenario, checked by promtool."""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
import subprocess
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, Rig, make_rig
from gpuwear.config import WearConfig
from gpuwear.families import GpuwearCollector
from gpuwear.metrics import DAEMON_METRICS, GPU_METRICS, WEAR_METRICS, DaemonInfo, LedgerStatus, Published
from gpuwear.sim.simulated import builtin_scenarios
from gpuwear.tracker import WearTracker
from gpuwear.wear.accumulate import FIRST_READS, GpuWear
from helpers import examples

GOLDEN = REPO / "tests" / "golden"
SCENARIOS = [*builtin_scenarios(), str(REPO / "tests" / "scenarios" / "faults.yaml")]
UNIT_SUFFIXES = ("celsius", "watts", "joules", "ratio", "hertz", "bytes", "seconds", "rpm")


def exposition(rig: Rig, scenario: str, tracker: WearTracker | None = None, detail: bool = False) -> str:
    registry = CollectorRegistry(auto_describe=False)
    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario=scenario)
    status = LedgerStatus(True, 1_800_000_000.0, 0, False) if tracker else None
    registry.register(GpuwearCollector(
        lambda: Published(rig.sampler.snapshot, tracker.views if tracker else {}, status, info), detail))
    return generate_latest(registry).decode()


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (apt-get install prometheus)"
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)


@pytest.mark.parametrize(("scenario", "detail"), [*((s, False) for s in SCENARIOS), ("demo", True)],
                         ids=lambda v: Path(v).stem if isinstance(v, str) else "detail" if v else "")
def test_golden_exposition(scenario: str, detail: bool, request: pytest.FixtureRequest) -> None:
    """Each scenario's exposition as exported by default, and the demo's with metrics.detail (every family)."""
    rig = make_rig(scenario)
    tracker = WearTracker({}, WearConfig())
    for _ in range(600):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    text = exposition(rig, Path(scenario).stem, tracker, detail)
    golden = GOLDEN / f"{Path(scenario).stem}{'-detail' if detail else ''}.prom"
    if request.config.getoption("--update-golden"):
        golden.write_text(text)
    assert golden.exists(), f"{golden} missing: run pytest --update-golden"
    assert text == golden.read_text(), f"exposition differs from {golden}; if intended, run pytest --update-golden"
    result = promtool_check(text)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), result


def test_unsupported_values_are_absent_never_zero(demo: Rig) -> None:
    demo.run(5)
    families = {f.name: f for f in text_string_to_metric_families(exposition(demo, "demo", detail=True))}
    memory = [s for s in families["gpuwear_temperature_celsius"].samples if s.labels["sensor"] == "memory"]
    assert [s.labels["gpu"] for s in memory] == ["1"]  # the RTX 4090 has no memory sensor
    assert {s.labels["gpu"] for s in families["gpuwear_fan_speed_ratio"].samples} == {"0"}
    assert {s.labels["gpu"] for s in families["gpuwear_ecc_errors"].samples} == {"1"}
    assert {s.labels["gpu"] for s in families["gpuwear_violation_seconds"].samples} == {"1"}


def test_lost_gpu_series(demo: Rig) -> None:
    demo.run(5)
    demo.simulation.gpus[0].state.lost = True
    demo.run(1)
    text = exposition(demo, "demo")
    assert 'gpuwear_gpu_up{gpu="0",uuid="GPU-00000001-5111-4a7e-9c3d-000000000000"} 0.0' in text
    assert not re.search(r'gpuwear_power_watts\{gpu="0"', text)
    assert re.search(r'gpuwear_power_watts\{gpu="1"', text)
    assert 'gpuwear_sample_errors_total{gpu="0",kind="gpu_lost"' in text


def test_xids_are_a_lifetime_counter_per_tier_and_per_code_with_detail(demo: Rig) -> None:
    """By default by the alert their code raises (act, watch) over the card's life in the ledger, 0 before the first
    (issue 56: what a fleet reads must outlive restarts), neither for a code the catalog says to ignore (43) or whose
    line decides (74); since the daemon started, per code, with metrics.detail (the series budget: per-code detail
    only there). A new process over the same ledger (a restart: the sampler's counts start again at 0) still shows
    the card's lifetime counts."""
    wears: dict[str, GpuWear] = {}
    tracker = WearTracker(wears, WearConfig())
    tiers = r'gpuwear_xid_tier_events_total\{gpu="1",tier="(\w+)",uuid="[^"]+"\} (\S+)'
    demo.run(1)
    tracker.observe(demo.sampler.snapshot, demo.clock.monotonic(), demo.clock.wall())
    assert re.findall(tiers, exposition(demo, "demo", tracker)) == [("act", "0.0"), ("watch", "0.0")]
    for code in (79, 79, 48, 13, 43, 74):
        demo.sampler.record_xid(1, code)
    demo.run(1)
    tracker.observe(demo.sampler.snapshot, demo.clock.monotonic(), demo.clock.wall())
    text = exposition(demo, "demo", tracker)
    assert re.findall(tiers, text) == [("act", "3.0"), ("watch", "1.0")]
    assert "gpuwear_xid_events_total{" not in text and "last_xid" not in text
    restarted = make_rig("demo")
    gate = WearConfig().cycles.hysteresis_celsius  # through the ledger's JSON, as a restart reads it
    after = WearTracker({u: GpuWear.from_json(json.loads(json.dumps(w.to_json())), gate) for u, w in wears.items()},
                        WearConfig())
    restarted.run(1)
    after.observe(restarted.sampler.snapshot, restarted.clock.monotonic(), restarted.clock.wall())
    assert re.findall(tiers, exposition(restarted, "demo", after)) == [("act", "3.0"), ("watch", "1.0")]
    detail = exposition(demo, "demo", tracker, detail=True)
    assert re.findall(r'gpuwear_xid_events_total\{gpu="1",uuid="[^"]+",xid="(\d+)"\} (\S+)', detail) == \
        [("13", "1.0"), ("43", "1.0"), ("48", "1.0"), ("74", "1.0"), ("79", "2.0")]


def test_metric_table_follows_conventions() -> None:
    names = [m.name for m in (*GPU_METRICS, *DAEMON_METRICS, *WEAR_METRICS)]
    assert len(names) == len(set(names))
    for m in [*GPU_METRICS, *DAEMON_METRICS, *WEAR_METRICS]:
        assert m.name.startswith("gpuwear_"), m.name
        assert m.kind in ("gauge", "counter", "info"), m.name
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert (m.kind == "info") == m.name.endswith("_info"), m.name
        base = m.name.removesuffix("_total")
        if m.unit:
            assert base.endswith("_" + m.unit), m.name
        else:
            assert not base.endswith(UNIT_SUFFIXES), m.name
        assert m.help.endswith("."), m.name
        # ASCII: one other character in a help text made every scrape's 60 kB body a wide string, joined and encoded
        # to UTF-8 character by character (15 times the time of an ASCII body's join and encode)
        assert m.help.isascii(), m.name
    for m in (*GPU_METRICS, *WEAR_METRICS):
        assert not {"gpu", "uuid"} & set(m.labels), m.name
        assert "name" not in m.labels or m.name == "gpuwear_gpu_info", m.name


def test_exposition_is_rendered_once_per_published_state(demo: Rig) -> None:
    from gpuwear.collector import Exposition

    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="demo")
    tracker = WearTracker({}, WearConfig())
    published = lambda: Published(demo.sampler.snapshot, tracker.views, None, info)  # noqa: E731
    exposition = Exposition(published)
    demo.run(1)
    tracker.observe(demo.sampler.snapshot, demo.clock.monotonic(), demo.clock.wall())
    first = exposition.render(False)
    assert exposition.render(False) == first and exposition.renders == 1  # same state: cached
    demo.run(1)
    tracker.observe(demo.sampler.snapshot, demo.clock.monotonic(), demo.clock.wall())
    second = exposition.render(False)
    assert second != first and exposition.renders == 2  # a new tick: rendered again
    assert b"gpuwear_lifetime_observed_seconds_total" in second
    assert exposition.render(True).endswith(b"# EOF\n") and exposition.renders == 3
    assert exposition.render(False) == second and exposition.render(True) and exposition.renders == 3  # both kept


def test_a_scrape_never_serves_the_body_of_an_earlier_state(demo: Rig) -> None:
    """Hundreds of ticks, each published as new objects made where the last ones lay once freed (as CPython's
    allocator does now and then after a tick: issue 27 saw 13 stale scrapes of 4,000 on the demo rig): every scrape's
    body is that of the state it was asked for. The cache holds what it is keyed on, so the objects of the body it
    keeps are never freed, and no new state can take their place."""
    from gpuwear.collector import Exposition
    from gpuwear.sampler import Snapshot

    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="demo")
    tracker = WearTracker({}, WearConfig())
    demo.run(1)
    tracker.observe(demo.sampler.snapshot, demo.clock.monotonic(), demo.clock.wall())
    snapshot, views = demo.sampler.snapshot, dict(tracker.views)

    def made_at(address: int, make: Callable[[], object]) -> object:
        """A new object at ``address`` if the allocator hands it out within 200 tries, else the last one made."""
        tries = [make()]
        while id(tries[-1]) != address and len(tries) < 200:
            tries.append(make())
        return tries[-1]

    holder = [Published(Snapshot(snapshot.gpus, snapshot.system, 0), views, None, info)]
    exposition = Exposition(lambda: holder[0], process=False)
    stale, reused = [], 0
    for tick in range(1, 401):
        for gzipped in (False, True):
            body = exposition.render(False, gzipped)
            if f"gpuwear_sampler_ticks_total {tick - 1}.0\n".encode() not in (gzip.decompress(body) if gzipped
                                                                                else body):
                stale.append((tick - 1, gzipped))
        addresses = id(holder[0].snapshot), id(holder[0].wear)
        del holder[0]  # the last state freed before the next is made, as the sampler and tracker do
        state = made_at(addresses[0], lambda tick=tick: Snapshot(snapshot.gpus, snapshot.system, tick))
        wear = made_at(addresses[1], lambda: dict(views))
        reused += (id(state), id(wear)) == addresses
        holder.append(Published(state, wear, None, info))  # type: ignore[arg-type]
        del state, wear
    assert not stale, f"{len(stale)} stale bodies of 800 ({reused} states at the last one's addresses): {stale[:3]}"
    # and with the real sampler and tracker: a scrape every 3 ticks
    exposition = Exposition(lambda: Published(demo.sampler.snapshot, tracker.views, None, info), process=False)
    for _ in range(200):
        demo.run(3)
        tracker.observe(demo.sampler.snapshot, demo.clock.monotonic(), demo.clock.wall())
        ticks = demo.sampler.snapshot.ticks
        assert f"gpuwear_sampler_ticks_total {ticks}.0\n".encode() in exposition.render(False), ticks


@pytest.mark.parametrize("detail", [False, True], ids=["default", "detail"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: Path(s).stem)
def test_encode_writes_what_prometheus_client_writes(scenario: str, detail: bool) -> None:
    """The daemon's own encoder against prometheus_client's two encoders over the collector's families, byte for
    byte, on every scenario (lost GPUs, faults, hostile label values, both formats)."""
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    from gpuwear.collector import encode

    rig = make_rig(scenario)
    tracker = WearTracker({}, WearConfig())
    info = DaemonInfo(version='1.0 "odd"\\ \nversion', python_version="3", backend="simulated", scenario=scenario)
    for _ in range(120):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    # then later states, every 20 ticks for 600 (the faults scenario's memory errors, replays, a lost GPU: twenty slow
    # reads), encoded with the lines, prefixes and numbers cached
    # from earlier ones
    for ticks, status in ((0, None), (0, LedgerStatus(False, 1_800_000_000.0, 3, True)), *((20, None),) * 30):
        for _ in range(ticks):
            rig.run(1)
            tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        pub = Published(rig.sampler.snapshot, tracker.views, status, info)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GpuwearCollector(lambda pub=pub: pub, detail))  # type: ignore[misc]
        assert encode(pub, False, detail=detail) == generate_latest(registry)
        assert encode(pub, True, detail=detail) == openmetrics_latest(registry)


@pytest.mark.parametrize("detail", [False, True], ids=["default", "detail"])
def test_encode_writes_what_prometheus_client_writes_for_a_long_life(detail: bool) -> None:
    """A card with years of history: lifetime seconds, joules and cycles far above 10^6, which Go (and so Prometheus
    and prometheus_client) writes with an exponent, each changing at every tick."""
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    from gpuwear.collector import encode

    rig = make_rig("training")
    tracker = WearTracker({}, WearConfig())
    for _ in range(120):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    stored = {}
    for uuid, w in tracker._wears.items():
        for _ in range(20):  # 2^20 times the history: 120 s of it becomes four years
            w = w.merged(w)
        stored[uuid] = w
    tracker.adopt(stored, {})
    info = DaemonInfo(version="1", python_version="3", backend="simulated", scenario="training")
    big: set[bytes] = set()
    for _ in range(5):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        pub = Published(rig.sampler.snapshot, tracker.views, None, info)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GpuwearCollector(lambda pub=pub: pub, detail))  # type: ignore[misc]
        text = encode(pub, False, detail=detail)
        assert text == generate_latest(registry)
        assert encode(pub, True, detail=detail) == openmetrics_latest(registry)
        big = {m.group(1) for m in re.finditer(rb"^(gpuwear_\w+)\{[^}]*\} \d\.\d+e\+\d\d$", text, re.M)}
    assert {b"gpuwear_lifetime_observed_seconds_total", b"gpuwear_lifetime_energy_joules_total",
            b"gpuwear_lifetime_attributed_seconds_total", b"gpuwear_thermal_aging_equivalent_seconds"} <= big


@settings(max_examples=examples(3000), deadline=None)
@given(st.floats() | st.integers(-2**60, 2**60).map(float) | st.sampled_from(
    [0.0, -0.0, 1e6, -1e6, 999999.9999999999, 1e16, 1.5e16, 123456789012345.6, 2e9, 1e22, 5e-324]))
def test_numbers_are_written_as_prometheus_client_writes_them(value: float) -> None:
    """The encoder's number against prometheus_client's floatToGoString (Go's formatting): every float, the
    whole numbers and the edges of its repr and exponent forms."""
    from prometheus_client.utils import floatToGoString

    from gpuwear.collector import _go, _number

    assert _number(value) == _go(value) == floatToGoString(value)
    if math.isfinite(value):  # whole numbers as ints (counts): _number hands them to _go, the copy of floatToGoString
        assert _number(int(value)) == floatToGoString(int(value))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", 'q"\\\n', "x" * 40]), st.sampled_from(
    [0.0, -0.0, 1.0, 1e6, math.nan, math.inf, 2.5]) | st.floats()), max_size=12))
def test_a_series_line_is_its_labels_and_value_whatever_came_before(series: list[tuple[str, float]]) -> None:
    """The one cache of the encoder, each series' ``name{labels} `` kept by its label values, never hands one
    series' prefix to another nor an old value: each line is what prometheus_client writes for it, also when the
    cache is full and starts again."""
    from prometheus_client.utils import floatToGoString

    from gpuwear.collector import _ESCAPED, _PREFIXES, _Family
    from gpuwear.metrics import MetricDef

    family = _Family.of(MetricDef("x", "gauge", "", "x", ("k",), lambda one: [one]), ("gpu",))
    for k in range(_PREFIXES - 2):  # nearly full: the series below fill it, and it is cleared
        family.write([], [(((f"filler{k}",), 1.0), ("0",))])
    for label, value in series:
        out: list[str] = []
        assert family.write(out, [(((label,), value), ("0",))]) == 1
        assert out == [f'x{{gpu="0",k="{label.translate(_ESCAPED)}"}} {floatToGoString(value)}\n']
    assert len(family.prefixes[("0",)]) <= _PREFIXES


def _samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


# the health signals of the series budget (links, incidents, error rates): 10 series of a GPU's 60
HEALTH_SIGNALS = {"gpuwear_nvlink_errors_total", "gpuwear_nvlink_links_active", "gpuwear_pcie_link_downgraded",
                  "gpuwear_pcie_replays_total", "gpuwear_ecc_errors_total", "gpuwear_xid_events_total",
                  "gpuwear_xid_tier_events_total", "gpuwear_xid_last",
                  "gpuwear_gpu_missing_last_seen_timestamp_seconds"}
# XIDs of each kind on each GPU: the application tier (13), watch (a code newer than the catalog), act (48), one the
# catalog says to ignore (43) and one its line decides (74). Each code is a verdict reason while its rule holds it
# (a wear and telemetry series); by default none is a series of its own.
XIDS_OF_EACH_KIND = (13, 43, 48, 74, 250)


def _xids_of_each_kind(rig: Rig) -> None:
    for index in range(len(rig.sampler.snapshot.gpus)):
        for code in XIDS_OF_EACH_KIND:
            rig.sampler.record_xid(index, code)


VERDICT = {"gpuwear_health_status", "gpuwear_health_reason"}


def _budget(default: dict[str, float]) -> dict[str, tuple[int, int, int]]:
    """GPU -> (its wear and telemetry series, its health-signal series, all its series) in an exposition: the
    verdict's counts in the last alone."""
    out: dict[str, tuple[int, int, int]] = {}
    for key in default:
        if (m := re.search(r'(?:^|[{,])gpu="([^"]*)"', key)) and 'uuid="' in key:
            wear, health, every = out.get(m.group(1), (0, 0, 0))
            family = key.split("{")[0]
            signal = family in HEALTH_SIGNALS
            out[m.group(1)] = (wear + (not signal and family not in VERDICT), health + signal, every + 1)
    return out


def _within(budget: dict[str, tuple[int, int, int]]) -> bool:
    return all(wear <= 50 and health <= 10 and every <= 60 for wear, health, every in budget.values())


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: Path(s).stem)
def test_the_default_set_is_part_of_the_detail_set_within_budget(scenario: str) -> None:
    """metrics.detail adds series and changes none; by default a GPU costs at most 60 series, 50 of wear and
    telemetry and 10 of health signals (docs/metrics.md)."""
    rig = make_rig(scenario)
    tracker = WearTracker({}, WearConfig())
    for tick in range(600):
        rig.run(1)
        if tick == 10:
            _xids_of_each_kind(rig)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    default = _samples(exposition(rig, "x", tracker))
    detail = _samples(exposition(rig, "x", tracker, detail=True))
    assert default.items() <= detail.items()
    budget = _budget(default)
    assert _within(budget), budget
    gpus = len(rig.sampler.snapshot.gpus)
    per_gpu = sum('uuid="' in key for key in default) / gpus
    assert sum('uuid="' in key for key in detail) / gpus > per_gpu + 30
    detail_only = {m.name for m in (*GPU_METRICS, *WEAR_METRICS) if m.detail}
    assert not any(key.split("{")[0].removesuffix("_total") in detail_only | {n.removesuffix("_total")
                                                                             for n in detail_only}
                   for key in default)
    assert not any('status="unknown"' in key or 'band="low"' in key or 'reason="gpu_idle"' in key for key in default)


def test_a_reload_switches_detail_at_the_next_render(demo: Rig) -> None:
    from gpuwear.collector import Exposition

    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="demo")
    tracker = WearTracker({}, WearConfig())
    demo.run(1)
    tracker.observe(demo.sampler.snapshot, demo.clock.monotonic(), demo.clock.wall())
    exposition = Exposition(lambda: Published(demo.sampler.snapshot, tracker.views, None, info), process=False)
    default = exposition.render(False)
    exposition.detail = True
    detail = exposition.render(False)
    assert b"gpuwear_performance_state" in detail and b"gpuwear_performance_state" not in default
    assert b"gpuwear_performance_state" in gzip.decompress(exposition.render(True, gzipped=True))
    exposition.detail = False
    assert exposition.render(False) != detail and b"gpuwear_performance_state" not in exposition.render(False)


def test_each_gzip_gives_the_plain_body_in_one_member_without_a_time(demo: Rig) -> None:
    """ISA-L's gzip (the isal extra: never a runtime dependency, whose failed build on a platform without its wheel
    failed the whole install) and zlib's (without it): the body Python's gzip reads back, byte for byte the plain
    one, one member with no time in its header (a body depends on its state alone); the daemon's default is ISA-L's
    where it is installed."""
    import importlib.util

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("isal")]
    assert [d.partition(">")[0] for d in project["optional-dependencies"]["isal"]] == ["isal"]

    from gpuwear.collector import Exposition, default_gzip, isal_gzip, zlib_gzip

    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="demo")
    tracker = WearTracker({}, WearConfig())
    demo.run(30)
    tracker.observe(demo.sampler.snapshot, demo.clock.monotonic(), demo.clock.wall())
    has_isal = importlib.util.find_spec("isal") is not None
    assert default_gzip() is (isal_gzip if has_isal else zlib_gzip)
    for compress in (isal_gzip, zlib_gzip) if has_isal else (zlib_gzip,):
        calls: list[int] = []

        def counted(body: bytes, compress: Callable[[bytes], bytes] = compress, calls: list[int] = calls) -> bytes:
            calls.append(len(body))
            return compress(body)

        exposition = Exposition(lambda: Published(demo.sampler.snapshot, tracker.views, None, info), process=False,
                                gzip=counted)
        for openmetrics in (False, True):
            plain, zipped = exposition.render(openmetrics), exposition.render(openmetrics, gzipped=True)
            assert calls[-1] == len(plain) and len(zipped) < len(plain) / 3, compress.__name__
            assert gzip.decompress(zipped) == plain, compress.__name__
            assert zipped[:4] == b"\x1f\x8b\x08\x00" and zipped[4:8] == bytes(4), (compress.__name__, zipped[:10])
            member = zlib.decompressobj(wbits=31)  # one gzip member, ending where the body ends
            assert member.decompress(zipped) == plain and member.eof and not member.unused_data, compress.__name__
        assert len(calls) == 2, compress.__name__  # once per state and format


def test_an_encoder_kept_across_states_writes_what_a_new_one_writes() -> None:
    """The encoder the daemon keeps (its series prefixes made once) against a new one for every state, both formats,
    across ticks where GPUs are lost and come back, jobs start and end, and detail is switched."""
    from gpuwear.collector import Encoder, encode

    rig = make_rig(str(REPO / "tests" / "scenarios" / "faults.yaml"))  # a GPU lost, memory errors, XIDs
    info = DaemonInfo(version="test", python_version="test", backend="simulated", scenario="x")
    tracker = WearTracker({}, WearConfig())
    kept = Encoder()
    for tick in range(300):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
        pub = Published(rig.sampler.snapshot, tracker.views, None, info)
        detail = tick % 7 == 3
        for openmetrics in (False, True):
            assert kept.encode(pub, openmetrics, b"x", detail) == encode(pub, openmetrics, b"x", detail), tick


def _fake_proc(root: Path, fds: int) -> Path:
    """A /proc of one process: its command name holds ") (" and spaces, as a hostile one may."""
    import resource

    me = root / "self"
    (me / "fd").mkdir(parents=True)
    for fd in range(fds):
        (me / "fd" / str(fd)).touch()
    (root / "stat").write_bytes(b"cpu  1 2 3 4\nintr 5\nbtime 1796000123\nprocesses 9\n")
    fields = [b"S", b"1"] + [str(i * 7 + 3).encode() for i in range(2, 50)]
    fields[11], fields[12], fields[19], fields[20], fields[21] = b"4321", b"987", b"2500000", b"1234567890123", b"98765"
    (me / "stat").write_bytes(b"4242 (gpu ) (wear x) " + b" ".join(fields) + b"\n")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    (me / "limits").write_bytes(b"Limit                     Soft Limit           Hard Limit           Units\n"
                                b"Max cpu time              unlimited            unlimited            seconds\n"
                                b"Max open files            %d                 %d                 files\n"
                                % (soft, soft))
    return root


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_process_metrics_are_prometheus_clients_byte_for_byte(tmp_path: Path, openmetrics: bool) -> None:
    """ProcessMetrics against prometheus_client's ProcessCollector over the same /proc: the same bytes."""
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
    from prometheus_client.process_collector import ProcessCollector

    from gpuwear.collector import ProcessMetrics

    proc = _fake_proc(tmp_path, 17)
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(proc=str(proc), registry=registry)
    theirs = openmetrics_latest(registry).removesuffix(b"# EOF\n") if openmetrics else generate_latest(registry)
    ours = ProcessMetrics(str(proc)).encode(openmetrics)
    assert ours == theirs
    assert b"process_open_fds 17.0\n" in ours and b"process_cpu_seconds_total 53.08\n" in ours


def test_process_metrics_of_this_process_and_without_proc(tmp_path: Path) -> None:
    """Over the real /proc: the families ProcessCollector writes, with its values (CPU within what a few reads take,
    fds within one); a /proc that cannot be read gives no series, never zeros."""
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.process_collector import ProcessCollector

    from gpuwear.collector import ProcessMetrics

    if not Path("/proc/self/stat").exists():
        pytest.fail("this test reads /proc: run it on Linux")
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    ours = {s.name: s.value for f in text_string_to_metric_families(ProcessMetrics().encode(False).decode())
            for s in f.samples}
    theirs = {s.name: s.value for f in text_string_to_metric_families(generate_latest(registry).decode())
              for s in f.samples}
    assert ours.keys() == theirs.keys() and len(ours) == 6
    assert ours["process_start_time_seconds"] == theirs["process_start_time_seconds"]
    assert ours["process_max_fds"] == theirs["process_max_fds"]
    assert abs(ours["process_open_fds"] - theirs["process_open_fds"]) <= 1
    assert abs(ours["process_cpu_seconds_total"] - theirs["process_cpu_seconds_total"]) < 0.5
    assert ours["process_resident_memory_bytes"] > 10e6
    assert ProcessMetrics(str(tmp_path)).encode(True) == b""  # no /proc there
    (tmp_path / "stat").write_bytes(b"btime 1796000123\n")
    assert ProcessMetrics(str(tmp_path)).encode(False) == b""  # the system's, not the process's


@pytest.mark.parametrize(("fault", "utilization", "downgraded"), [
    ({"width": 8}, 0.95, 1.0),  # fewer lanes: at any load
    ({"width": 8}, 0.0, 1.0),
    ({"generation": 3}, 0.95, 1.0),  # a lower generation while the GPU trains
    ({"generation": 3}, 0.0, 0.0),  # ...but not at idle, where links slow down to save power by design
    (None, 0.95, 0.0),
])
def test_a_pcie_link_trained_below_its_maximum_is_exported_downgraded(fault: dict[str, int] | None,
                                                                      utilization: float, downgraded: float) -> None:
    """The link's width and generation against the most the device and its slot allow were not read at all: a link
    that retrained at x8 or at a lower generation (a riser, a reseat, a failing lane) slowed the GPU silently."""
    faults = [] if fault is None else [{"at": 100, "gpu": 1, "kind": "pcie_downgrade", **fault}]
    train = [{"kind": "train" if utilization else "idle", "seconds": 3600, "utilization": utilization}]
    rig = make_rig({"gpus": [{"product": "rtx4090", "schedule": train}, {"product": "h100-sxm", "schedule": train}],
                    "faults": faults})
    rig.run(200)  # past the fault and a slow read after it
    samples = _samples(exposition(rig, "pcie", detail=True))
    uuids = [g.identity.uuid for g in rig.sampler.snapshot.gpus]
    assert samples[f'gpuwear_pcie_link_downgraded{{gpu="1",uuid="{uuids[1]}"}}'] == downgraded
    assert samples[f'gpuwear_pcie_link_downgraded{{gpu="0",uuid="{uuids[0]}"}}'] == 0
    assert samples[f'gpuwear_pcie_link_width{{gpu="1",link="current",uuid="{uuids[1]}"}}'] == \
        (fault or {}).get("width", 16)
    assert samples[f'gpuwear_pcie_link_generation{{gpu="1",link="max",uuid="{uuids[1]}"}}'] == 5


def test_nvlink_links_and_errors_are_read_on_gpus_that_have_them() -> None:
    """NVLink (the largest single cause of Llama 3's GPU interruptions) was not read at all: a link that went down
    or a link counting errors left no trace. An RTX 4090 has none: no series."""
    train = [{"kind": "train", "seconds": 3600, "utilization": 0.9}]
    rig = make_rig({"gpus": [{"product": "rtx4090", "schedule": train}, {"product": "h100-sxm", "schedule": train}],
                    "faults": [{"at": 100, "gpu": 1, "kind": "nvlink_errors", "link": 3, "crc_flit": 120,
                                "recovery": 2, "down": True},
                               {"at": 110, "gpu": 1, "kind": "nvlink_errors", "link": 7, "crc_flit": 5, "replay": 9}]})
    rig.run(40)
    samples = _samples(exposition(rig, "nvlink"))
    uuids = [g.identity.uuid for g in rig.sampler.snapshot.gpus]
    assert samples[f'gpuwear_nvlink_links_active{{gpu="1",uuid="{uuids[1]}"}}'] == 18
    assert samples[f'gpuwear_nvlink_errors_total{{error="recovery",gpu="1",uuid="{uuids[1]}"}}'] == 0
    rig.run(160)  # past both faults and a slow read after them
    samples = _samples(exposition(rig, "nvlink"))
    assert samples[f'gpuwear_nvlink_links_active{{gpu="1",uuid="{uuids[1]}"}}'] == 17
    # the recoveries by default (their alert's); the CRC errors and replays with metrics.detail (the series budget)
    assert [key for key in samples if key.startswith("gpuwear_nvlink_errors_total")] == \
        [f'gpuwear_nvlink_errors_total{{error="recovery",gpu="1",uuid="{uuids[1]}"}}']
    detailed = _samples(exposition(rig, "nvlink", detail=True))
    errors = {kind: detailed[f'gpuwear_nvlink_errors_total{{error="{kind}",gpu="1",uuid="{uuids[1]}"}}']
              for kind in ("crc_flit", "crc_data", "replay", "recovery")}
    assert errors == {"crc_flit": 125, "crc_data": 0, "replay": 9, "recovery": 2}  # the down link's counts kept
    assert not [key for key in samples if "nvlink" in key and f'uuid="{uuids[0]}"' in key]
    assert rig.sampler.snapshot.gpus[0].unavailable.get("nvlink") == "not_supported"
    # which link: per link with metrics.detail only (issue 29 item 3), summing to the totals
    assert not [key for key in samples if key.startswith(("gpuwear_nvlink_link_up", "gpuwear_nvlink_link_errors"))]
    detail = _samples(exposition(rig, "nvlink", detail=True))
    up = {int(m.group(1)): v for key, v in detail.items()
          if (m := re.match(rf'gpuwear_nvlink_link_up{{gpu="1",link="(\d+)",uuid="{uuids[1]}"}}', key))}
    assert up == {link: 0.0 if link == 3 else 1.0 for link in range(18)}
    per_link = {(int(m.group(2)), m.group(1)): v for key, v in detail.items() if (m := re.match(
        rf'gpuwear_nvlink_link_errors_total{{error="(\w+)",gpu="1",link="(\d+)",uuid="{uuids[1]}"}}', key))}
    assert per_link[(3, "crc_flit")] == 120 and per_link[(3, "recovery")] == 2 and per_link[(7, "replay")] == 9
    assert per_link[(7, "crc_flit")] == 5 and sum(v for (_, k), v in per_link.items() if k == "crc_flit") == 125
    assert len(per_link) == 18 * 4


def test_links_down_or_downgraded_reach_the_verdict_with_their_rule() -> None:
    """Issue 29's done-when for the links: an NVLink link gone down (with a recovery counted) and a PCIe link trained
    at 8 lanes of 16 were alerts only, never in the verdict, `report` or the page. Now each is a reason with its
    rule, once it has lasted as long as its alert's hold (links train for a while after a boot); a healthy peer has
    none."""
    from gpuwear.health import RULES

    train = [{"kind": "train", "seconds": 7200, "utilization": 0.9}]
    rig = make_rig({"gpus": [{"product": "h100-sxm", "schedule": train}] * 3, "faults": [
        {"at": 100, "gpu": 1, "kind": "nvlink_errors", "link": 3, "recovery": 2, "down": True},
        {"at": 100, "gpu": 2, "kind": "pcie_downgrade", "width": 8}]})
    tracker = WearTracker({}, WearConfig())

    def reasons() -> dict[str, set[str]]:
        codes: dict[str, set[str]] = {}
        for key in _samples(exposition(rig, "links", tracker)):
            if m := re.match(r'gpuwear_health_reason\{code="([^"]+)",gpu="(\d)"', key):
                codes.setdefault(m.group(2), set()).add(m.group(1))
        return codes

    def run(ticks: int) -> None:
        for _ in range(ticks):
            rig.run(1)
            tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())

    run(200)  # a slow read after the faults: the recovery counts at once, the links not yet
    links = {"nvlink_down", "nvlink_recoveries", "pcie_link_downgraded"}
    assert {g: c & links for g, c in reasons().items() if c & links} == {"1": {"nvlink_recoveries"}}
    run(600)  # past both holds (5 and 10 minutes)
    assert {g: c & links for g, c in reasons().items() if c & links} == \
        {"1": {"nvlink_down", "nvlink_recoveries"}, "2": {"pcie_link_downgraded"}}
    views = tracker.views
    uuids = [g.identity.uuid for g in rig.sampler.snapshot.gpus]
    by_code = {r["code"]: r for u in uuids[1:] for r in views[u].verdict["reasons"]}
    assert "1 of the 18 NVLink links it has had active are down (17 active)" in \
        by_code["nvlink_down"]["text"]
    assert "Gen5 x8, below the Gen5 x16" in by_code["pcie_link_downgraded"]["text"]
    assert all(by_code[c]["rule"] == RULES[c] for c in links)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: Path(s).stem)
def test_the_series_budget_holds_after_a_simulated_week(scenario: str) -> None:
    """The budget is per GPU after a simulated week (jobs, thermal cycles, verdict reasons and throttle reasons seen
    by then): at most 50 wear and telemetry series and 10 of health signals. Ticks of 10 s over the first quarter
    hour (where the scripted faults are: a GPU lost for 50 s) and of five minutes after it (gaps up to ten minutes
    are observed time here) keep the week to seconds: each scenario exposes the very series it did at one-minute
    ticks throughout, at a third of the cost."""
    rig = make_rig(scenario)
    tracker = WearTracker({}, replace(WearConfig(), max_gap_seconds=600.0))
    for step, seconds in ((10, 900), (300, 7 * 86400 - 900)):
        for tick in range(seconds // step):
            rig.run(step, interval=step)
            if step == 10 and tick == 2:
                _xids_of_each_kind(rig)
            tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    budget = _budget(_samples(exposition(rig, "x", tracker)))
    assert _within(budget), budget


def test_the_daemon_loads_no_statistics_module() -> None:
    """Issue 52, a daemon leaner than its own past: the peer-bleeding rule's one median loaded statistics, and with it
    decimal and fractions (about 0.6 MiB of resident memory at start, bench/rss_imports.py); the front door's Date
    header loaded the email package (0.5 MiB), the job resolver psutil (0.9 MiB). The daemon's modules load none of
    them; the rule's median is statistics.median's value (the Date header formatdate's: tests/test_web.py; the
    resolver's names and users psutil's: tests/test_jobs.py)."""
    import random
    import statistics
    import subprocess
    import sys

    from gpuwear.health.rules import _median

    code = ("import sys; import gpuwear.cli, gpuwear.service; "
            "print(sorted(m for m in ('statistics', 'decimal', 'fractions', 'email', 'psutil') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    rng = random.Random(52)
    for n in range(1, 40):
        values = [rng.choice((0.0, 1.5, rng.uniform(0, 1e6))) for _ in range(n)]
        assert _median(values) == statistics.median(values), values


def test_a_daemon_on_real_gpus_never_loads_the_simulation() -> None:
    """Issue 52 item 3, the daemon loads only what it uses: service.open_source imports the simulation only for
    simulated GPUs, yet `gpuwear run` imported gpuwear.sim.simulated on every path for the one error it catches
    (about 2 MiB resident on a real box). The command's imports and the real path's open (here a library that is not
    there: no GPU is needed, none is used) load no simulation module; --simulate still names a bad scenario."""
    import subprocess
    import sys

    code = """if True:
        import io, contextlib, sys, tempfile
        from gpuwear.cli import main
        from gpuwear.config import Config
        from gpuwear.backends.nvml import NvmlUnavailableError
        from gpuwear.service import open_source
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["run", "--listen", "nowhere", "--state-dir", tempfile.mkdtemp()]) != 0, err.getvalue()
        try:
            open_source(Config(), None, 1.0, False, library="/nonexistent/libnvidia-ml.so.1")
        except NvmlUnavailableError:
            pass
        print(sorted(m for m in sys.modules if m.startswith("gpuwear.sim.") and m != "gpuwear.sim.errors"))
        with contextlib.redirect_stderr(err):
            assert main(["run", "--simulate", "/nonexistent/scenario.yaml", "--state-dir", tempfile.mkdtemp()]) == 2
        print("scenario.yaml" in err.getvalue())
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout


def test_a_serving_daemon_loads_no_prometheus_client() -> None:
    """Issue 52, a daemon leaner than its own past: /metrics is written by gpuwear's own encoder, yet the daemon
    loaded prometheus_client for a registry nobody scraped, its content negotiation and its number formatting, and
    with the package http.server, wsgiref, urllib.request and email (about 2.4 MiB resident, bench/rss_imports.py).
    A daemon on simulated GPUs serves /metrics (OpenMetrics, gzip and text) and the page without loading it; its
    families are made when asked for (the OTLP pusher's), and are the same text."""
    import subprocess
    import sys

    code = """if True:
        import gzip, http.client, sys, tempfile, time
        from gpuwear.config import Config
        from gpuwear.service import Daemon, open_source
        sys.path.insert(0, "tests")
        from helpers import free_port
        config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=tempfile.mkdtemp())
        daemon = Daemon(config, open_source(config, "demo", 60.0, False))
        daemon.start()
        try:
            deadline = time.monotonic() + 60
            while daemon.source.sampler.snapshot.ticks < 3:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            bodies = []
            for accept, encoding in (("application/openmetrics-text;version=1.0.0", "gzip"), ("", ""), ("", "")):
                c = http.client.HTTPConnection(*config.listen.rsplit(":", 1), timeout=30)
                for path in ("/metrics", "/"):
                    c.request("GET", path, headers={"Accept": accept, "Accept-Encoding": encoding})
                    r = c.getresponse()
                    body = r.read()
                    assert r.status == 200, (path, r.status)
                    if path == "/metrics":
                        bodies.append(gzip.decompress(body) if encoding else body)
            print(sum(m.startswith("prometheus_client") for m in sys.modules))
            assert bodies[0].endswith(b"# EOF\\n") and b"gpuwear_temperature_celsius{" in bodies[1]
            daemon.collector  # the families: prometheus_client now
            print(sum(m.startswith("prometheus_client") for m in sys.modules) > 0)
        finally:
            daemon.stop()
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["0", "True"], out.stdout


def test_the_scrape_path_loads_no_ledger_code() -> None:
    """shared/design/house.md: a scrape never touches SQLite, and its path imports no ledger code. It did: metrics ->
    tracker -> ledger.records -> the ledger package's __init__, which loaded the store, recovery, export, integrity
    and retention. The package loads each name's module when the name is asked for, and the Event the tracker
    records lives below both (wear.events; issue 52 item 3: it loaded ledger.records and ledger.errors): the
    exposition and its views load no ledger module at all; asking for Ledger loads the store."""
    import subprocess
    import sys

    code = ("import sys; import gpuwear.collector, gpuwear.metrics, gpuwear.tracker; "
            "print(sorted(m for m in sys.modules if m.startswith('gpuwear.ledger'))); "
            "from gpuwear.ledger import Ledger; print('gpuwear.ledger.store' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded, store = out.stdout.splitlines()
    assert loaded == "[]" and store == "True", out.stdout


def test_what_a_card_carried_at_first_sight_is_exported_with_detail() -> None:
    """Issue 56 item 1, what stays detail-only is said and can be read: the card's state when gpuwear first read it
    (its passport's "before gpuwear" part: issue 55) and when that was, with metrics.detail; by default neither (the
    series budget: the stressed H100 is at 60). A used H100 that arrives with 7 corrected and 2 uncorrected
    aggregate ECC errors and 3 rows remapped keeps those values however the counts grow after."""
    rig = make_rig({"gpus": [{"product": "h100-sxm", "carried": {"ecc_corrected": 7, "ecc_uncorrected": 2,
                                                                  "remapped_corrected": 3}},
                             {"product": "h100-sxm"}, {"product": "v100", "carried": {"retired_single_bit": 3}}]})
    tracker = WearTracker({}, WearConfig())
    for _ in range(3):
        rig.run(1)
        tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    first = rig.clock.wall() - 2
    rig.simulation.gpus[0].state.ecc_corrected_aggregate += 5  # grows after the first read: the first-sight value stays
    rig.run(31)  # past the slow interval, where the ECC counts are read
    tracker.observe(rig.sampler.snapshot, rig.clock.monotonic(), rig.clock.wall())
    detail = _samples(exposition(rig, "used", tracker, detail=True))
    used = {k.split('reading="')[1].split('"')[0]: v for k, v in detail.items()
            if k.startswith('gpuwear_first_sight_reading{gpu="0"')}
    assert (used["ecc_corrected_aggregate"], used["ecc_uncorrected_aggregate"], used["remapped_rows_corrected"]) == \
        (7.0, 2.0, 3.0), used
    assert next(v for k, v in detail.items() if k.startswith('gpuwear_ecc_errors_total{counter="aggregate",error='
                                                              '"corrected",gpu="0"')) == 12.0
    fresh = {k.split('reading="')[1].split('"')[0]: v for k, v in detail.items()
             if k.startswith('gpuwear_first_sight_reading{gpu="1"')}
    assert fresh["ecc_corrected_aggregate"] == 0.0 and fresh["remapped_rows_corrected"] == 0.0, fresh
    # a pre-Ampere card's retired pages; the date of its newest carried page is no reading (a Unix time: the
    # passport gives it)
    v100 = {k.split('reading="')[1].split('"')[0]: v for k, v in detail.items()
            if k.startswith('gpuwear_first_sight_reading{gpu="2"')}
    assert v100["retired_pages_single_bit"] == 3.0 and set(v100) <= FIRST_READS, v100
    seen = [v for k, v in detail.items() if k.startswith("gpuwear_first_sight_timestamp_seconds{")]
    assert seen == [first, first, first], (seen, first)
    assert "gpuwear_first_sight" not in exposition(rig, "used", tracker)
