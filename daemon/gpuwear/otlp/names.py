"""What each /metrics family is pushed as over OTLP, or why it is not (docs/otlp.md prints this table).

OpenTelemetry's semantic conventions for hardware (``hw.*``, status Development, as of 2026-12): a GPU is a component
with ``hw.type`` = ``gpu`` and ``hw.id`` (required: here its UUID); ``hw.temperature``, ``hw.power``, ``hw.energy``,
``hw.errors`` and ``hw.status`` are the common metrics, ``hw.gpu.*`` the GPU's own, ``hw.fan.*`` a fan's. Where they
have no name (the wear figures, clocks, limits) the name is gpuwear's, under ``gpuwear.``. Errors carry ``error.type``
and ``gpuwear.error.category`` (correctable, uncorrectable, fatal; an XID's from NVIDIA's catalog): the conventions
have no way to mark it yet (open-telemetry/semantic-conventions #940). Host identity is the resource's, never a data
point's. Pure data: no SDK here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwear.health.xids import XID_ACT

Labels = dict[str, "str | tuple[str, dict[str, str]]"]  # a label -> its attribute, or (attribute, values renamed)


@dataclass(frozen=True)
class Push:
    """How one /metrics family is pushed: ``name`` and ``unit`` (UCUM, as the conventions write them); ``labels``:
    each label's attribute name, with its values renamed where a mapping is given (a value the mapping lacks: the
    series is not pushed); a label not listed becomes ``gpuwear.LABEL``; ``fixed``: attributes every point gets;
    ``only``: the label values a series must have to be pushed; ``updown``: a gauge the conventions declare an
    UpDownCounter (a non-monotonic sum); ``unless``: a family that tells the same events in more detail: where it
    is exported (metrics.detail), it is pushed instead of this one."""

    name: str
    unit: str
    labels: Labels = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)
    only: dict[str, str] = field(default_factory=dict)
    updown: bool = False
    derived: Derived | None = None
    unless: str = ""


@dataclass(frozen=True)
class Derived:
    """An attribute each point gets from one of its labels' value: ``attribute`` = ``values[value]``, else
    ``default``; ``said``: how, for the docs' table."""

    label: str
    attribute: str
    values: dict[str, str]
    default: str
    said: str


_ERRORS = "{error}"
_SENSOR: Labels = {"sensor": "hw.sensor_location"}
_CATEGORY: tuple[str, dict[str, str]] = ("gpuwear.error.category",
                                         {"corrected": "correctable", "uncorrected": "uncorrectable"})

