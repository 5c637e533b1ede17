"""Card or code: each XID of the catalog's application tier (13, 31, 94, the engine exceptions) judged with the
applications it came under, across the host's GPUs, as NVIDIA's Xid 13 and 31 workflows say to (the same XID
repeating on one GPU under different applications points to the card; the same application's XID on several GPUs
points to the code; a solo XID is checked as the application's first; for XID 13, repeats at the same GPC and TPC,
where the lines say: health.xids.card_evidence). Pure: a function of the GPUs' records.

The applications are the job names the tracker saw running when each XID came (health.xids.applications), and,
where the caller gives the job history, their clean runs on the host's other GPUs (a known-good application). What it
cannot see: a job without a name, jobs on other hosts, the processes of a PID namespace the daemon does not share,
and XIDs older than wear.health.xid_card_days: none of those counts either way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.health.xids import applications, card_evidence, lookup
from gpuwear.wear.accumulate import GpuWear

CARD, CODE, SOLO = "likely the card", "likely the code", "check the application first"
REPORT = "report to NVIDIA"  # a known-good application's fault: the driver or the card (NVIDIA's Xid workflows)
# (names, since) -> per line name (a job name's first 18 characters), per GPU, the runs that raised no XID there
CleanRuns = Callable[[list[str], float], Mapping[str, Mapping[str, int]]]
COLLATERAL, SOLO_45 = "collateral", "restart the fabric manager"
# XID 45 (preemptive cleanup, due to previous errors): NVIDIA's catalog, WORKFLOW_XID_45 ("Not Solo: IGNORE (follow
# other Xid)"; "Solo: RESTART_FM"). With another XID on the host this long before its last: not solo, its cause's.
COLLATERAL_SECONDS = 300.0
SOURCE_45 = ("NVIDIA's Xid catalog, XID 45's resolution WORKFLOW_XID_45: with another Xid, ignore it and follow that "
             "one; alone, restart the fabric manager")
SOURCE = ("NVIDIA's Xid catalog, WORKFLOW_XID_13 and WORKFLOW_XID_31, as quoted in NVIDIA/NVSentinel #270 and #271; "
          "gpuwear applies them to the job names it saw on this host's GPUs")


def _name(w: GpuWear) -> str:
    return f"GPU {w.index}" if w.index is not None else w.uuid[:12]


def card_or_code(wears: Mapping[str, GpuWear], p: WearConfig,
                 clean_runs: CleanRuns | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per GPU (by UUID), one judgement per application-tier XID it raised within wear.health.xid_card_days of the
    host's last sight: ``xid``, ``judgement`` (:data:`CARD`, :data:`CODE`, :data:`SOLO` or :data:`REPORT`),
    ``applications`` (on this GPU), ``other_gpus`` (the GPUs where the same XID came under one of them) and
    ``text``, its evidence in words. The card's judgement is also the rule xid_card's reason; the code's never marks
    the card. ``clean_runs`` (the job history, where the caller has it): a solo XID of an application that ran
    wear.health.xid_known_good_runs times on the host's other GPUs without an XID is :data:`REPORT`."""
    last = max((w.last_seen for w in wears.values() if w.last_seen is not None), default=None)
    since = None if last is None else last - p.health.xid_card_days * 86400.0
    seen: dict[str, dict[int, dict[str, float]]] = {}  # uuid -> code -> application -> last time
    for uuid, w in wears.items():
        for code in sorted(int(x) for x in w.xids if x.isdigit() and lookup(int(x)).tier == "app"):
            if apps := applications(w.last_event, code, since):
                seen.setdefault(uuid, {})[code] = apps
    out: dict[str, list[dict[str, Any]]] = {}
    for uuid, codes in seen.items():
        for code, apps in codes.items():
            others = sorted(_name(wears[u]) for u, theirs in seen.items()
                            if u != uuid and set(theirs.get(code, {})) & set(apps))
            out.setdefault(uuid, []).append(_judged(wears[uuid], code, sorted(apps), others, p, since))
    if clean_runs is not None and since is not None:
        _known_good(out, wears, p, clean_runs, since)
    for uuid, judged in _collateral(wears, since).items():
        out.setdefault(uuid, []).append(judged)
    return out


