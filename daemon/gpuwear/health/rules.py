"""The health rules, declared in one table: each with the signal it reads, its window, its threshold and floor, its
severity, what ends it and its source, and the small pure function that judges it (no clock, no I/O: what it needs
comes in ``Facts``). The verdict (health.verdict) is their combination, in the table's order."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.health.signals import ERROR_WORDS, LINKS, per_hour, recent_rates, repeated_incidents, slow_reads_text
from gpuwear.health.xids import LINE_JUDGED, NVLINK5_SOURCE, NVLINK_SOURCE, Xid, card_evidence, lookup
from gpuwear.wear.accumulate import CARRIED_COUNTS, FABRIC_COMPLETED, HOT_BELOW_CELSIUS, GpuWear, utc_day
from gpuwear.wear.schema import INCIDENT_EPISODE_SECONDS

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvmlDeviceGpuRecoveryAction_t)
RECOVERY_ACTIONS = {1: "reset the GPU", 2: "reboot the node", 3: "drain peer-to-peer traffic",
                    4: "drain and reset the GPU"}
NVLINK_DOWN_HOLD_SECONDS = 300  # links fewer than before for this long are down (they train after a boot)
PCIE_DOWNGRADED_HOLD_SECONDS = 600
FABRIC_PENDING_HOLD_SECONDS = 600  # the registration "can take some time" (nvml.h): ten minutes is past it

Finding = tuple[str, str, str]  # (severity, code, text)
Findings = tuple[Finding, ...]  # what a judge gives: most give one at most
NONE: Findings = ()


@functools.lru_cache(maxsize=16)  # the last day changes once a day
def _window_days(last: int, days: int) -> tuple[str, ...]:
    """The ISO dates of the ``days`` UTC days to day number ``last``."""
    return tuple(utc_day(last - i) for i in range(days))


@dataclass
class Facts:
    """What the rules judge one GPU on: its record, the parameters, and what the caller had at hand already.
    ``trend``: models.resistance_trend; ``peers``: the loaded-hour error rates of the host's other GPUs of its product
    (signals.peer_rates); ``host_last_seen``: when the host's GPUs were last seen (a ledger's reader: the daemon
    names a GPU NVML does not list itself). Made for one verdict (a view asks for one per GPU at every scrape that
    follows a tick: plain attributes, made once)."""

    w: GpuWear
    p: WearConfig
    trend: Mapping[str, Any] | None = None
    peers: Mapping[str, list[float]] = field(default_factory=dict)
    host_last_seen: float | None = None  # when the host's other GPUs were last seen, where the caller knows it
    given_recent: Mapping[str, tuple[float | None, float | None]] | None = None  # recent_rates, where given
    h: dict[str, Any] = field(init=False)  # the record's health readings
    # the record's health_days summed over its last wear.health.window_days UTC days (to the day of its last
    # sight): "busy" and "throttled" s, "stalls" [under load, idle], "hot" {°C: s}
    window: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.h = self.w.health
        out: dict[str, Any] = {"busy": 0.0, "throttled": 0.0, "stalls": [0, 0], "hot": {}}
        self.window = out
        if self.w.last_seen is None or not self.w.health_days:
            return
        hot: dict[str, float] = out["hot"]
        for key in _window_days(int(self.w.last_seen // 86400), self.p.health.window_days):
            day = self.w.health_days.get(key)
            if day is None:
                continue
            out["busy"] += day.get("busy", 0.0)
            out["throttled"] += day.get("throttled", 0.0)
            if "stalls" in day:
                out["stalls"] = [a + b for a, b in zip(out["stalls"], day["stalls"], strict=True)]
            for t, sec in day.get("hot", {}).items():
                hot[t] = hot.get(t, 0.0) + sec

    def recent(self) -> Mapping[str, tuple[float | None, float | None]]:
        """The GPU's error rates over its last two UTC days and its baseline before them (signals.recent_rates)."""
        if self.given_recent is None:
            self.given_recent = recent_rates(self.w, self.p)
        return self.given_recent

    def hot_seconds(self, celsius: float) -> float:
        """Seconds of the window with the die at or above ``celsius`` (whole-°C bins, as seconds_at_or_above)."""
        hot: dict[str, float] = self.window["hot"]
        return sum(sec for t, sec in hot.items() if int(t) >= celsius)

    def within(self, when: float | None, days: float) -> bool:
        """``when`` (wall, Unix s) lies within ``days`` of the GPU's record's end (its last sight: the record's time,
        not the reader's clock); an unknown time is taken as recent."""
        return when is None or self.w.last_seen is None or self.w.last_seen - when <= days * 86400.0

    def incident(self, when: float | None) -> str | None:
        """An incident's severity by its last occurrence: act within wear.health.incident_act_days, then watch until
        incident_watch_days, then None (ended)."""
        hp = self.p.health
        return "act" if self.within(when, hp.incident_act_days) else \
            "watch" if self.within(when, hp.incident_watch_days) else None

    def ago(self, what: str) -> str:
        when = self.w.last_event.get(what)
        return "" if when is None else f", last {time.strftime('%Y-%m-%d', time.gmtime(when))}"

    def carried(self, noun: str, *counts: str) -> tuple[str, bool]:
        """What the card carried of its lifetime ``counts`` when gpuwear first read them (accumulate.CARRIED_COUNTS)
        against what it holds now, in words ("all carried when gpuwear first read the card on DAY: from before
        gpuwear", "3 carried when gpuwear first read the card on DAY, 2 since"), and whether all of it was carried;
        ("", False) where the record does not know (read first by a gpuwear that did not keep it)."""
        kept = [c for c in counts if f"carried {c}" in self.h]
        if not kept:
            return "", False
        carried = sum(int(self.h[f"carried {c}"]) for c in kept)
        now = sum(int(self.h.get(c, 0)) for c in counts)
        times = [self.w.last_event[f"first read {c}"] for c in kept if f"first read {c}" in self.w.last_event]
        day = f" on {time.strftime('%Y-%m-%d', time.gmtime(min(times)))}" if times else ""
        if carried <= 0:
            return f"; none carried when gpuwear first read the card{day}", False
        if carried >= now:
            return f" (all carried when gpuwear first read the card{day}: from before gpuwear, its history " \
                   f"unknown)", True
        return f" ({carried} carried when gpuwear first read the card{day}, {now - carried} {noun} since)", False

    def growing(self, *counts: str) -> str | None:
        """While the card's lifetime ``counts`` (accumulate.GROWING_COUNTS) grew within
        wear.health.growth_watch_days (", the last new one on DAY"), or, for counts that never grew in the record,
        while gpuwear has read the GPU for less than that (", found when gpuwear first read it on DAY"); else None."""
        times = [self.w.last_event[f"grew {c}"] for c in counts if f"grew {c}" in self.w.last_event]
        when, words = (max(times), "the last new one on") if times else (self.w.first_seen,
                                                                          "found when gpuwear first read it on")
        if not self.within(when, self.p.health.growth_watch_days):
            return None
        return "" if when is None else f", {words} {time.strftime('%Y-%m-%d', time.gmtime(when))}"


