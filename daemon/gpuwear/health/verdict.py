"""The health verdict: the combination of the rules of health.rules' table, in its order."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.health.rules import RULES, TABLE, XID_RULE, Facts, Judge
from gpuwear.health.signals import incident_summary
from gpuwear.wear.accumulate import GpuWear

STATUS_ORDER = ("ok", "unknown", "watch", "act")


def rule(code: str) -> str:
    """The rule a verdict reason applies (:data:`RULES`; an XID's: NVIDIA's catalog)."""
    return RULES.get(code) or (XID_RULE if code.startswith("xid_") else "gpuwear's own rule")


@functools.lru_cache(maxsize=8)  # a few settings in a process' life; the verdict asks per GPU and view
def _judges(modes: tuple[tuple[str, str], ...]) -> tuple[tuple[Judge, bool], ...]:
    """The judges of the rules not set off (wear.health.rules), in the table's order, each with whether it is on
    (else on trial)."""
    mode = dict(modes)
    return tuple((r.judge, mode.get(r.code, "on") == "on") for r in TABLE if mode.get(r.code, "on") != "off")


def verdict(w: GpuWear, p: WearConfig, trend: Mapping[str, Any] | None,
            peers: Mapping[str, list[float]] | None = None, host_last_seen: float | None = None,
            own: Mapping[str, tuple[float | None, float | None]] | None = None) -> dict[str, Any]:
    """``ok`` / ``watch`` / ``act`` / ``unknown`` with reasons, from measured health first. ``trend``: the card's
    resistance_trend. ``host_last_seen``: when the ledger last saw the host's GPUs (a reader of a ledger: a GPU not
    seen since is missing).

    Reason codes are a fixed set (they label a metric); the text explains each in plain words, and ``rule`` says
    which rule it applies and whose (NVIDIA's, or gpuwear's own). ``peers``: the loaded-hour error rates of the
    host's other GPUs of the same product (signals.peer_rates); a counter no peer reads is judged against the GPU's
    own past (GpuWear.own_error_rates). ``own``: the GPU's recent_rates, where the caller has them already
    (signals.peer_and_own_rates).

    wear.health.rules sets a rule (by its code in the table) off, or on trial ("log"): what a rule on trial says is
    kept in ``would_have_said``, never in the reasons, the status or an alert (NVSentinel's store-only practice).
    """
    facts = Facts(w, p, trend, peers or {}, host_last_seen, own)
    reasons: list[dict[str, str]] = []
    trial: list[dict[str, str]] = []  # what the rules set to log said: "would have said", outside the verdict
    for judge, on in _judges(p.health.rules):
        for severity, code, text in judge(facts):
            (reasons if on else trial).append({"severity": severity, "code": code, "text": text, "rule": rule(code)})
    # the verdict is on what the card reports; what it cannot report is said beside it, not instead of it (a GeForce
    # card with nothing wrong is "ok", its memory health "not known")
    status = max((r["severity"] for r in reasons if r["severity"] != "unknown"), key=STATUS_ORDER.index,
                 default="ok")
    return {"status": status, "reasons": reasons, "not_known": [r["code"] for r in reasons
                                                               if r["severity"] == "unknown"],
            "would_have_said": trial, "incidents": incident_summary(w),
            "slow_reads": {load: dict(bins) for load, bins in w.slow_reads.items()}}
