"""`gpuwear jobs`: which job wore which GPU, and by how much.

The JSON document is a stable contract like ``report --json``: keys are added, never
renamed or removed. Shares are of each GPU's listed lines (jobs and idle periods), so the
lines of a GPU add up to 100 % of what was observed in the window; their time, energy and aging
add up to the card's in ``report``, and their cycle fatigue with the card's open swings (``open_cycle_fatigue``).
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from gpuwear.config import WearConfig
from gpuwear.jobs.lines import MILLI, NANO, counted, label, line_name, lines, title, units
from gpuwear.jobs.lines import key as lines_key
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.models import BANDS, open_fatigue

if TYPE_CHECKING:
    from gpuwear.ledger import Ledger

__all__ = ["document", "json_chunks", "ledger_document", "ledger_listing", "limited", "line_name", "parse_duration",
           "text", "text_lines"]

SHARES_SHOWN = 10  # labels the text's share of all GPUs' thermal aging names; the rest are added up
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """'90s', '30m', '12h', '1d', '2w' to seconds; ValueError names the problem."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValueError(f"expected a duration like 30m, 12h, 1d or 2w, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _slice(g: dict[str, Any], p: WearConfig, gpu: GpuWear | None) -> dict[str, Any]:
    w = GpuWear.from_json(g["wear"], 0.0)
    observed, energy, aging, fatigue = counted(w, p, BANDS)
    hist = w.temperature_seconds.get("gpu", {})
    total = sum(hist.values())
    mean = {sensor: round(sum(int(t) * s for t, s in h.items()) / sum(h.values()), 2)
            for sensor, h in w.temperature_seconds.items() if sum(h.values()) > 0}
    slowdown = gpu.thresholds.get("slowdown") if gpu else None
    return {
        "uuid": g["uuid"], "gpu_name": gpu.name if gpu else w.name,
        "start": g["start"], "end": g["end"],
        "observed_seconds": observed,
        "busy_seconds": round(w.busy_seconds(p.busy_utilization_ratio), 3),
        "energy_joules": energy,
        "max_celsius": g["max_celsius"], "mean_celsius": mean,
        "time_above_slowdown_seconds": round(w.seconds_at_or_above("gpu", slowdown), 3)
        if slowdown is not None and total else None,
        "throttle_seconds": {k: round(v, 3) for k, v in sorted(w.throttle_seconds.items()) if k != "gpu_idle"},
        "thermal_cycles": round(sum(n for bins in w.cycles.values() for n in bins.values()), 3),
        "thermal_aging_equivalent_hours": aging,
        "cycle_fatigue_equivalent_cycles": fatigue,
        "events": g["events"],
    }


# records without kept lines a listing counts from themselves (running jobs, the newest saves): past it, the daemon
# is indexing them (after an upgrade, a recovery or new wear parameters) and the listing says so rather than read
# each (45,000 records: about a minute)
COUNTED_FROM_RECORDS_MAX = 2000