Judge = Callable[[Facts], Findings]


@dataclass(frozen=True)
class Rule:
    """One health judgement. ``code``: the reason code it gives (``xid_N`` for the XID rule: one per code);
    ``signal``: what it reads (the NVML call or field, or the record's figure); ``window``: over which time;
    ``threshold``: its threshold and floor, with the config keys that set them; ``severity``; ``ends``: what ends
    the reason; ``source``: whose rule it is and where it is written (the ``rule`` of each reason); ``alert``: the
    alert of deploy/prometheus/gpuwear-rules.yml that applies it, with its hold (``for:``) in ``hold_seconds``."""

    code: str
    signal: str
    window: str
    threshold: str
    severity: str
    ends: str
    source: str
    judge: Judge
    alert: str | None = None
    hold_seconds: float | None = None


# -- the judges, in the table's order ------------------------------------------------------------------------------

def _row_remap_failure(f: Facts) -> Findings:
    if f.h.get("remapped_rows_failure"):
        return (("act", "row_remap_failure", "a memory row remap failed: NVIDIA says the GPU needs service (RMA)"),)
    return NONE


def _row_remap_pending(f: Facts) -> Findings:
    if f.h.get("remapped_rows_pending"):
        return (("watch", "row_remap_pending",
                 "a memory row remap is pending: reset the GPU when convenient to apply it"),)
    return NONE


def _page_retirement_pending(f: Facts) -> Findings:
    if f.h.get("retired_pages_pending"):
        return (("watch", "page_retirement_pending",
                 "a memory page retirement is pending: reload the driver or reset the GPU when convenient"),)
    return NONE


def _recovery_action(f: Facts) -> Findings:
    action = f.h.get("recovery_action")
    if action:
        first = f.w.last_event.get("first read recovery_action")
        carried = "" if f.h.get("carried recovery_action") != action or first is None else \
            f" (as it did when gpuwear first read the card on {time.strftime('%Y-%m-%d', time.gmtime(first))})"
        return (("act", "recovery_action",
                 f"the driver asks to {RECOVERY_ACTIONS.get(action, f'recover ({action})')}{carried}"),)
    return NONE


def _reset_required(f: Facts) -> Findings:
    if f.h.get("reset_required"):
        return (("act", "reset_required", "NVML answers that the GPU requires a reset before it can be used again: "
                 "reset it (nvidia-smi -r, or a reboot); one that needs it again needs service"),)
    return NONE


def _uncorrectable_ecc(f: Facts) -> Findings:
    n = f.h.get("ecc_uncorrected_volatile", 0)
    if n > 0:
        return (("act", "uncorrectable_ecc", f"{n} uncorrectable ECC error(s) since the driver loaded: results "
                 "computed since may be wrong; reset the GPU"),)
    return NONE


def _retired(f: Facts) -> int:
    return int(f.h.get("retired_pages_single_bit", 0) + f.h.get("retired_pages_double_bit", 0))


RETIRED_PAGES_LIMIT = 60


def _retired_pages_limit(f: Facts) -> Findings:
    retired = _retired(f)
    if retired >= RETIRED_PAGES_LIMIT:
        return (("act", "retired_pages_limit", f"{retired} retired memory pages: at or above 60, NVIDIA's DCGM health "
                 "check reports the GPU as failing; have it checked by its vendor"),)
    return NONE


def _retired_pages(f: Facts) -> Findings:
    retired = _retired(f)
    counts = ("retired_pages_single_bit", "retired_pages_double_bit")
    if 0 < retired < RETIRED_PAGES_LIMIT and (last := f.growing(*counts)) is not None:
        carried, inherited = f.carried("retired", *counts)
        return (("watch", "retired_pages", f"{retired} retired memory page(s){carried}{'' if inherited else last}: "
                 "normal in small numbers; keep watching"),)
    return NONE


def _pcie_aer(f: Facts) -> Findings:
    fatal, nonfatal = f.h.get("pcie_aer_fatal", 0), f.h.get("pcie_aer_nonfatal", 0)
    if fatal > 0 or nonfatal > 0:
        return (("watch", "pcie_aer_uncorrectable", f"{fatal + nonfatal} uncorrectable PCIe error(s) since boot "
                 f"({fatal} fatal, {nonfatal} non-fatal), as the kernel counts them at the GPU's PCI function: the "
                 "link, a riser or the slot; reseat the card or try another slot if they grow"),)
    return NONE


def _nvlink_down(f: Facts) -> Findings:
    h, now = f.h, f.w.last_seen
    active, most = h.get("nvlink_links_active"), h.get("nvlink_links_most")
    if now is None or active is None or most is None:
        return NONE
    peers_most = int(max(f.peers.get(LINKS, ()), default=0))
    if active < most and now - h.get("nvlink_links_most_at", now) >= NVLINK_DOWN_HOLD_SECONDS:
        return (("act", "nvlink_down", f"{most - active} of the {most} NVLink links it has had active are down "
                 f"({active} active): jobs that talk over NVLink fail or fall back to slower paths; a reset or a "
                 "reboot may bring them back, links that keep dropping need service"),)
    elif active < peers_most and now - (f.w.first_seen or now) >= NVLINK_DOWN_HOLD_SECONDS:
        return (("act", "nvlink_down", f"{active} NVLink links active where the host's other GPUs of its product have "
                 f"{peers_most}: links down since gpuwear first read it, or never trained; a reset or a reboot may "
                 "bring them back, links that stay down need service"),)
    return NONE


def _nvlink_recoveries(f: Facts) -> Findings:
    if f.w.last_seen is not None and f.h.get("nvlink_recovery_errors", 0) > 0:
        return (("watch", "nvlink_recoveries", f"{f.h['nvlink_recovery_errors']} NVLink recovery event(s) since the "
                 "driver loaded (a link failed and retrained): watch for links going down"),)
    return NONE


def _pcie_link_downgraded(f: Facts) -> Findings:
    h, now = f.h, f.w.last_seen
    since = h.get("pcie_downgraded_since")
    if now is None or since is None or now - since < PCIE_DOWNGRADED_HOLD_SECONDS:
        return NONE
    link = (f"Gen{h.get('pcie_link_generation', '?')} x{h.get('pcie_link_width', '?')}, below the "
            f"Gen{h.get('pcie_link_generation_max', '?')} x{h.get('pcie_link_width_max', '?')} its card and slot "
            "allow")
    return (("watch", "pcie_link_downgraded", f"its PCIe link runs at {link}, since "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(since))}: transfers to and from it run slower; "
             "reseat the card or its riser (a lane that keeps failing is the card's or the slot's)"),)


