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
