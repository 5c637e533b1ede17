"""One GPU's history as a document another box's ledger imports (``gpuwear export``, ``gpuwear import ledger``):
the ledger follows the card. The document holds the card's live record, its imports and its events as stored, and
says whether the card was simulated.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpuwear.ledger.errors import LedgerError
from gpuwear.ledger.records import CHANGED, Event, _crc_of, _read_docs, changed
from gpuwear.wear.schema import checksum

# the `gpuwear export` document; 2: with its checksum and the time it was written; 3: with the exporting host's name
EXPORT_VERSION = 3
FORMAT = "gpuwear-ledger-export"


def document(db: sqlite3.Connection, path: Path, uuid: str, events: Iterable[Event],
             simulated: bool = False, host: str = "") -> dict[str, Any]:
    """The export of GPU ``uuid`` of the ledger at ``path`` (read through ``db``), with ``events`` (its events, read
    and proved whole by the caller) and ``host``, the exporting box's name (said where the card's history is
    imported: the card was seen there); LedgerError when the ledger holds nothing of it."""
    live = _read_docs(db).get(uuid)
    imports = []
    for text, crc in db.execute(f"SELECT wear, {_crc_of(db, 'imports')} FROM imports WHERE uuid = ?", (uuid,)):
        if changed(text, crc):  # exported, it would pass for the card's history on another box
            raise LedgerError(f"{path}: an import of GPU {uuid}: {CHANGED} (the daemon sets it aside at its next "
                              "start)")
        imports.append(json.loads(text))
    if live is None and not imports:
        raise LedgerError(f"{path}: no GPU {uuid}")
    parts = ([live] if live else []) + imports
    doc: dict[str, Any] = {"format": FORMAT, "version": EXPORT_VERSION, "uuid": uuid, "exported_at": time.time(),
                           "host": host[:255] or "unknown", "parts": parts,
                           "events": [{"wall": e.wall, "kind": e.kind, "detail": e.detail} for e in events]}
    if simulated:
        doc["simulated"] = True
    return {**doc, "checksum": checksum(doc)}