# NVIDIA's fabric health mask (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*), the fields that are TRUE (1) or FALSE (2):
# (shift, the rule that reads it, what TRUE says). DEGRADED_BW since R550; the others since R570.
FABRIC_MASK_FIELDS = ((0, "fabric_degraded", "its NVLink bandwidth is degraded (a link or NVSwitch port down or slow)"),
                      (2, "fabric_degraded", "the fabric is recovering a route through it"),
                      (4, "fabric_failed", "a route through the fabric is unhealthy"),
                      (6, "fabric_degraded", "the fabric is recovering from an access timeout"))
# INCORRECT_CONFIGURATION (shift 8, 4 bits; R580+): 1 is NONE, a correct one; the rest name what is wrong
FABRIC_CONFIGURATION = {2: "its SysGUID", 3: "its chassis serial number", 4: "no partition",
                        5: "too few NVLinks", 6: "incompatible GPU firmware", 7: "an invalid location",
                        8: "the GPU's state"}
# the v3 health summary (NVML_GPU_FABRIC_HEALTH_SUMMARY_*, R580+): UNHEALTHY and LIMITED_CAPACITY
FABRIC_SUMMARY = {2: ("fabric_failed", "NVML's fabric health summary says unhealthy"),
                  3: ("fabric_degraded", "NVML's fabric health summary says limited capacity")}


def _fabric_health(h: dict[str, Any], code: str) -> list[str]:
    """What NVML's fabric health mask and summary say that the rule ``code`` reads, in words (nothing before a
    completed registration; a record written before the mask was kept may hold fabric_degraded_bandwidth)."""
    if h.get("fabric_state") != FABRIC_COMPLETED:
        return []
    mask = h.get("fabric_health_mask")
    said = [words for shift, rule, words in FABRIC_MASK_FIELDS
            if rule == code and isinstance(mask, int) and (mask >> shift) & 0x3 == 1]
    if code == "fabric_degraded" and mask is None and h.get("fabric_degraded_bandwidth") is True:
        said.append(FABRIC_MASK_FIELDS[0][2])
    if code == "fabric_failed" and isinstance(mask, int) and (wrong := FABRIC_CONFIGURATION.get(mask >> 8 & 0xF)):
        said.append(f"its fabric configuration is incorrect: {wrong}")
    rule, words = FABRIC_SUMMARY.get(h.get("fabric_health_summary", 0), ("", ""))
    return [*said, words] if rule == code else said


def _fabric_failed(f: Facts) -> Findings:
    status = f.h.get("fabric_status")
    said = _fabric_health(f.h, "fabric_failed")
    if f.h.get("fabric_state") == FABRIC_COMPLETED and status:
        said.insert(0, f"its registration with the NVSwitch fabric ended in error (NVML status {status})")
    if said:
        return (("act", "fabric_failed", f"{'; '.join(said)}: work that spans GPUs over NVLink cannot run on it; "
                 "check nvidia-fabricmanager's log, then reset the GPU"),)
    return NONE


def _fabric_degraded(f: Facts) -> Findings:
    h, now = f.h, f.w.last_seen
    since = h.get("fabric_pending_since")
    if since is not None and now is not None and now - since >= FABRIC_PENDING_HOLD_SECONDS:
        return (("watch", "fabric_degraded", "its registration with the NVSwitch fabric has not completed since "
                 f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(since))}: is nvidia-fabricmanager running?"),)
    if said := _fabric_health(h, "fabric_degraded"):
        return (("watch", "fabric_degraded", f"NVML's fabric health: {'; '.join(said)}; check nvidia-smi nvlink -s "
                 "and the fabric manager's log"),)
    return NONE


def _remapped_rows(f: Facts) -> Findings:
    counts = ("remapped_rows_uncorrected", "remapped_rows_corrected")
    n = f.h.get("remapped_rows_uncorrected", 0) + f.h.get("remapped_rows_corrected", 0)
    if n > 0 and (last := f.growing(*counts)) is not None:
        carried, inherited = f.carried("remapped", *counts)
        return (("watch", "remapped_rows", f"{n} memory row(s) remapped{carried}{'' if inherited else last}: the "
                 "spare rows did their job; keep watching"),)
    return NONE


def _remap_headroom(f: Facts) -> Findings:
    low, none = int(f.h.get("remap_banks_low", 0)), int(f.h.get("remap_banks_none", 0))
    if low + none > 0 and (last := f.growing("remap_banks_low", "remap_banks_none")) is not None:
        carried, inherited = f.carried("at none", "remap_banks_none")
        where = (f"{none} memory bank(s) have no spare rows left{carried}" if none else "") + \
            (", and " if none and low else "") + (f"{low} bank(s) with few left" if low else "")
        return (("watch", "remap_headroom", f"{where}{'' if inherited else last} (the row remapper's histogram): a "
                 "failing row in a bank with none left cannot be remapped, and a failed remap means the GPU needs "
                 "service; plan for it"),)
    return NONE


FIRMWARE_NAMES = {"vbios": "VBIOS", "inforom_image": "InfoROM image", "inforom_checksum": "InfoROM configuration "
                  "checksum", "inforom_valid": "InfoROM validity"}


def _firmware_changed(f: Facts) -> Findings:
    changed = f.w.firmware.get("changed", {})
    said = [f"its {FIRMWARE_NAMES.get(k, k)} changed from {_shown(old)} to {_shown(new)} on "
            f"{time.strftime('%Y-%m-%d', time.gmtime(when))}" for k, (old, new, when) in sorted(changed.items())
            if k != "inforom_valid" and f.within(when, f.p.health.growth_watch_days)]
    if said:
        return (("watch", "firmware_changed", "; ".join(said) + ": the card was flashed, its InfoROM rewritten, or it "
                 "is not the card it was; its lifetime counts from before may not be its own"),)
    return NONE


def _shown(value: Any) -> str:
    return f"0x{value:08x}" if isinstance(value, int) and not isinstance(value, bool) else str(value)[:40]


def _inforom_invalid(f: Facts) -> Findings:
    if f.w.firmware.get("now", {}).get("inforom_valid") is False:
        return (("watch", "inforom_invalid", "NVML says its InfoROM is corrupted (nvmlDeviceValidateInforom): the "
                 "ECC, retired-page and remap counts it keeps cannot be trusted; NVIDIA's tools can reflash it"),)
    return NONE


