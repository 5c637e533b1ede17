"""What each line of a job listing adds to its totals and shares, in whole units, kept as each job record is saved.

A line is one GPU's part of a job record (a job, an idle period) or of an import. Its figures are the ones the
listing totals (:mod:`gpuwear.jobs.report`): observed milliseconds, millijoules, and the central estimates of
thermal aging and cycle fatigue in billionths of an equivalent hour and of a reference cycle. Whole units make a
total the same whichever order its lines are added in (SQLite's ``sum`` or Python's), so the totals kept in the
ledger (its ``job_lines`` table, :meth:`gpuwear.ledger.Ledger.line_sums`) and a recount of every record agree to the
last digit. The aging and fatigue depend on the wear models' parameters: :func:`key` names them, and a line kept
under another key is computed again from its record.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any, NamedTuple

from gpuwear.config import WearConfig
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.models import aging_bands, fatigue_bands

# the version of what a line holds and how its labels are made: changing either changes every key
LINES_VERSION = 1
MILLI = 1000
NANO = 1_000_000_000


class Line(NamedTuple):
    """One GPU's part of a job record, as the ledger keeps it (``job_lines``) and a listing totals it."""

    slice: int  # its place in the record's GPUs
    uuid: str
    kind: str
    line: str  # line_name(): the page's "who caused its heat aging" adds the lines of one name
    title: str  # title(): how the listing names the job
    observed: int  # milliseconds
    energy: int  # millijoules
    aging: int  # billionths of an equivalent hour at the reference temperature (central estimate)
    fatigue: int  # billionths of a reference cycle (central estimate)
    peak: int | float | None  # the hottest GPU temperature, °C, as the record holds it (None: not recorded)


def key(p: WearConfig) -> int:
    """A number naming the parameters a line's figures were computed with (the wear models' and LINES_VERSION)."""
    text = json.dumps([LINES_VERSION, dataclasses.asdict(p.arrhenius), dataclasses.asdict(p.cycles)],
                      sort_keys=True)
    return zlib.crc32(text.encode())


def units(value: float, per: int) -> int:
    """``value`` in whole ``1 / per`` units."""
    return round(value * per)


def line_name(job: dict[str, Any]) -> str:
    """A line's name in the page's "who caused its heat aging" (jobs of one name add up)."""
    return str({"idle": "idle time", "imported": f"imported: {job['id']}", "unattributed": "unattributed"}.get(
               job["kind"])
               or (job["name"] or job["id"]))[:18]


def title(job: dict[str, Any]) -> str:
    """How a listing names a job record's line."""
    if job["kind"] == "idle":
        return "(idle)"
    if job["kind"] == "imported":
        return f"(imported: {job['id']})"
    if job["kind"] == "unattributed":  # named with the reason: "unattributed: processes not readable ..."
        return f"({job['name']})"
    return f"{job['name'] or job['id']} [{job['kind']} {job['id']}]" if job["name"] != job["id"] else \
        f"{job['id']} [{job['kind']}]"


def label(kind: str, title: str) -> str:
    """A line's label in the text's share of all GPUs' thermal aging: idle and imported time each add up as one, a
    job's lines by its title (:meth:`gpuwear.ledger.Ledger.line_sums` says the same in SQL)."""
    return kind if kind in ("idle", "imported") else title


def counted(w: GpuWear, p: WearConfig, bands: tuple[str, ...],
            ) -> tuple[float, float, dict[str, float], dict[str, float]]:
    """What a line shows: observed seconds, joules, and the aging and fatigue bands (as models.estimates computes
    them; the rest of estimates is not shown in a listing)."""
    return (round(w.observed_seconds, 3), round(w.energy_joules, 3),
            aging_bands(w.temperature_seconds.get("gpu", {}), p, w, bands), fatigue_bands(w, "gpu", p, bands))


def lines(job: dict[str, Any], p: WearConfig) -> list[Line]:
    """The lines of a job record (``JobRecord.to_json()``, or an import period shaped like one)."""
    out = []
    name, head = line_name(job), title(job)
    for i, g in enumerate(job["gpus"]):
        observed, energy, aging, fatigue = counted(GpuWear.from_json(g["wear"], 0.0), p, ("central",))
        out.append(Line(i, g["uuid"], job["kind"], name, head, units(observed, MILLI), units(energy, MILLI),
                        units(aging["central"], NANO), units(fatigue["central"], NANO),
                        g["max_celsius"].get("gpu")))
    return out


class Summariser:
    """The lines of the job records a ledger saves (:meth:`gpuwear.ledger.Ledger.save`), computed with the wear
    parameters ``p`` and kept under their :func:`key`."""

    def __init__(self, p: WearConfig) -> None:
        self.p = p
        self.key = key(p)

    def __call__(self, job: dict[str, Any]) -> list[Line]:
        return lines(job, self.p)