PUSHED: dict[str, Push] = {
    "gpuwear_temperature_celsius": Push("hw.temperature", "Cel", _SENSOR),
    "gpuwear_power_watts": Push("hw.power", "W"),
    "gpuwear_lifetime_energy_joules_total": Push("hw.energy", "J"),
    "gpuwear_utilization_ratio": Push("hw.gpu.utilization", "1", {}, {"hw.gpu.task": "general"}, {"resource": "gpu"}),
    "gpuwear_memory_used_bytes": Push("hw.gpu.memory.usage", "By"),
    "gpuwear_memory_total_bytes": Push("hw.gpu.memory.limit", "By"),
    "gpuwear_ecc_errors_total": Push("hw.errors", _ERRORS, {"error": _CATEGORY, "counter": "gpuwear.ecc.counter"},
                                     {"error.type": "ecc"}),
    "gpuwear_pcie_replays_total": Push("hw.errors", _ERRORS, {}, {"error.type": "pcie_replay",
                                                                  "gpuwear.error.category": "correctable"}),
    "gpuwear_nvlink_errors_total": Push("hw.errors", _ERRORS, {"error": "gpuwear.nvlink.error"},
                                        {"error.type": "nvlink"}),
    "gpuwear_xid_events_total": Push("hw.errors", _ERRORS, {"xid": "gpuwear.xid"}, {"error.type": "xid"},
                                     derived=Derived("xid", "gpuwear.error.category",
                                                     {str(code): "fatal" for code in XID_ACT}, "uncorrectable",
                                                     "fatal for an XID NVIDIA's catalog resolves by resetting the GPU "
                                                     "or rebooting (gpuwear's act tier), else uncorrectable (an error "
                                                     "the hardware did not correct silently)")),
    "gpuwear_xid_tier_events_total": Push("hw.errors", _ERRORS, {"tier": "gpuwear.xid.tier"}, {"error.type": "xid"},
                                          derived=Derived("tier", "gpuwear.error.category", {"act": "fatal"},
                                                          "uncorrectable", "fatal for tier act, else uncorrectable"),
                                          unless="gpuwear_xid_events_total"),
    "gpuwear_health_status": Push("hw.status", "1", {"status": ("hw.state", {
        "ok": "ok", "watch": "degraded", "act": "predicted_failure"})}, updown=True),
    "gpuwear_fan_speed_rpm": Push("hw.fan.speed", "rpm", {"fan": "gpuwear.fan"}),
    "gpuwear_fan_speed_ratio": Push("hw.fan.speed_ratio", "1", {"fan": "gpuwear.fan"}),
    "gpuwear_gpu_up": Push("gpuwear.gpu.up", "1"),
    "gpuwear_clock_hertz": Push("gpuwear.gpu.clock.frequency", "Hz"),
    "gpuwear_power_limit_watts": Push("gpuwear.gpu.power.limit", "W"),
    "gpuwear_lifetime_observed_seconds_total": Push("gpuwear.lifetime.observed_time", "s"),
    "gpuwear_lifetime_throttle_seconds_total": Push("gpuwear.lifetime.throttle_time", "s"),
    "gpuwear_lifetime_thermal_cycles_total": Push("gpuwear.lifetime.thermal_cycles", "{cycle}", _SENSOR),
    "gpuwear_thermal_aging_equivalent_seconds": Push("gpuwear.thermal_aging.equivalent_time", "s", _SENSOR),
    "gpuwear_cycle_fatigue_equivalent_cycles": Push("gpuwear.cycle_fatigue.equivalent_cycles", "{cycle}", _SENSOR),
    "gpuwear_retired_pages": Push("gpuwear.memory.retired_pages", "{page}"),
    "gpuwear_remapped_rows": Push("gpuwear.memory.remapped_rows", "{row}", {"error": _CATEGORY}),
    "gpuwear_health_reason": Push("gpuwear.health.reason", "1"),
}

# why the rest is not pushed (a family of /metrics in neither table fails tests/test_otlp.py)
DAEMON = "the daemon's own state (build, backend, sampling, ledger, kernel log, pushes): on /metrics only"
IDENTITY = "the card's identity: each GPU point's hw.* attributes (hw.model, hw.serial_number, hw.driver_version)"
NOT_YET = "not yet: on /metrics only"
NOT_PUSHED: dict[str, str] = {
    "gpuwear_gpu_info": IDENTITY,
    "gpuwear_driver_info": IDENTITY,
}


def why_not(name: str, source: str) -> str:
    """Why a /metrics family of ``source`` (the catalog's: daemon, gpu, wear) is not pushed."""
    return NOT_PUSHED.get(name) or (DAEMON if source == "daemon" else NOT_YET)


def table(families: list[tuple[str, str]]) -> str:
    """docs/otlp.md's table: each /metrics family (source, name), in the catalog's order, with what it is pushed as
    or why it is not."""
    lines = ["| /metrics family | OTLP metric | unit | attributes from its labels, and fixed ones |",
             "|---|---|---|---|"]
    for source, name in families:
        push = PUSHED.get(name)
        if push is None:
            lines.append(f"| `{name}` | not pushed: {why_not(name, source)} | | |")
            continue
        attrs = [f"{label} → `{a if isinstance(a, str) else a[0]}`" + (
            "" if isinstance(a, str) else " (" + ", ".join(f"{k} → {v}" for k, v in a[1].items()) + ")")
            for label, a in push.labels.items()]
        attrs += [f"`{k}` = {v}" for k, v in push.fixed.items()]
        if push.derived is not None:
            attrs.append(f"`{push.derived.attribute}`: {push.derived.said}")
        attrs += [f"only {k} = {v}" for k, v in push.only.items()]
        attrs += [f"not where `{push.unless}` is exported (metrics.detail): that one instead"] if push.unless else []
        kind = " (up-down counter)" if push.updown else ""
        said = "; ".join(attrs) or "the GPU identity only"
        lines.append(f"| `{name}` | `{push.name}`{kind} | `{push.unit}` | {said} |")
    return "\n".join(lines) + "\n"