def _xid_severity(f: Facts, tier: str, when: float | None) -> str | None:
    """An XID's severity by its tier and last occurrence (None: ended)."""
    if tier == "act":
        return f.incident(when)
    days = {"watch": f.p.health.xid_watch_days, "app": f.p.health.xid_app_days}.get(tier)
    return "watch" if days is not None and f.within(when, days) else None


def _beside(w: GpuWear, code: int, when: float) -> list[int]:
    """The GPU's other XIDs (codes but ``code``, and but those of no reason of their own, tier "none": XID 45 is
    "preemptive cleanup, due to previous errors") whose last occurrence lies within INCIDENT_EPISODE_SECONDS of
    ``when``: seen with it."""
    return sorted(int(key[4:]) for key, at in w.last_event.items()
                  if key[4:].isdigit() and key.startswith("xid ") and int(key[4:]) != code
                  and lookup(int(key[4:])).tier != "none" and abs(at - when) <= INCIDENT_EPISODE_SECONDS)


def _secondary(f: Facts, code: int, n: int, xid: Xid) -> Finding | None:
    """XID 74 lines with only bits NVIDIA's workflow calls secondary (1, 20; the marginal-channel 21, 22; the
    fourth register's 16-18): "If seen with other bits set or other Xid/SXid, please follow the resolution for
    those. If seen solo, please report a bug." Beside another XID of the GPU, or the host's NVSwitch SXids, watched
    (that XID's own reason, or GpuwearNvswitchFatalSxid, says what to do); solo, act as the code's tier."""
    if (when := f.w.last_event.get(f"xid {code} secondary")) is None:
        return None
    head = f"XID {code} ({xid.meaning}) seen {n} time(s){f.ago(f'xid {code} secondary')}, only bits NVIDIA's " \
           "workflow calls secondary"
    sxids = [f"the host's {s.replace('_', '-')} NVSwitch SXids" for s in ("fatal", "non_fatal")
             if abs(f.w.last_event.get(f"sxid {s}", -math.inf) - when) <= INCIDENT_EPISODE_SECONDS]
    if beside := [f"XID {c}" for c in _beside(f.w, code, when)] + sxids:
        others = ", ".join(beside)
        return ("watch", f"xid_{code}", f"{head}, with {others}: the workflow follows the resolution of {others}") \
            if f.within(when, f.p.health.xid_watch_days) else None
    severity = _xid_severity(f, xid.tier, when)
    return None if severity is None else (severity, f"xid_{code}", f"{head}, seen solo: the workflow asks that it "
                                          "be reported to NVIDIA")


def _line_judged(f: Facts, code: int, n: int, xid: Xid) -> Finding | None:
    """An XID judged line by line (health.xids.LINE_JUDGED): act as its tier after a line that calls for service,
    watched after lines whose step waits for a repeat on their link, by the XIDs beside it after lines with
    secondary bits only (:func:`_secondary`), nothing after lines the workflow ignores; the most severe of these."""
    found: list[Finding] = []
    if (severity := _xid_severity(f, xid.tier, f.w.last_event.get(f"xid {code}"))) is not None \
            and f"xid {code}" in f.w.last_event:
        found.append((severity, f"xid_{code}", f"XID {code} ({xid.meaning}) seen {n} time(s){f.ago(f'xid {code}')}"))
    if (secondary := _secondary(f, code, n, xid)) is not None:
        found.append(secondary)
    if _xid_severity(f, "watch", when := f.w.last_event.get(f"xid {code} watch")) and when is not None:
        found.append(("watch", f"xid_{code}", f"XID {code} ({xid.meaning}) seen {n} time(s)"
                      f"{f.ago(f'xid {code} watch')}: NVIDIA's workflow calls for service if its bits repeat on the "
                      "same link"))
    return min(found, key=lambda finding: finding[0] != "act", default=None)


def _xids(f: Facts) -> Findings:
    found = []
    for code, n in sorted((int(x), n) for x, n in f.w.xids.items()):
        xid = lookup(code)
        if code in LINE_JUDGED:
            if (finding := _line_judged(f, code, n, xid)) is not None:
                found.append(finding)
            continue
        if (severity := _xid_severity(f, xid.tier, f.w.last_event.get(f"xid {code}"))) is not None:
            found.append((severity, f"xid_{code}",
                          f"XID {code} ({xid.meaning}) seen {n} time(s){f.ago(f'xid {code}')}"))
    return tuple(found)


def _xid_card(f: Facts) -> Findings:
    """An XID NVIDIA's catalog resolves by restarting the application (tier "app": 13, 31, the engine exceptions) on
    this GPU under wear.health.xid_card_applications different applications within xid_card_days, at one place on
    the chip where its lines say where (XID 13's GPC and TPC): the card, not the code (tracker.note_xid_applications
    keeps the applications in last_event; health.xids.card_evidence reads them)."""
    found = []
    hp = f.p.health
    since = None if f.w.last_seen is None else f.w.last_seen - hp.xid_card_days * 86400.0
    for code in sorted(int(x) for x in f.w.xids if x.isdigit() and lookup(int(x)).tier == "app"):
        apps, unit = card_evidence(f.w.last_event, code, since)
        if len(apps) >= hp.xid_card_applications:
            found.append(("watch", "xid_card", f"likely the card, not the code: XID {code} ({lookup(code).meaning}) "
                          f"on this GPU under {len(apps)} different applications{f' at {unit}' if unit else ''} "
                          f"within {hp.xid_card_days:g} days (" + ", ".join(apps) + ")"))
    return (("watch", "xid_card", "; ".join(t for *_, t in found)),) if found else NONE  # one reason, every code


def _gpu_lost(f: Facts) -> Findings:
    severity = f.incident(f.w.last_event.get("gpu lost")) if f.w.lost_events else None
    if severity is not None:
        return ((severity, "gpu_lost", f"the GPU fell off the bus {f.w.lost_events} time(s){f.ago('gpu lost')}"),)
    return NONE


def _bleeding_alone(f: Facts, counter: str, lately: float, before: float | None) -> str | None:
    """A counter no peer of its product reads: its last two days against its own past, or above the absolute
    floor (wear.health.bleeding_alone_per_loaded_hour) from its first day."""
    hp = f.p.health
    against_past = before is not None and lately >= hp.bleeding_peer_ratio * before
    if not against_past and lately < hp.bleeding_alone_per_loaded_hour:
        return None
    past = ("no past of its own to compare with" if before is None else
            f"its own over the {hp.bleeding_baseline_days} days before: {per_hour(before)}")
    return (f"{per_hour(lately)} {ERROR_WORDS.get(counter, counter)} per loaded hour over its last two days; no peer "
            f"of the same product; {past}")