class _Tally:
    """A listing's totals and shares, added up in whole units (:mod:`gpuwear.jobs.lines`): the same sums whichever
    order the lines come in, from the records or from the ledger's kept lines."""

    def __init__(self, by_label: bool = True) -> None:
        self.totals: dict[str, list[int]] = {}  # uuid: [observed, energy, aging, fatigue]
        self.by_label: dict[str, int] | None = {} if by_label else None
        self.by_name: dict[str, dict[str, int]] = {}  # uuid: {line name: aging}
        self.records = 0
        self.hottest: tuple[Any, ...] | None = None  # (peak, start, record, -slice, uuid, title)
        self.not_indexed = 0  # records in the window left out of the totals: their lines are not kept yet

    def add(self, uuid: str, name: str, observed: int, energy: int, aging: int, fatigue: int) -> None:
        t = self.totals.setdefault(uuid, [0, 0, 0, 0])
        t[0] += observed
        t[1] += energy
        t[2] += aging
        t[3] += fatigue
        names = self.by_name.setdefault(uuid, {})
        names[name] = names.get(name, 0) + aging

    def add_label(self, label: str, aging: int) -> None:
        if self.by_label is not None:
            self.by_label[label] = self.by_label.get(label, 0) + aging

    def candidate(self, peak: Any, start: float, record: str, slice_: int, uuid: str, title: str) -> None:
        """A line for the hottest: the highest peak; between equal peaks the newest start, then the greater record
        name, then the first of a record's GPUs."""
        key = (peak, start, record, -slice_, uuid, title)
        if self.hottest is None or key[:4] > self.hottest[:4]:
            self.hottest = key

    def record(self, rec: dict[str, Any], p: WearConfig, gpu: str | None) -> bool:
        """Add a record's lines (those of ``gpu`` where given); whether it had any."""
        found = False
        for ln in lines(rec, p):
            if gpu is not None and ln.uuid != gpu:
                continue
            found = True
            self.add(ln.uuid, ln.line, ln.observed, ln.energy, ln.aging, ln.fatigue)
            self.add_label(label(ln.kind, ln.title), ln.aging)
            if ln.kind != "idle" and ln.peak:
                self.candidate(ln.peak, rec["start"], rec["record"], ln.slice, ln.uuid, ln.title)
        self.records += found
        return found

    def share(self, job: dict[str, Any]) -> dict[str, Any]:
        """The job with each of its lines' shares of its GPU's totals (the totals added up first); none while
        records are left out of the totals (``not_indexed``)."""
        for s in job["gpus"]:
            t = self.totals.get(s["uuid"])
            if t is None or self.not_indexed:
                s["share"] = dict.fromkeys(("observed_time", "energy", "thermal_aging", "cycle_fatigue"))
                continue
            s["share"] = {
                "observed_time": _ratio(units(s["observed_seconds"], MILLI), t[0]),
                "energy": _ratio(units(s["energy_joules"], MILLI), t[1]),
                "thermal_aging": _ratio(units(s["thermal_aging_equivalent_hours"]["central"], NANO), t[2]),
                "cycle_fatigue": _ratio(units(s["cycle_fatigue_equivalent_cycles"]["central"], NANO), t[3]),
            }
        return job

    def document(self, since: float | None, jobs: list[dict[str, Any]]) -> dict[str, Any]:
        """The listing's document: ``jobs`` (shared already, :meth:`share`) under its totals and shares."""
        totals = {uuid: {"observed_seconds": t[0] / MILLI, "energy_joules": t[1] / MILLI,
                         "thermal_aging_equivalent_hours": t[2] / NANO, "cycle_fatigue_equivalent_cycles": t[3] / NANO}
                  for uuid, t in sorted(self.totals.items())}
        shares = {uuid: {name: _ratio(v, self.totals[uuid][2]) for name, v in sorted(names.items())}
                  for uuid, names in sorted(self.by_name.items())}
        hottest = self.hottest
        return {"since": since, "jobs": jobs, "jobs_in_window": self.records, "not_indexed": self.not_indexed,
                "totals": totals,
                "hottest": None if hottest is None else {"record": hottest[2], "uuid": hottest[4],
                                                         "max_celsius": hottest[0]},
                "hottest_label": None if hottest is None else hottest[5],
                "thermal_aging_by_line": None if self.by_label is None else
                {label: v / NANO for label, v in sorted(self.by_label.items())},
                "thermal_aging_share_by_name": shares}


def _whole(rec: dict[str, Any], gpus: dict[str, GpuWear], p: WearConfig, gpu: str | None) -> dict[str, Any] | None:
    """A record as a listing shows it (None: no line of ``gpu``)."""
    slices = [_slice(g, p, gpus.get(g["uuid"])) for g in rec["gpus"] if gpu is None or g["uuid"] == gpu]
    if not slices:
        return None
    end = rec["end"] if rec["end"] is not None else rec["last_seen"]
    return {"record": rec["record"], "kind": rec["kind"], "id": rec["id"], "user": rec["user"], "name": rec["name"],
            "start": rec["start"], "end": rec["end"], "running": rec["end"] is None,
            "duration_seconds": round(end - rec["start"], 3), "gpus": slices}


def document(records: Iterable[dict[str, Any]], gpus: dict[str, GpuWear], p: WearConfig, since: float | None,
             gpu: str | None = None, shown: int | None = None) -> dict[str, Any]:
    """Jobs (``records`` newest first, read once: an iterator keeps the memory to what is shown) with per-GPU
    figures and shares, and per-GPU totals of the listing, every record counted from itself: the plain way, beside
    :func:`ledger_document` (which totals the lines the ledger keeps) and the judge of it. ``shown``: the newest
    that many lines are kept whole (None: all); every line counts in the totals, the shares by name, the hottest and
    ``jobs_in_window``."""
    tally = _Tally()
    jobs: list[dict[str, Any]] = []
    for rec in records:
        if tally.record(rec, p, gpu) and (shown is None or len(jobs) < shown):
            job = _whole(rec, gpus, p, gpu)
            assert job is not None
            jobs.append(job)
    return _with_open(tally.document(since, [tally.share(job) for job in jobs]), gpus, p, gpu)


def _with_open(doc: dict[str, Any], gpus: dict[str, GpuWear], p: WearConfig, gpu: str | None) -> dict[str, Any]:
    """``doc`` with each listed GPU's open swings (``open_cycle_fatigue``: the fatigue of its rainflow residue, not
    closed yet, in no line until it closes): with it, the lines' cycle fatigue adds up to the card's in `report`."""
    doc["open_cycle_fatigue"] = {uuid: round(open_fatigue(w, "gpu", p), 9) for uuid, w in sorted(gpus.items())
                                 if (gpu is None or uuid == gpu) and uuid in doc["totals"]}
    return doc


