"""`gpuwear import ledger`: a card's history exported by another box (`gpuwear export`), taken whole or not at all."""

from __future__ import annotations

import datetime
import time
from typing import Any

from gpuwear.imports.parse import ImportFormatError, latest_time
from gpuwear.ledger import EXPORT_VERSION, Ledger
from gpuwear.ledger.errors import printable
from gpuwear.wear.accumulate import SCHEMA as WEAR_SCHEMA
from gpuwear.wear.events import Event
from gpuwear.wear.schema import SchemaError, check_export

SIMULATED_MARK = " (simulated)"  # the name of a card whose history a simulation made, in a real ledger


def import_ledger_export(doc: Any, source: str, ledger: Ledger, allow_simulated: bool = False,
                         latest: float | None = None) -> dict[str, int]:
    """Import a `gpuwear export` document, validated whole first (:func:`check_export`: one bad value refuses the
    file, nothing is written; so does a part ending after ``latest``, by default a day after this machine's clock,
    as the CSV import refuses such rows: the exporting box's clock was wrong). Each part of the card's history
    becomes an import unless its time span overlaps history this ledger already holds for the card (its live span,
    earlier imports, or an earlier part of this file): accumulators cannot be split in time, so an overlapping part
    is skipped whole and never counted twice. An export that names its box (version 3) has it said in each
    import's source ("ledger:FILE (host NAME)"), and an import that took a part leaves an event in the card's history
    ("history imported": the box, the file, the span). Returns parts imported and skipped."""
    try:
        check_export(doc, EXPORT_VERSION, WEAR_SCHEMA)
    except SchemaError as exc:
        raise ImportFormatError(str(exc)) from None
    if doc.get("simulated") and not allow_simulated:  # a simulation's figures must never pass for a real card's
        raise ImportFormatError("the history of a simulated GPU (exported with --simulated): import it into a "
                                "simulation's ledger (--simulated SCENARIO), or pass --allow-simulated")
    uuid = str(doc["uuid"])
    simulated = bool(doc.get("simulated"))
    if doc.get("host"):
        source = f"{source} (host {printable(doc['host'])})"
    if simulated:  # marked wherever it goes: its name in report, jobs and the page, its imports' source
        source = f"simulated: {source}"
    for n, part in enumerate(doc["parts"], 1):
        if (part.get("last_seen") or 0.0) > latest_time(latest):
            when = datetime.datetime.fromtimestamp(part["last_seen"], datetime.timezone.utc)
            raise ImportFormatError(f"part {n} ends at {when:%Y-%m-%d %H:%M} UTC, over a day ahead of this machine's "
                                    "clock (the exporting box's clock was wrong): nothing imported")
    covered = ledger.covered(uuid)
    imports = []
    skipped = 0
    for part in doc["parts"]:
        first, last = part.get("first_seen"), part.get("last_seen")
        if first is None or last is None:
            continue
        # the part's whole span, not the intervals it says it observed: a file cannot talk its way past what the
        # ledger holds, and a part cannot be split in time anyway
        if any(a <= last and first <= b for a, b in covered):
            skipped += 1
            continue
        covered.append((first, last))
        if simulated and not str(part.get("name", "")).endswith(SIMULATED_MARK):
            part = {**part, "name": f"{part.get('name') or 'GPU'}{SIMULATED_MARK}"[-256:]}
        imports.append((uuid, source, first, last, 0, part))
    events = [Event(uuid, time.time(), "history imported", {
        "source": source, "host": doc.get("host"), "exported_at": doc.get("exported_at"), "parts": len(imports),
        "first": min(i[2] for i in imports), "last": max(i[3] for i in imports)})] if imports else []
    ledger.save([], events, imports)
    return {"imported": len(imports), "skipped": skipped}