def _median(values: list[float]) -> float:
    """statistics.median's value, without its import (decimal and fractions: 0.8 MiB of the daemon's resident memory
    for this one call)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _bleeding_against_peers(f: Facts, counter: str, lately: float, theirs: list[float]) -> str | None:
    median = _median(theirs)
    if lately < f.p.health.bleeding_peer_ratio * median:
        return None
    return (f"{per_hour(lately)} {ERROR_WORDS.get(counter, counter)} per loaded hour over its last two days; its "
            f"{len(theirs)} peer(s) of the same product over theirs: {per_hour(median)} (median)")


def _bleeding_errors(f: Facts) -> Findings:
    bleeding = []  # one reason for every counter that bleeds: a code labels one series of the health metric
    for counter, (lately, before) in f.recent().items():
        if lately is None or lately < f.p.health.bleeding_floor_per_loaded_hour:
            continue
        theirs = f.peers.get(counter)
        words = (_bleeding_against_peers(f, counter, lately, theirs) if theirs
                 else _bleeding_alone(f, counter, lately, before))
        if words:
            bleeding.append(words)
    if bleeding:
        return (("watch", "bleeding_errors", "; ".join(bleeding) + ": a fault that shows under load; have it tested"),)
    return NONE


def _stalled_calls(f: Facts) -> Findings:
    under, idle = f.window["stalls"]
    if under + idle < f.p.health.stall_watch_count:
        return NONE
    only = " only under load, as the calls of a failing GPU hang in the field" if not idle else ""
    slow = slow_reads_text(f.w.slow_reads)
    return (("watch", "stalled_calls", f"its NVML reads missed the sampler's deadline {under + idle} times "
             f"({under} under load, {idle} idle) in its last {f.p.health.window_days} days{only}"
             + (f"; {slow}" if slow else "") + ": a driver or GPU fault; check the kernel log"),)


def _repeat_incidents(f: Facts) -> Findings:
    hp = f.p.health
    repeat = repeated_incidents(f.w, hp.repeat_incidents, hp.repeat_window_days * 86400.0)
    if repeat is None:
        return NONE
    first, last, whats = repeat
    days = f"{hp.repeat_window_days:g} day(s)"
    first_day, last_day = (time.strftime("%Y-%m-%d", time.gmtime(t)) for t in (first, last))
    span = first_day if first_day == last_day else f"{first_day} to {last_day}"
    severity = f.incident(last)
    if severity is None:
        return NONE
    return ((severity, "repeat_incidents",
             f"needed a reset, a reboot or service {len(whats)} times within {days} ({span}: {', '.join(whats)}): "
             + ("the repairs are not holding; have it checked by its vendor" if severity == "act" else
                "in its history; keep watching")),)


CARRIED_WORDS = {"ecc_corrected_aggregate": "corrected ECC errors", "ecc_uncorrected_aggregate":
                 "uncorrectable ECC errors", "retired_pages_single_bit": "pages retired for single-bit errors",
                 "retired_pages_double_bit": "pages retired for double-bit errors",
                 "remapped_rows_corrected": "rows remapped for correctable errors",
                 "remapped_rows_uncorrected": "rows remapped for uncorrectable errors"}


def _uncorrectable_ecc_history(f: Facts) -> Findings:
    n = f.h.get("ecc_uncorrected_aggregate", 0)
    if n > 0 and not f.h.get("ecc_uncorrected_volatile", 0) > 0:  # said by uncorrectable_ecc while volatile
        last = f.growing("ecc_uncorrected_aggregate")
        if last is not None:
            carried, inherited = f.carried("counted", "ecc_uncorrected_aggregate")
            return (("watch", "uncorrectable_ecc_history", f"{n} uncorrectable ECC error(s) in the card's lifetime "
                     f"record{carried}{'' if inherited else last}"),)
    return NONE


def _counts_went_down(f: Facts) -> Findings:
    """A lifetime count the card keeps (accumulate.CARRIED_COUNTS) read lower than before, within
    wear.health.growth_watch_days of it: the card's InfoROM was cleared or reflashed, or it is not the card it was."""
    down = []
    for name in sorted(CARRIED_COUNTS):
        when = f.w.last_event.get(f"went down {name}")
        if when is not None and f.within(when, f.p.health.growth_watch_days):
            was, now = f.h.get(f"went down {name}"), f.h.get(name)
            was_words, now_words = (f"{n:,}" if isinstance(n, int) else "?" for n in (was, now))
            down.append(f"{CARRIED_WORDS.get(name, name)} from {was_words} to {now_words} on "
                        f"{time.strftime('%Y-%m-%d', time.gmtime(when))}")
    if down:
        return (("watch", "counts_went_down", "lifetime counts went down, which they never do: " + "; ".join(down)
                 + ": its InfoROM was cleared or reflashed, or this is not the card it was"),)
    return NONE


def _slowdown(f: Facts) -> float | None:
    return f.w.thresholds.get("slowdown")


def _time_above_slowdown(f: Facts) -> Findings:
    slowdown = _slowdown(f)
    if slowdown is None:
        return NONE
    above = f.hot_seconds(slowdown)
    if above >= f.p.health.slowdown_watch_seconds:
        return (("watch", "time_above_slowdown", f"{above / 3600:.2f} h at or above the card's own slowdown "
                 f"temperature ({slowdown:g} °C) in its last {f.p.health.window_days} days"),)
    return NONE


def _close_to_slowdown(f: Facts) -> Findings:
    slowdown, busy, hp = _slowdown(f), f.window["busy"], f.p.health
    if slowdown is None or busy <= 0:
        return NONE
    # headroom: the time just below the slowdown temperature (time above it has its own reason); the window keeps
    # HOT_BELOW_CELSIUS under it
    margin = min(hp.margin_celsius, HOT_BELOW_CELSIUS)
    near = f.hot_seconds(slowdown - margin) - f.hot_seconds(slowdown)
    if near >= hp.margin_watch_ratio * busy:
        return (("watch", "close_to_slowdown", f"{100 * min(near / busy, 1):.0f} % of busy time within "
                 f"{margin:g} °C below its slowdown temperature ({slowdown:g} °C) in its last {hp.window_days} days: "
                 "little headroom; a warmer room or dust takes it into slowdown"),)
    return NONE


def _thermal_throttling(f: Facts) -> Findings:
    thermal, busy = f.window["throttled"], f.window["busy"]
    if busy > 0 and thermal / busy >= f.p.health.thermal_throttle_watch_ratio:
        return (("watch", "thermal_throttling", f"thermally throttled {100 * thermal / busy:.1f} % of busy time in "
                 f"its last {f.p.health.window_days} days: the card protects itself by slowing down; check cooling "
                 "and airflow"),)
    return NONE