def ledger_document(ledger: Ledger, gpus: dict[str, GpuWear], p: WearConfig, since: float | None,
                    gpu: str | None = None, shown: int | None = None, by_label: bool = True,
                    counted_max: int = COUNTED_FROM_RECORDS_MAX) -> dict[str, Any]:
    """:func:`document` of a ledger's job records and imports in the window, at the cost of what it shows: the
    totals, shares and hottest from the lines the ledger keeps (:meth:`Ledger.line_sums`, summed by SQLite), the
    records without kept lines counted from themselves, and only the ``shown`` newest records read whole.
    ``by_label``: the text's share by label (a key per job: the page does without, None)."""
    with ledger.reading():
        head, jobs = ledger_listing(ledger, gpus, p, since, gpu, by_label, counted_max)
        head["jobs"] = list(itertools.islice(jobs, shown))
    return head


def ledger_listing(ledger: Ledger, gpus: dict[str, GpuWear], p: WearConfig, since: float | None,
                   gpu: str | None = None, by_label: bool = True, counted_max: int = COUNTED_FROM_RECORDS_MAX,
                   ) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """:func:`ledger_document` as a stream, for a listing of every job (a busy box's 90 days hold 45,000): the
    document with its ``jobs`` empty, and the jobs newest first, each read whole when the iterator reaches it and
    dropped by the caller once written. Call it, and walk the jobs, inside one ``ledger.reading()``. More than
    ``counted_max`` records without kept lines are not read: the document says how many (``not_indexed``)."""
    key = lines_key(p)
    tally = _Tally(by_label)
    sums = ledger.line_sums(key, since, gpu, by_label)
    for uuid, name, observed, energy, aging, fatigue in sums.by_line:
        tally.add(uuid, name, observed, energy, aging, fatigue)
    for line_label, aging in sums.by_label or ():
        tally.add_label(line_label, aging)
    tally.records = sums.records
    if sums.hottest is not None:
        tally.candidate(*sums.hottest)
    kept = sums.records if gpu is None else None
    if (left := ledger.unsummarised_count(key, since, kept)) > counted_max:
        tally.not_indexed = left  # being indexed (after an upgrade or a recovery): said, not read record by record
    else:
        for rec in ledger.unsummarised(key, since, kept):
            tally.record(rec, p, gpu)
    imports = ledger.import_periods(since)
    for rec in imports:
        tally.record(rec, p, gpu)

    def jobs() -> Iterator[dict[str, Any]]:
        for rec in ledger.periods(since, imports):
            job = _whole(rec, gpus, p, gpu)
            if job is not None:
                yield tally.share(job)

    return _with_open(tally.document(since, []), gpus, p, gpu), jobs()


def _ratio(part: float, whole: float) -> float | None:
    return round(part / whole, 6) if whole > 0 else None


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def limited(doc: dict[str, Any], limit: int | None) -> dict[str, Any]:
    """The document with its newest ``limit`` jobs (all: None); totals and shares stay the whole window's."""
    if limit is None or len(doc["jobs"]) <= limit:
        return doc
    return {**doc, "jobs": doc["jobs"][:limit]}


def text(doc: dict[str, Any], index_of: dict[str, int], limit: int | None = None) -> str:
    """The jobs as a table a person reads, with who caused what share of each GPU's wear: the newest ``limit``
    (all: None), and how many more there are."""
    return "".join(line + "\n" for line in text_lines(doc, doc["jobs"], index_of, limit))


