"""NVIDIA's Xid catalog as data: every code of it (health.xid_catalog), what it means, the resolution NVIDIA gives
for it and the tier gpuwear's verdict puts it in, with why. Judgements as data (GPUd's and NVSentinel's XID tables
are the example): the rule ``xid`` (health.rules) reads this table and nothing else about a code."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwear.health.xid_catalog import CATALOG_DATE, CATALOG_URL, NVLINK5_DECODE, ROWS

CATALOG_SOURCE = (f"NVIDIA, Xid Errors: the Xid catalog for Ampere and newer ({CATALOG_URL}, as of {CATALOG_DATE}), "
                  "its immediate and investigatory resolution buckets")
OLDER_SOURCE = "NVIDIA's older Xid list (r555), as copied in leptonai/gpud components/accelerator/nvidia/query/xid"
OWN_SOURCE = f"gpuwear's own reading: the catalog (as of {CATALOG_DATE}) gives this code no resolution yet"

# The tier of a code follows from the immediate resolution NVIDIA's catalog gives it: service at once (a reset, a
# reboot, a workflow that ends in one, hands on the card) is act; restarting the application (or its VM) is the
# application tier; asking to contact support, update software or check UVM is watch; ignoring it, or following
# the other Xid it summarises or sits beside (45, 154), is no reason of its own.
BUCKET_TIERS = {
    "RESET_GPU": "act", "RESTART_BM": "act", "WORKFLOW_XID_48": "act", "WORKFLOW_NVLINK_ERR": "act",
    "WORKFLOW_NVLINK5_ERR": "act", "CHECK_MECHANICALS": "act",
    "RESTART_APP": "app", "RESTART_VM": "app",
    "CONTACT_SUPPORT": "watch", "UPDATE_SWFW": "watch", "CHECK_UVM": "watch",
    "IGNORE": "none", "WORKFLOW_XID_45": "none", "XID_154": "none",
}
# Codes whose tier is not their bucket's, each with why: a code the catalog lists as unused that older drivers
# wrote; two the catalog says to ignore that gpuwear watches; and the newest codes, to which the catalog gives no
# resolution yet (judged as the code each resembles).
OVERRIDES: dict[int, tuple[str, str, str]] = {  # code -> (tier, meaning where the catalog's is not one, why)
    61: ("act", "internal micro-controller breakpoint (older drivers)",
         "unused in the current catalog; NVIDIA's older list resolves it by reporting a GPU issue and resetting the "
         "GPU"),
    63: ("watch", "", "the catalog says to ignore it; a page retired or a row remapped is memory set aside, watched "
         "for a while as the counts of retired pages and remapped rows are"),
    92: ("watch", "", "the catalog says to ignore it at once and contact support later; a high corrected-error rate "
         "is what bleeding_errors watches"),
    162: ("none", "", "good news: the power-smoothing circuitry works again"),
    163: ("watch", "", "one circuit (power smoothing) stopped, not the GPU"),
    164: ("watch", "", "one circuit (power smoothing) near the end of its life, not the GPU"),
    165: ("watch", "", "one circuit (power smoothing) at the end of its life, not the GPU"),
    166: ("watch", "", "a confidential-computing configuration fault"),
    167: ("act", "", "a fatal PCIe timeout: the bus, as XID 79"),
    168: ("act", "", "GPU memory capacity reduced: memory, as XID 64"),
    169: ("act", "", "an internal micro-controller halt, as XID 62"),
    170: ("watch", "", "a confidential-computing interrupt"),
    171: ("none", "", "adds detail to XID 48, which is judged itself"),
    172: ("none", "", "adds detail to XID 48, which is judged itself"),
}


@dataclass(frozen=True)
class Xid:
    """One code of the catalog. ``tier``: what the verdict makes of it ("act": the resolution asks for a GPU reset,
    a reboot or service, and the XID counts as an incident, act for wear.health.incident_act_days then watch until
    incident_watch_days; "watch": watched for xid_watch_days; "app": the resolution is to restart the application,
    watched for xid_app_days; "none": no reason of its own). ``why``: where the tier comes from."""

    code: int
    meaning: str
    resolution: str  # NVIDIA's immediate / investigatory action
    tier: str
    source: str = CATALOG_SOURCE
    why: str = ""
    mnemonic: str = ""


def _entry(code: int, mnemonic: str, description: str, immediate: str, investigatory: str) -> Xid:
    tier, meaning, why = OVERRIDES.get(code, ("", "", ""))
    described = description if description != "Unused" else "unused in the catalog"
    resolution = " / ".join(r for r in (immediate, investigatory) if r) or "none given yet"
    source = (OLDER_SOURCE if code == 61 else OWN_SOURCE if not immediate else CATALOG_SOURCE)
    return Xid(code, meaning or described, resolution, tier or BUCKET_TIERS[immediate], source,
               why or f"the immediate resolution {immediate}", mnemonic)


CATALOG: tuple[Xid, ...] = tuple(_entry(*row) for row in ROWS)
BY_CODE = {x.code: x for x in CATALOG}
XID_ACT = {x.code: x.meaning for x in CATALOG if x.tier == "act"}
XID_WATCH = {x.code: x.meaning for x in CATALOG if x.tier in ("watch", "app")}
XID_NONE = frozenset(x.code for x in CATALOG if x.tier == "none")


XID_APP = "xid {code} app "  # a record's last_event key prefix: an application an XID of the app tier came under
# ... and where on the chip the XID's line said it came, where it said ("xid 13 at GPC 1 TPC 3 app NAME")
XID_UNIT_APP = "xid {code} at {unit} app "


def applications(last_event: dict[str, float], code: int, since: float | None) -> dict[str, float]:
    """The applications an XID of ``code`` came under on a GPU (its record's ``last_event``), each with the last
    time, those at or after ``since`` (None: all)."""
    prefix = XID_APP.format(code=code)
    return {k[len(prefix):]: when for k, when in last_event.items()
            if k.startswith(prefix) and (since is None or when >= since)}


def card_evidence(last_event: dict[str, float], code: int, since: float | None) -> tuple[list[str], str | None]:
    """The applications an XID of ``code`` came under on a GPU since ``since``, and where: NVIDIA's Xid 13 workflow
    reads a repeat at the same GPC and TPC as the hardware, so where the lines said where (XID 13's do), the most
    applications at one place on the chip and that place; else all of them and None."""
    prefix = f"xid {code} at "
    at: dict[str, set[str]] = {}
    for key, when in last_event.items():
        if key.startswith(prefix) and " app " in key and (since is None or when >= since):
            unit, _, app = key[len(prefix):].partition(" app ")
            at.setdefault(unit, set()).add(app)
    if at:
        unit, apps = max(at.items(), key=lambda kv: (len(kv[1]), kv[0]))
        return sorted(apps), unit
    return sorted(applications(last_event, code, since)), None


def lookup(code: int) -> Xid:
    """The catalog's entry for ``code``; a code it does not list (newer than the catalog gpuwear has) is watched:
    NVIDIA adds codes for new faults, and one nobody can look up is worth a look."""
    return BY_CODE.get(code) or Xid(code, f"not in NVIDIA's catalog as of {CATALOG_DATE}", "none known", "watch",
                                    CATALOG_SOURCE, "a code newer than the catalog gpuwear has")


def alert_tier(code: int) -> str | None:
    """The alert an XID of ``code`` raises (GpuwearXidCritical: "act", GpuwearXidWatch: "watch"; the label of
    gpuwear_xid_tier_events_total): act for the catalog's act tier, watch for its watch and application tiers and
    codes newer than it; None for the codes it says to ignore and those whose line decides (:data:`LINE_JUDGED`:
    GpuwearHealthAct names them when they call for service)."""
    if code in LINE_JUDGED:
        return None
    tier = lookup(code).tier
    return "act" if tier == "act" else "watch" if tier in ("watch", "app") else None


# XID 74 (NVLink error) is judged line by line: its line gives the link and seven registers, and NVIDIA's workflow
# for Hopper-based products says, bit by bit, which can be ignored, which call for service at once and which only
# when they repeat on the same link. An XID 74 without its line (NVML's event alone, a line without registers) or on
# another architecture is judged by its tier, as before.
NVLINK_SOURCE = ("NVIDIA's Xid catalog, WORKFLOW_NVLINK_ERR (XID 74 on Hopper-based products: the first, third, "
                 "fourth and fifth registers), as quoted in NVIDIA/NVSentinel #364 (2025-11-19) and its design 022")
NVLINK5 = frozenset(range(144, 151))
LINE_JUDGED = frozenset({74}) | NVLINK5  # codes whose kernel-log line decides their step
IGNORE, SECONDARY, SERVICE = "ignore", "secondary", "service"
# the register (0: the line's first of seven) -> bit -> its step: IGNORE ("can be safely ignored"; "continue
# operation"), SECONDARY ("sympathetic or secondary errors": follow the other bits' resolution, and seen solo "report
# a bug"), SERVICE (check the link, re-seat, run diagnostics, report a bug), or a count: SERVICE once seen that many
# times on the same link ("more than 2 times": 3; "if seen repeatedly": 2), watched until then
NVLINK_STEPS: dict[int, dict[int, str | int]] = {
    0: {0: IGNORE, 23: IGNORE, 30: IGNORE, 1: SECONDARY, 20: SECONDARY, 21: SECONDARY, 22: SECONDARY, 4: 3, 5: 3,
        27: 2, 29: 2, **dict.fromkeys((8, 9, 12, 16, 17, 24, 28), SERVICE)},
    2: {0: 3, 1: 3, 2: 3, 6: 3, 13: SERVICE, 16: 2, 19: 2, 17: 2, 18: 2},
    3: dict.fromkeys((16, 17, 18), SECONDARY),
    4: {**dict.fromkeys((18, 19, 21, 22, 24, 25, 27, 28), 3), **dict.fromkeys((20, 23, 26, 29), IGNORE)},
}
NVLINK_REPEAT_SECONDS = 86400.0  # the catalog names no window for a repeat; NVSentinel's rules look back 24 h


def nvlink_step(registers: tuple[int, ...]) -> str | int:
    """The step NVIDIA's XID 74 workflow gives a line's registers (:data:`NVLINK_STEPS`): IGNORE, SERVICE, the
    number of times on the same link that calls for service, or SECONDARY where every bit not to ignore is one the
    workflow calls secondary (its resolution depends on the other XIDs seen with it: the rule's to judge). A bit the
    workflow does not list is SERVICE ("If bits other than those specifically outlined below are seen, please report
    a bug"); registers it does not read (the second, sixth and seventh) are not looked at; a line with no bit set is
    SERVICE (nothing to go on: the code's tier)."""
    steps = [NVLINK_STEPS[r].get(bit, SERVICE) for r in NVLINK_STEPS if r < len(registers)
             for bit in range(32) if registers[r] >> bit & 1]
    steps += [SERVICE for r in NVLINK_STEPS if r < len(registers) and registers[r] >> 32]  # wider than a register
    acting = [s for s in steps if s != IGNORE]
    if steps and not acting:
        return IGNORE
    repeats = [s for s in acting if isinstance(s, int)]
    if acting and all(s == SECONDARY for s in acting):
        return SECONDARY
    if SERVICE in acting or not repeats:  # no bit to go on
        return SERVICE
    return min(repeats)


NVLINK5_SOURCE = (f"NVIDIA's Xid catalog, WORKFLOW_NVLINK5_ERR: its decode of XIDs 144-150 by unit and error status "
                  f"({CATALOG_URL}, sheet \"XID 144-150 Decode\", as of {CATALOG_DATE})")


def _matches(pattern: str, value: int) -> bool:
    return all(bit == "-" or int(bit) == value >> (31 - i) & 1 for i, bit in enumerate(pattern))


def nvlink5_step(code: int, registers: tuple[int, ...]) -> str:
    """The step NVIDIA's decode of the NVLink5 XIDs (:data:`NVLINK5_DECODE`) gives a line's values: its first
    (the interrupt info, matched against the unit patterns of the newer form, else the older) and its second (the
    error status: the row of that value, else every set bit's row). IGNORE where every row found says to ignore it
    or to judge the Xid 154 that follows (gpuwear judges the recovery action itself); SERVICE where one calls for
    a GPU reset, or where no row is found (the code's tier)."""
    if len(registers) < 2:
        return SERVICE
    info, status = registers[0], registers[1]
    rows = [r for r in NVLINK5_DECODE if r[0] == code and _matches(r[2], info)]  # the newer pattern
    rows = rows or [r for r in NVLINK5_DECODE if r[0] == code and _matches(r[3], info)]  # else the older
    if not rows:
        return SERVICE
    found = [r[5] for r in rows if r[4] == status]
    if not found:
        bits = [1 << b for b in range(32) if status >> b & 1]
        found = [next((r[5] for r in rows if r[4] == bit), "") for bit in bits]
    if not found or any(res not in ("IGNORE", "XID_154_EVAL") for res in found):
        return SERVICE
    return IGNORE


def line_step(code: int, registers: tuple[int, ...], architecture: str | None) -> str | int:
    """The step NVIDIA's workflow for ``code`` (one of :data:`LINE_JUDGED`) gives its kernel-log line's values on a
    GPU of ``architecture`` (GpuIdentity.architecture): XID 74 by :func:`nvlink_step` on Hopper (the workflow's
    registers are published for Hopper alone; elsewhere SERVICE), 144-150 by :func:`nvlink5_step`."""
    if code in NVLINK5:
        return nvlink5_step(code, registers)
    return nvlink_step(registers) if architecture == "hopper" else SERVICE