def _cooling_degrading(f: Facts) -> Findings:
    rise = f.trend["rise_ratio"] if f.trend else None
    if rise is not None and rise >= f.p.health.resistance_rise_watch_ratio:
        return (("watch", "cooling_degrading", f"the die runs {100 * rise:.0f} % hotter per watt than when first "
                 "measured: dust or dried thermal paste?"),)
    return NONE


def missing_after(p: WearConfig) -> float:
    """How long (s) a GPU of the host may go unseen while its others are seen before it is missing: three saves of
    the ledger and a minute (every GPU the daemon lists is seen at every save)."""
    return 3 * p.persist_interval_seconds + 60.0


def _gpu_missing(f: Facts) -> Findings:
    host, seen = f.host_last_seen, f.w.last_seen
    if host is None or seen is None or host - seen < missing_after(f.p):
        return NONE
    since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seen))
    return (("act", "gpu_missing", f"not seen since {since}, while this host's other GPUs were seen until "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(host))}: off the bus, kept from NVML, or taken out "
             f"(`gpuwear forget {f.w.uuid}` if on purpose)"),)


def _memory_health_unknown(f: Facts) -> Findings:
    if not f.h.get("ecc_enabled") and not f.h.get("memory_temperature_reported"):
        return (("unknown", "memory_health_unknown", "this card reports neither ECC counters nor memory temperature: "
                 "its memory health cannot be known"),)
    return NONE


# -- the table -----------------------------------------------------------------------------------------------------

_MEMORY_ERRORS = "NVIDIA, GPU Memory Error Management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt)"
_PAGE_RETIREMENT = "NVIDIA, Dynamic Page Retirement (docs.nvidia.com/deploy/dynamic-page-retirement)"
_FABRIC = ("nvml.h, nvmlGpuFabricInfo_t: on Hopper and newer NVSwitch systems the GPU registers with the NVLink "
           "fabric as the driver loads; 'status: error status, if any; must be checked only if state returns "
           "complete' (GPUd and DCGM read it)")
_FABRIC_MASK = ("nvml.h's NVML_GPU_FABRIC_HEALTH_MASK_* (DEGRADED_BW R550+; ROUTE_RECOVERY, ROUTE_UNHEALTHY, "
                "ACCESS_TIMEOUT_RECOVERY R570+; INCORRECT_CONFIGURATION R580+) and nvmlGpuFabricInfo_v3_t's "
                "healthSummary (R580+), the branches as nvidia-ml-py first carries them (12.570.86, 13.580.65)")
_XID_CATALOG = "NVIDIA's XID catalog, the resolution it gives for this XID (docs.nvidia.com/deploy/xid-errors)"
_XID_CARD_SOURCE = ("NVIDIA's Xid catalog, WORKFLOW_XID_13 and WORKFLOW_XID_31: the same Xid repeating on the same "
                    "GPU points to hardware, on different GPUs to the application (as quoted in NVIDIA/NVSentinel #270 "
                    "and #271); gpuwear applies it per GPU to the job names it saw")
_LATEST = "its latest reading"
_WINDOW = "its last wear.health.window_days (7) UTC days, to the day of its last sight"
_WINDOW_ENDS = "the window back under the threshold: the days that made it leave the window"
_ACT_THEN_WATCH = ("act until wear.health.incident_act_days (7) after the last, then watch until "
                   "incident_watch_days (30) after it, in the record's time; then it ends")
_GROWTH = ("wear.health.growth_watch_days (7) after the count last grew, or after gpuwear first read the GPU "
           "(a count from before that has no time)")

