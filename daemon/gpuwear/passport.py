"""`gpuwear passport`: one card's history for its next owner, in words, as JSON or as a self-contained page, made
from the export the card's history travels in (`gpuwear export`): its identity, what it carried when gpuwear first
saw it, what gpuwear observed since (wear with its bands, incidents with their judgement, repairs), what no one can
know from it, and whether the file is whole (its checksum: damage, not forgery).
"""

from __future__ import annotations

import time
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.ledger import EXPORT_VERSION
from gpuwear.ledger.errors import printable
from gpuwear.report import EVENTS_SHOWN, text_report
from gpuwear.report import document as report_document
from gpuwear.wear.accumulate import SCHEMA as WEAR_SCHEMA
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.events import Event
from gpuwear.wear.schema import check_export

# what the passport cannot say, whatever the card: NVML and DCGM keep no power-on hours (issue 55)
CANNOT_KNOW = ("the card's age and use before gpuwear first saw it: NVML and DCGM keep no power-on hours, so only "
               "the lifetime counters the card itself keeps (memory errors, retired pages, remapped rows) reach back "
               "further, and they are said as carried",
               "its life on boxes that ran no gpuwear, or whose history was not exported with it",
               "who wrote this file: its checksum detects damage, not forgery (anyone can compute it again)")


def _day(wall: float | None) -> str:
    return "an unknown day" if wall is None else time.strftime("%Y-%m-%d", time.gmtime(wall))


def document(export: Any, p: WearConfig, source: str) -> dict[str, Any]:
    """The passport of an export document (validated whole first: :class:`SchemaError` names the first problem,
    a checksum that does not match included): the report document of the card's whole history (its parts merged),
    with ``passport``: the export's ``version``, ``exported_at`` and ``checksum`` (None before version 2, which
    had none), ``host`` (the exporting box's name; None before version 3), the parts it holds, the card's first and
    last sight, and :data:`CANNOT_KNOW`."""
    check_export(export, EXPORT_VERSION, WEAR_SCHEMA)
    uuid = str(export["uuid"])
    wears = [GpuWear.from_json(part, p.cycles.hysteresis_celsius) for part in export["parts"]]
    card = GpuWear.merged_all(wears[0], wears[1:])
    events = sorted((Event(uuid, e["wall"], e["kind"], e["detail"]) for e in export.get("events", [])),
                    key=lambda e: e.wall)[-EVENTS_SHOWN:]  # oldest first, the newest kept: as a report reads them
    doc = report_document([card], p, {uuid: events}, source, bool(export.get("simulated")))
    doc["passport"] = {"uuid": uuid, "version": export["version"], "exported_at": export.get("exported_at"),
                       "host": export.get("host"),
                       "checksum": export.get("checksum"), "parts": len(export["parts"]),
                       "first_seen": card.first_seen, "last_seen": card.last_seen, "cannot_know": list(CANNOT_KNOW)}
    return doc


def lines(doc: dict[str, Any]) -> list[str]:
    """The passport's own part, in words (the card's part of the report follows it)."""
    pp, g = doc["passport"], doc["gpus"][0]
    serial = f", serial {g['serial']}" if g.get("serial") else ", no serial number (the card gives none)"
    whole = (f"checksum {pp['checksum'][:23]}... matches the file's content: it arrived whole (this detects damage, "
             "not forgery)" if pp["checksum"] else "written by a gpuwear before exports carried a checksum: "
             "nothing says whether it arrived whole")
    return [f"PASSPORT of {g['name'] or 'a GPU'} ({pp['uuid']}{serial})",
            f"  Exported on {_day(pp['exported_at'])}"
            + (f" by the box named {printable(pp['host'])}" if pp.get("host") else "") + f"; {whole}.",
            f"  gpuwear saw it from {_day(pp['first_seen'])} to {_day(pp['last_seen'])} ({pp['parts']} part(s) of "
            "its history, merged); what it carried when first seen is said as carried below.",
            *(f"  Not known: {what}." for what in pp["cannot_know"])]


def heading_and_lines(doc: dict[str, Any]) -> tuple[str, ...]:
    """The passport's own part for its page: a short heading (the card's identity is the card's section's), then
    :func:`lines` but its first."""
    return (f"Passport of {doc['gpus'][0]['name'] or 'a GPU'}", *lines(doc)[1:])


def text(doc: dict[str, Any]) -> str:
    """The passport in words: its own part, then the card's part of the report."""
    return "\n".join(lines(doc)) + "\n\n" + text_report(doc)