def text_lines(head: dict[str, Any], jobs: Iterable[dict[str, Any]], index_of: dict[str, int],
               limit: int | None = None) -> Iterator[str]:
    """:func:`text` a line at a time (no newline), ``jobs`` read as they come: ``head`` is the document (its own
    jobs not read), ``jobs`` the jobs newest first (:func:`ledger_listing`)."""
    if not head["jobs_in_window"] and not head.get("not_indexed"):
        yield "No job, idle period or import recorded in this window."
        return
    if head.get("not_indexed"):
        yield from [f"{head['not_indexed']} job record(s) in this window are still being indexed (the daemon keeps",
                    "their lines right after it starts, after an upgrade or a recovery): they are left out of the",
                    "totals, and no share is shown until they are in; run this again in a minute.", ""]
    yield from ["Jobs, newest first. Shares are of each GPU's wear in this listing (central estimates);",
                "idle lines are the time between jobs, unattributed lines the time a GPU's processes could not be",
                "read (the line says why) and imported lines the history read from logs, so each GPU's lines add",
                "up to 100 % and, for time, energy and aging, to what `gpuwear report` shows for it. A swing is",
                "a line's once it closes; the card's open swings, in `report` already, are in no line yet (below),",
                "and with them the lines' cycle fatigue adds up to the card's too.", ""]
    yield f"{'JOB':<44} {'USER':<10} {'START':<16} {'DURATION':>9} {'GPU':>3} {'MAX °C':>6} {'ENERGY':>9} " \
          f"{'AGING':>6} {'CYCLES':>6}"
    written = 0
    for job in itertools.islice(jobs, limit):
        written += 1
        first = True
        for s in job["gpus"]:
            label = (title(job) + (" (running)" if job["running"] else ""))[:44] if first else ""
            user = (job["user"] or "")[:10] if first else ""
            start = _when(job["start"]) if first else ""
            duration = f"{job['duration_seconds'] / 3600:.2f} h" if first else ""
            gpu = str(index_of.get(s["uuid"], "-"))
            yield (f"{label:<44} {user:<10} {start:<16} {duration:>9} {gpu:>3} "
                   f"{s['max_celsius'].get('gpu', float('nan')):>6.0f} {s['energy_joules'] / 3.6e6:>6.2f} kWh "
                   f"{_pct(s['share']['thermal_aging']):>6} {_pct(s['share']['cycle_fatigue']):>6}")
            yield from _xids_of(s, head.get("card_or_code") or {})
            first = False
    more = head["jobs_in_window"] - written
    if more:
        yield f"... and {more} older line(s) in this window: `gpuwear jobs --all`, `--limit N` or `--since`"
    yield ""
    open_swings = {uuid: v for uuid, v in (head.get("open_cycle_fatigue") or {}).items() if v > 0}
    if open_swings:
        yield ("Open swings (in the card's cycles in `report`, in no line until they close): " + "; ".join(
            f"GPU {index_of.get(uuid, uuid)} {v:.3g} equivalent cycles" for uuid, v in open_swings.items()))
    hottest = head["hottest"]
    if hottest:
        yield (f"Hottest: {head['hottest_label']} ran GPU {index_of.get(hottest['uuid'], hottest['uuid'])} up "
               f"to {hottest['max_celsius']:.0f} °C.")
    by_job = head["thermal_aging_by_line"]
    total = sum(t["thermal_aging_equivalent_hours"] for t in head["totals"].values())
    if total > 0:  # the largest shares: a busy box's months hold a label per job
        ranked = sorted(by_job.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = [f"{name} {100 * v / total:.0f} %" for name, v in ranked[:SHARES_SHOWN]]
        if len(ranked) > SHARES_SHOWN:
            rest = sum(v for _, v in ranked[SHARES_SHOWN:])
            parts.append(f"{len(ranked) - SHARES_SHOWN} other line(s) {100 * rest / total:.0f} %")
        yield "Share of all GPUs' thermal aging in this window: " + "; ".join(parts)


def _xids_of(s: dict[str, Any], judged: dict[str, list[dict[str, Any]]]) -> Iterator[str]:
    """A line's XIDs (its events "xid N", counted while it ran), each with the card-or-code judgement of that code
    on that GPU where the listing has one (``card_or_code``: the caller's, from health.judgements; issue 54)."""
    for what, n in sorted((s.get("events") or {}).items()):
        code = what.removeprefix("xid ")
        if what.startswith("xid ") and code.isdigit():
            j = next((j for j in judged.get(s["uuid"], []) if j["xid"] == int(code)), None)
            yield f"{'':<44}   XID {code} ×{n} while it ran" + (f": {j['text']}" if j else "")  # cli._show


class _Streamed(list):  # type: ignore[type-arg]
    """A list to json's encoder whose items are read as it writes them, never held together: it iterates over
    ``jobs`` (the first already read, to know the list is not empty)."""

    def __init__(self, first: dict[str, Any], rest: Iterator[dict[str, Any]]) -> None:
        super().__init__()
        self._first, self._rest = first, rest

    def __bool__(self) -> bool:
        return True

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield self._first
        yield from self._rest


def json_chunks(head: dict[str, Any], jobs: Iterable[dict[str, Any]], limit: int | None = None) -> Iterator[str]:
    """``json.dumps(doc, indent=2)`` of the document whose jobs are the newest ``limit`` of ``jobs`` (all: None),
    in pieces of about 64 kB, the jobs encoded as they come: the same encoder, so the same bytes (tests compare
    them), one encoding for the whole listing (an encoding per job left each a little garbage in reference cycles,
    which piled up where the collector runs seldom)."""
    listed = iter(itertools.islice(jobs, limit))
    first = next(listed, None)
    doc = {**head, "jobs": [] if first is None else _Streamed(first, listed)}
    pending: list[str] = []
    size = 0
    for chunk in json.JSONEncoder(indent=2).iterencode(doc):
        pending.append(chunk)
        size += len(chunk)
        if size >= 65536:
            yield "".join(pending)
            pending, size = [], 0
    yield "".join(pending)