TABLE: tuple[Rule, ...] = (
    Rule("row_remap_failure", "nvmlDeviceGetRemappedRows: isFailureOccurred", _LATEST, "set", "act",
         "the flag clears (the card serviced or replaced)",
         _MEMORY_ERRORS + ": a failed row remap means the GPU needs service", _row_remap_failure,
         "GpuwearRowRemapFailure"),
    Rule("row_remap_pending", "nvmlDeviceGetRemappedRows: isPending", _LATEST, "set", "watch",
         "a GPU reset applies the remap and the flag clears",
         _MEMORY_ERRORS + ": a pending remap is applied at the next GPU reset", _row_remap_pending,
         "GpuwearRowRemapPending"),
    Rule("page_retirement_pending", "nvmlDeviceGetRetiredPagesPendingStatus", _LATEST, "set", "watch",
         "a driver reload or GPU reset retires the page and the flag clears", _PAGE_RETIREMENT,
         _page_retirement_pending, "GpuwearRetiredPagesPending"),
    Rule("recovery_action", "NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", _LATEST, "any action but None (0)",
         "act", "the field reads None (0) again",
         "the driver's own request (NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)", _recovery_action,
         "GpuwearRecoveryActionRequired"),
    Rule("reset_required", "NVML_ERROR_RESET_REQUIRED from the GPU's reads", _LATEST, "its reads answer it",
         "act", "a read of the GPU answered without it (the GPU reset)",
         "NVML's own answer: NVML_ERROR_RESET_REQUIRED, 'The GPU requires a reset before it can be used again' "
         "(nvml.h)", _reset_required),
    Rule("uncorrectable_ecc", "nvmlDeviceGetTotalEccErrors (uncorrected, volatile)", "since the driver loaded",
         "> 0", "act", "a GPU reset or driver reload zeroes the volatile count",
         _MEMORY_ERRORS + ": results computed after an uncorrectable error may be wrong", _uncorrectable_ecc,
         "GpuwearUncorrectableEccError"),
    Rule("retired_pages_limit", "nvmlDeviceGetRetiredPages (single- and double-bit)", "the card's lifetime",
         ">= 60 pages", "act", "never: a retired page stays retired",
         "NVIDIA DCGM's health check: 60 or more retired pages is a failing GPU", _retired_pages_limit,
         "GpuwearRetiredPagesLimit"),
    Rule("retired_pages", "nvmlDeviceGetRetiredPages (single- and double-bit)", "the card's lifetime count, "
         "judged while it grows", "1 to 59 pages", "watch", _GROWTH, _PAGE_RETIREMENT, _retired_pages),
    Rule("pcie_aer_uncorrectable", "sysfs aer_dev_nonfatal and aer_dev_fatal of the GPU's PCI function",
         "since boot", "> 0", "watch", "a reboot zeroes the kernel's counts",
         "gpuwear's own rule: any uncorrectable PCIe error (non-fatal or fatal) the Linux kernel's AER driver counted "
         "at the GPU's PCI function since boot (sysfs aer_dev_nonfatal and aer_dev_fatal, "
         "Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats)", _pcie_aer),
    Rule("nvlink_down", "nvmlDeviceGetNvLinkState, links active", "its latest reading, against the most it has "
         "had active and the host's other GPUs of its product", "fewer, for 5 minutes", "act",
         "the links active again (held until then: a link down for a day is not forgotten)",
         "NVIDIA DCGM's health watch, which isolates a GPU with an NVLink link down (DCGM_FR_NVLINK_DOWN), applied "
         "by gpuwear: fewer links active than the most the GPU has had active, or than the host's other GPUs of its "
         "product have, for 5 minutes (links train for a while after a boot)", _nvlink_down,
         "GpuwearNvlinkDown"),
    Rule("nvlink_recoveries", "nvmlDeviceGetNvLinkErrorCounter, NVML_NVLINK_ERROR_DL_RECOVERY, summed over the links",
         "since the driver loaded", "> 0", "watch", "a driver reload or GPU reset zeroes the counter",
         "gpuwear's own rule, as its GpuwearNvlinkRecoveries alert: any NVLink recovery (a link that failed and "
         "retrained) since the driver loaded (nvmlDeviceGetNvLinkErrorCounter, NVML_NVLINK_ERROR_DL_RECOVERY)",
         _nvlink_recoveries, "GpuwearNvlinkRecoveries"),
    Rule("pcie_link_downgraded", "nvmlDeviceGetCurrPcieLinkWidth and Generation against the Max ones", _LATEST,
         "below, for 10 minutes (the generation only under load)", "watch",
         "a reading at the full width (and, under load, generation)",
         "gpuwear's own rule, as its GpuwearPcieLinkDowngraded alert: for 10 minutes, the PCIe link trained below "
         "the lanes, or under load the generation, that the card and its slot allow (nvmlDeviceGetCurrPcieLinkWidth "
         "and Generation against the Max ones)", _pcie_link_downgraded,
         "GpuwearPcieLinkDowngraded", PCIE_DOWNGRADED_HOLD_SECONDS),
    Rule("fabric_failed", "nvmlDeviceGetGpuFabricInfo(V): state and status; the V call's health mask and summary",
         _LATEST, "state completed with a status other than success; or the mask's route-unhealthy field true, its "
         "configuration field incorrect, or the summary unhealthy", "act",
         "a reading of a completed registration with success, none of these (the GPU reset, the fabric manager "
         "restarted, the configuration mended)",
         _FABRIC + "; DCGM reads the status as a fabric manager failure (its DcgmFMStatusFailure) and the mask's "
         "route-unhealthy field as an NVLink incident (NVIDIA/DCGM testing/python3/tests/test_health.py, "
         "test_dcgm_health_check_fabric_health_mask); " + _FABRIC_MASK, _fabric_failed),
    Rule("fabric_degraded", "nvmlDeviceGetGpuFabricInfo(V): state; the V call's health mask and summary", _LATEST,
         "not completed for 10 minutes; or the mask's degraded-bandwidth, route-recovery or access-timeout-recovery "
         "field true, or the summary limited capacity", "watch",
         "a reading completed, none of these",
         _FABRIC + "; DCGM reads the mask's degraded-bandwidth field as an NVLink incident (same test); "
         + _FABRIC_MASK, _fabric_degraded),
    Rule("remapped_rows", "nvmlDeviceGetRemappedRows: corrRows + uncRows", "the card's lifetime count, judged while "
         "it grows", "> 0", "watch", _GROWTH, _MEMORY_ERRORS, _remapped_rows),
    Rule("firmware_changed", "nvmlDeviceGetVbiosVersion, nvmlDeviceGetInforomImageVersion, "
         "nvmlDeviceGetInforomConfigurationChecksum, read at each open of the GPU", "from the change, in the record's "
         "time", "any change from the last read", "watch", "wear.health.growth_watch_days (7) after the latest change",
         "gpuwear's own rule (issue 55): a card's firmware changes only when someone flashes it or its InfoROM is "
         "rewritten; the lifetime counts the InfoROM keeps (nvml.h: aggregate ECC, retired pages, remapped rows) may "
         "then not be this card's history", _firmware_changed),
    Rule("inforom_invalid", "nvmlDeviceValidateInforom (NVML_ERROR_CORRUPTED_INFOROM)", _LATEST, "set", "watch",
         "a read that validates (after a reflash)", "nvml.h, nvmlDeviceValidateInforom: \"reads the infoROM from the "
         "flash and verifies the checksums\"; the counts it keeps are the card's lifetime memory history",
         _inforom_invalid),
    Rule("remap_headroom", "nvmlDeviceGetRowRemapperHistogram: banks at low and at none", "the card's lifetime "
         "counts, judged while they grow", "> 0", "watch", _GROWTH,
         "nvml.h, nvmlRowRemapperHistogramValues_t: each bank's remap availability, none meaning no reserved rows "
         "available; " + _MEMORY_ERRORS + ": every bank has spare rows, and a failed remap means the GPU needs "
         "service", _remap_headroom),
    Rule("xid_N", "XIDs from NVML's events and the kernel log, by code (health.xids)", "from the code's last "
         "occurrence, in the record's time",
         "any XID of the catalog's act, watch or app tier, or newer than the catalog (watch); XID 74 on a Hopper "
         "GPU by its line's registers: bits the workflow ignores give nothing, bits it calls for service on a "
         "repeat are watched until repeated on their link within 24 h, bits it calls secondary are watched beside "
         "another XID of the GPU or the host's NVSwitch SXids (within 10 minutes either side; not an XID of no reason "
         "of its own, as XID 45) and act "
         "seen solo; XIDs 144-150 by NVIDIA's decode of their "
         "line's unit and error status: a reset is act, the rest nothing", "the code's tier",
         "act codes: " + _ACT_THEN_WATCH + "; watch codes, and XID 74 lines waiting for a repeat: "
         "wear.health.xid_watch_days (7) after the last; codes resolved by restarting the application (13, 31, 94 "
         "and the engine exceptions): xid_app_days (1)",
         _XID_CATALOG + "; for XID 74, " + NVLINK_SOURCE + "; for 144-150, " + NVLINK5_SOURCE, _xids,
         "GpuwearXidCritical"),
    Rule("xid_card", "the applications (job names) on the GPU when each XID of the catalog's app tier came "
         "(tracker: the jobs running then)", "wear.health.xid_card_days (14) before the GPU's last sight",
         "the same code under wear.health.xid_card_applications (2) or more different applications", "watch",
         "fewer applications within the window: the older ones leave it", _XID_CARD_SOURCE, _xid_card,
         "GpuwearXidCard"),
    Rule("gpu_lost", "NVML_ERROR_GPU_IS_LOST from any read", "from its last occurrence, in the record's time", "any",
         "act",
         _ACT_THEN_WATCH, _XID_CATALOG.replace("this XID", "XID 79 (fallen off the bus)"), _gpu_lost,
         "GpuwearGpuLost"),
    Rule("bleeding_errors", "corrected ECC errors, PCIe replays, NVLink CRC errors and replays, rows remapped for "
         "correctable errors, per loaded hour", "its last two UTC days (RECENT_ERROR_DAYS), for every GPU; its peers' "
         "same days; alone, also the wear.health.bleeding_baseline_days before them",
         "wear.health.bleeding_peer_ratio x the peers' median; alone, x its own past or "
         "wear.health.bleeding_alone_per_loaded_hour; above wear.health.bleeding_floor_per_loaded_hour, after "
         "wear.health.bleeding_min_loaded_hours of load in the window",
         "watch", "its last two UTC days back under the threshold (within two days of the bleed stopping)",
         "gpuwear's own rule, not NVIDIA's: an error rate per loaded hour over the GPU's last two UTC days at least "
         "wear.health.bleeding_peer_ratio times the median of the host's GPUs of the same product over the same days "
         "(a GPU without such peers: times its own rate over the wear.health.bleeding_baseline_days before them, or "
         "at least wear.health.bleeding_alone_per_loaded_hour from its first day), and above "
         "wear.health.bleeding_floor_per_loaded_hour (the field case: a GB200 leaking about 17,700 "
         "corrected ECC errors a second under load, 0 at idle, that DCGM called healthy: NVIDIA/DCGM "
         "#313, NVIDIA/NVSentinel #1748)", _bleeding_errors),
    Rule("stalled_calls", "the sampler's reads of the GPU past sampling.nvml_deadline_seconds", _WINDOW,
         "wear.health.stall_watch_count", "watch", _WINDOW_ENDS,
         "gpuwear's own rule, not NVIDIA's: wear.health.stall_watch_count NVML reads past the sampler's "
         "deadline (sampling.nvml_deadline_seconds) in the GPU's last wear.health.window_days UTC days (the field "
         "case: a GB200 whose driver calls hung only under load: NVIDIA/DCGM #313)", _stalled_calls),
    Rule("repeat_incidents", "the incidents that call for a reset, a reboot or service (the newest 64 kept; one "
         "within 10 minutes of the one before, or a sticky XID within 3 hours of one, is the same)",
         "wear.health.repeat_window_days", "wear.health.repeat_incidents", "act",
         _ACT_THEN_WATCH.replace("after the last", "after the last of the run"),
         "NVIDIA NVSentinel's MultipleRemediations rule (5 remediated fatal events on a node within 7 days: the "
         "repairs are not resolving the fault; its health-events-analyzer chart, 2025), applied by gpuwear per GPU to "
         "the incidents that call for a reset, a reboot or service, one fault's burst counted once "
         "(wear.health.repeat_incidents, repeat_window_days)",
         _repeat_incidents),
    Rule("uncorrectable_ecc_history", "nvmlDeviceGetTotalEccErrors (uncorrected, aggregate)",
         "the card's lifetime count (before gpuwear too), judged while it grows",
         "> 0 (while uncorrectable_ecc does not say it)", "watch", _GROWTH,
         _MEMORY_ERRORS, _uncorrectable_ecc_history),
    Rule("counts_went_down", "the lifetime counts the card keeps (aggregate ECC, retired pages, remapped rows) "
         "against their reading before", "wear.health.growth_watch_days (7) after one went down",
         "any count lower than its reading before", "watch", "wear.health.growth_watch_days (7) after the last",
         "nvml.h: the aggregate ECC counts persist 'for the lifetime of the device', retired pages and remapped rows "
         "in its InfoROM; one that goes down was cleared (an InfoROM reflash) or read from another card (issue 55)",
         _counts_went_down),
    Rule("time_above_slowdown", "seconds at or above nvmlDeviceGetTemperatureThreshold (slowdown)", _WINDOW,
         "wear.health.slowdown_watch_seconds", "watch", _WINDOW_ENDS,
         "gpuwear's own rule: wear.health.slowdown_watch_seconds at or above the card's slowdown "
         "temperature (NVML's threshold) in its last wear.health.window_days UTC days", _time_above_slowdown),
    Rule("close_to_slowdown", "seconds within wear.health.margin_celsius (at most 20) below the slowdown temperature",
         _WINDOW, "wear.health.margin_watch_ratio of busy time (utilization 10 % or more)", "watch", _WINDOW_ENDS,
         "gpuwear's own rule: wear.health.margin_watch_ratio of busy time within "
         "wear.health.margin_celsius below the card's slowdown temperature (NVML's threshold) in its last "
         "wear.health.window_days UTC days", _close_to_slowdown),
    Rule("thermal_throttling", "seconds with a thermal clock-event reason (nvmlDeviceGetCurrentClocksEventReasons)",
         _WINDOW, "wear.health.thermal_throttle_watch_ratio of busy time (utilization 10 % or more)", "watch",
         _WINDOW_ENDS, "gpuwear's own rule: wear.health.thermal_throttle_watch_ratio of busy time throttled in its "
         "last wear.health.window_days UTC days", _thermal_throttling, "GpuwearThermalThrottling"),
    Rule("cooling_degrading", "the die's °C per watt at steady load, per UTC day", "its first three days with data "
         "against its last three", "wear.health.resistance_rise_watch_ratio", "watch",
         "the last three days' °C per watt back under the rise", "gpuwear's own rule: "
         "wear.health.resistance_rise_watch_ratio rise of °C per watt", _cooling_degrading, "GpuwearCoolingDegraded"),
    Rule("gpu_missing", "the GPU's last sight in the ledger against the host's other GPUs'", "the ledger's last "
         "saves", "unseen for three saves and a minute while the others were seen", "act",
         "the GPU seen again, or forgotten (gpuwear forget)", "gpuwear's own rule: a GPU of this host the daemon "
         "no longer sees while it sees the others (the daemon says it live: /healthz and GpuwearGpuMissing)",
         _gpu_missing, "GpuwearGpuMissing"),
    Rule("memory_health_unknown", "whether the card reports ECC counters or memory temperature", "the GPU's record",
         "neither reported", "unknown", "never on that card: said beside the verdict, never instead of it",
         "what NVML reports of this card: no ECC counters, no memory temperature", _memory_health_unknown),
)
RULES = {r.code: r.source for r in TABLE if r.code != "xid_N"}


def mode_problems(modes: Mapping[str, str]) -> list[str]:
    """wear.health.rules' codes that name no rule of the table, each in one line."""
    known = [r.code for r in TABLE]
    return [f"wear.health.rules.{code}: no rule has this code (known: {', '.join(known)})"
            for code in modes if code not in known]
XID_RULE = _XID_CATALOG
