"""NVIDIA's Xid catalog as data: each code gpuwear judges, what it means, the resolution NVIDIA gives for it and the
tier gpuwear's verdict puts it in. Judgements as data (GPUd's and NVSentinel's XID tables are the example): the rule
``xid`` (health.rules) reads this table and nothing else about a code."""

from __future__ import annotations

from dataclasses import dataclass

CATALOG_SOURCE = ("NVIDIA, Xid Errors: the Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), "
                  "its immediate and investigatory resolution buckets")
AS_ISSUE_51_READ = CATALOG_SOURCE + ": resolved by resetting the GPU, as issue 51 read the catalog (2026-12)"
OLDER_SOURCE = "NVIDIA's older Xid list (r555), as copied in leptonai/gpud components/accelerator/nvidia/query/xid"


@dataclass(frozen=True)
class Xid:
    """One code of the catalog. ``tier``: what the verdict makes of it ("act": the resolution asks for a GPU reset,
    a reboot or service, and the XID counts as an incident, act for wear.health.incident_act_days then watch until
    incident_watch_days; "watch": watched for xid_watch_days; "app": the resolution is to restart the application,
    watched for xid_app_days; "none": no reason of its own)."""

    code: int
    meaning: str
    resolution: str  # NVIDIA's immediate / investigatory action
    tier: str
    source: str = CATALOG_SOURCE


CATALOG: tuple[Xid, ...] = (
    Xid(13, "graphics engine exception", "restart app / workflow Xid 13", "app"),
    Xid(31, "GPU memory page fault", "restart app / workflow Xid 31", "app"),
    Xid(43, "GPU stopped processing (the GPU remains in a healthy state)", "ignore / contact support", "none"),
    Xid(45, "preemptive cleanup after earlier errors or an abort", "workflow Xid 45 / follow the other Xid", "none"),
    Xid(46, "GPU stopped processing", "reset GPU / contact support", "act"),
    Xid(48, "double-bit ECC error", "workflow Xid 48 (reset or reboot)", "act"),
    Xid(61, "internal micro-controller breakpoint", "report a GPU issue and reset GPU(s)", "act", OLDER_SOURCE),
    Xid(62, "internal micro-controller halt", "reset GPU / contact support", "act"),
    Xid(63, "ECC page retirement or row remap recorded", "ignore / ignore", "watch"),
    Xid(64, "ECC page retirement or row remap failed", "reset GPU / contact support", "act"),
    Xid(74, "NVLink error", "NVLink workflow; reset or reboot", "act"),
    Xid(79, "GPU fell off the bus", "restart bare metal / contact support", "act"),
    Xid(92, "high single-bit ECC error rate", "ignore / contact support", "watch"),
    Xid(94, "contained ECC error", "restart app; reset when convenient", "app"),
    Xid(95, "uncontained ECC error", "reset GPU", "act"),
    Xid(119, "GSP RPC timeout", "reset GPU / investigate software", "act"),
    Xid(120, "GSP error", "reset GPU / investigate software", "act"),
    Xid(140, "unrecovered ECC error", "reset GPU / contact support", "act"),
    Xid(109, "context switch timeout", "reset GPU", "act", AS_ISSUE_51_READ),
    Xid(136, "an error NVIDIA's catalog resolves by resetting the GPU", "reset GPU", "act", AS_ISSUE_51_READ),
    Xid(143, "an error NVIDIA's catalog resolves by resetting the GPU", "reset GPU", "act", AS_ISSUE_51_READ),
    *(Xid(code, "NVLink5 error", "NVLink5 workflow; reset GPU", "act", AS_ISSUE_51_READ) for code in range(144, 151)),
    Xid(154, "GPU recovery action changed (summarizes other Xids)", "as the recovery action says", "none"),
    Xid(155, "an error NVIDIA's catalog resolves by resetting the GPU", "reset GPU", "act", AS_ISSUE_51_READ),
    Xid(156, "an error NVIDIA's catalog resolves by resetting the GPU", "reset GPU", "act", AS_ISSUE_51_READ),
)
BY_CODE = {x.code: x for x in CATALOG}
XID_ACT = {x.code: x.meaning for x in CATALOG if x.tier == "act"}
XID_WATCH = {x.code: x.meaning for x in CATALOG if x.tier in ("watch", "app")}

# XID 74 (NVLink error) is judged line by line: its line gives the link and seven registers, and NVIDIA's workflow
# for Hopper-based products says, bit by bit, which can be ignored, which call for service at once and which only
# when they repeat on the same link. An XID 74 without its line (NVML's event alone, a line without registers) or on
# another architecture is judged by its tier, as before.
NVLINK_SOURCE = ("NVIDIA's Xid catalog, WORKFLOW_NVLINK_ERR (XID 74 on Hopper-based products: the first, third, "
                 "fourth and fifth registers), as quoted in NVIDIA/NVSentinel #364 (2025-11-19) and its design 022")
LINE_JUDGED = frozenset({74})  # codes whose kernel-log line decides their step
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
    """The step NVIDIA's XID 74 workflow gives a line's registers (:data:`NVLINK_STEPS`): IGNORE, SERVICE, or the
    number of times on the same link that calls for service. A bit the workflow does not list is SERVICE ("If bits
    other than those specifically outlined below are seen, please report a bug"); registers it does not read (the
    second, sixth and seventh) are not looked at; a line with no bit set is SERVICE (nothing to go on: the code's
    tier)."""
    steps = [NVLINK_STEPS[r].get(bit, SERVICE) for r in NVLINK_STEPS if r < len(registers)
             for bit in range(32) if registers[r] >> bit & 1]
    steps += [SERVICE for r in NVLINK_STEPS if r < len(registers) and registers[r] >> 32]  # wider than a register
    acting = [s for s in steps if s != IGNORE]
    if steps and not acting:
        return IGNORE
    repeats = [s for s in acting if isinstance(s, int)]
    if SERVICE in acting or not repeats:  # no bit to go on, or secondary bits seen solo ("report a bug")
        return SERVICE
    return min(repeats)