def _judged(w: GpuWear, code: int, names: list[str], others: list[str], p: WearConfig,
            since: float | None) -> dict[str, Any]:
    """One application-tier XID of a GPU judged: ``names``, the applications it came under there; ``others``, the
    GPUs where the same XID came under one of them."""
    hp = p.health
    what = f"XID {code} ({lookup(code).meaning})"
    days = f"{hp.xid_card_days:g} days"
    on_card, unit = card_evidence(w.last_event, code, since)
    if len(on_card) >= hp.xid_card_applications:
        judgement, names = CARD, on_card
        text = (f"{CARD}: {what} on this GPU under {len(names)} different applications"
                f"{f' at {unit}' if unit else ''} within {days} (" + ", ".join(names) + ")")
    elif others:
        judgement = CODE
        text = (f"{CODE}: {names[0]} raised {what} on this GPU and on " + ", ".join(others)
                + f" within {days}; no other application did on this GPU")
    elif len(names) > 1:  # applications at different places on the chip (XID 13's workflow): not one spot
        judgement = SOLO
        text = (f"{SOLO}: {what} under {len(names)} different applications on this GPU, but at different "
                f"places on the chip within {days} (" + ", ".join(names) + ")")
    else:
        judgement = SOLO
        text = f"{SOLO}: {what} under {names[0]} on this GPU alone within {days}"
    return {"xid": code, "judgement": judgement, "applications": names, "other_gpus": others, "text": text,
            "rule": SOURCE}


def _known_good(out: dict[str, list[dict[str, Any]]], wears: Mapping[str, GpuWear], p: WearConfig,
                clean_runs: CleanRuns, since: float) -> None:
    """Turn each solo XID of one application into :data:`REPORT` where that application ran at least
    wear.health.xid_known_good_runs times on the host's other GPUs within the window without any XID there (NVIDIA's
    Xid workflows: a fault of a known-good application is reported to NVIDIA, the driver or the card)."""
    solo = [(uuid, j) for uuid, judged in out.items() for j in judged
            if j["judgement"] == SOLO and len(j["applications"]) == 1]
    if not solo:
        return
    runs = clean_runs(sorted({j["applications"][0] for _, j in solo}), since)
    for uuid, j in solo:
        app = j["applications"][0]
        elsewhere = {u: n for u, n in runs.get(app[:18], {}).items() if u != uuid and n > 0}
        if (n := sum(elsewhere.values())) < p.health.xid_known_good_runs:
            continue
        gpus = sorted(_name(wears[u]) if u in wears else u[:12] for u in elsewhere)
        j["judgement"], j["clean_elsewhere"] = REPORT, {"runs": n, "gpus": gpus}
        j["text"] = (f"{REPORT}: {app} ran {n} times without an XID on " + ", ".join(gpus) + f" within "
                     f"{p.health.xid_card_days:g} days and raised XID {j['xid']} ({lookup(j['xid']).meaning}) on "
                     "this GPU alone: NVIDIA's Xid workflows report a known-good application's fault to NVIDIA "
                     "(the driver or the card)")


def _collateral(wears: Mapping[str, GpuWear], since: float | None) -> dict[str, dict[str, Any]]:
    """Each GPU's XID 45 (the driver's cleanup of work an earlier error stopped) within the window, counted with its
    cause: the host's latest other XID at most COLLATERAL_SECONDS before the 45s' last (a run's GPUs all clean up
    after one GPU's fault), else said to be alone (NVIDIA's catalog: restart the fabric manager)."""
    causes = sorted((when, int(key[4:]), uuid) for uuid, w in wears.items() for key, when in w.last_event.items()
                    if key.startswith("xid ") and key[4:].isdigit() and int(key[4:]) != 45)
    out: dict[str, dict[str, Any]] = {}
    for uuid, w in wears.items():
        last, n = w.last_event.get("xid 45"), w.xids.get("45", 0)
        if last is None or not n or (since is not None and last < since):
            continue
        before = [c for c in causes if last - COLLATERAL_SECONDS <= c[0] <= last]
        what = f"XID 45 ({lookup(45).meaning.split(' -- ')[0]}) ×{n}"
        if before:
            when, code, where = before[-1]
            there = "this GPU" if where == uuid else _name(wears[where])
            text = (f"{COLLATERAL}: {what} on this GPU, the last {last - when:.0f} s after XID {code} "
                    f"({lookup(code).meaning}) on {there}: the driver cleaning up the work that error stopped, "
                    "not a fault of its own; follow that XID")
            out[uuid] = {"xid": 45, "judgement": COLLATERAL, "cause": {"xid": code, "gpu": there}, "text": text,
                         "rule": SOURCE_45, "applications": [], "other_gpus": []}
        else:
            text = (f"{SOLO_45}: {what} on this GPU with no other XID on the host within "
                    f"{COLLATERAL_SECONDS:.0f} s before it (NVIDIA's catalog for XID 45 alone)")
            out[uuid] = {"xid": 45, "judgement": SOLO_45, "text": text, "rule": SOURCE_45, "applications": [],
                         "other_gpus": []}
    return out
