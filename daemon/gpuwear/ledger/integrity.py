"""The daemon's open, checking every record: a record (or one value of a GPU's record) that fails its check costs
only itself: it goes to the ``set_aside`` table, counted, and the rest of the history is kept (:func:`_audit`,
:func:`_set_aside`). Rows written before checksums are validated once and stamped.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from gpuwear.ledger.errors import LedgerError
from gpuwear.ledger.records import (
    _ABSENT,
    CHANGED,
    BadRecord,
    _checked,
    _crc_of,
    _event_problem,
    _job_problem,
    _json_object,
    _read_docs_tolerant,
    _stored_crc,
    changed,
)
from gpuwear.ledger.schema import _transaction
from gpuwear.wear.accumulate import SCHEMA as WEAR_SCHEMA
from gpuwear.wear.schema import SchemaError, check_import, check_wear

MAX_SALVAGED = 100  # values removed from one GPU's record before the record as a whole is set aside
_WHOLE = frozenset({"", "schema", "uuid"})  # a record failing here is not the GPU's at all


def _salvage(doc: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """Remove, one by one, the values of a GPU's record that fail validation (a bin, an interval, a counter), so that
    one bad value never costs the card its history: (where, why, the value) for each removed. A record that fails
    in its identity, or in more than MAX_SALVAGED places, is left as it is (the caller sets it aside whole)."""
    removed: list[tuple[str, str, Any]] = []
    for _ in range(MAX_SALVAGED):
        try:
            check_wear(doc, "", WEAR_SCHEMA)
            return removed
        except SchemaError as exc:
            if exc.where in _WHOLE or not _remove(doc, exc.where, removed, exc.problem):
                return removed
    return removed


def _remove(doc: Any, where: str, removed: list[tuple[str, str, Any]], problem: str) -> bool:
    """Remove the value at a validator's path (``thermal_resistance.2024-05-01[1]``: keys may hold dots, so each is
    matched against the keys present); whether it was found."""
    node, rest = doc, where
    while True:
        if isinstance(node, dict):
            key = max((k for k in node if rest == k or rest.startswith((f"{k}.", f"{k}["))), key=len, default=None)
            if key is None:
                return False
            rest = rest[len(key):].lstrip(".")
        elif isinstance(node, list) and rest.startswith("[") and "]" in rest:
            index = rest[1:rest.index("]")]
            if not index.isdigit() or int(index) >= len(node):
                return False
            key, rest = int(index), rest[rest.index("]") + 1:].lstrip(".")
        else:
            return False
        if not rest:
            removed.append((where, problem, node[key]))
            del node[key]
            return True
        node = node[key]


def _audit(db: sqlite3.Connection) -> tuple[dict[str, dict[str, Any]], list[BadRecord], set[str]]:
    """Read every record back and validate it: each GPU's record (its row with the wear log applied, a log row that
    cannot be applied left out), the records that fail, each on its own, and which of the tables that grow (events,
    jobs) hold rows written before checksums (stamped then: no second pass over them at every start). Raises
    sqlite3.DatabaseError where SQLite itself cannot read the file."""
    unstamped: set[str] = set()
    bad: list[BadRecord] = []
    docs, unusable, rows = _read_docs_tolerant(db)
    bad += unusable
    for uuid, doc in list(docs.items()):
        rowid, name = rows[uuid]
        parts = _salvage(doc)
        bad += [BadRecord("gpus", rowid, f"GPU {uuid!r}: {where}", why, part) for where, why, part in parts]
        try:
            _checked(doc, f"GPU {uuid!r}")
            if doc.get("uuid") != uuid or not isinstance(name, str):
                raise LedgerError(f"GPU {uuid!r}: the row and its accumulators disagree")
        except LedgerError as exc:
            bad.append(BadRecord("gpus", rowid, f"GPU {uuid!r}", str(exc)))
            del docs[uuid]
    for rowid, uuid, first, last, count, text, crc in db.execute(
            f"SELECT rowid AS row_id, uuid, first, last, rows, wear, {_crc_of(db, 'imports')} FROM imports"):
        try:
            if changed(text, crc):
                raise LedgerError(f"import of GPU {uuid!r}: {CHANGED}")
            check_import(uuid, first, last, count, _json_object(text, f"import of GPU {uuid!r}"), WEAR_SCHEMA)
        except (SchemaError, LedgerError) as exc:
            bad.append(BadRecord("imports", rowid, f"import of GPU {uuid!r}", str(exc)))
    # events and jobs, the tables that grow: proved whole by their checksums, validated where they have none
    for rowid, uuid, wall, kind, detail, crc in db.execute("SELECT rowid AS row_id, uuid, wall, kind, detail, crc "
                                                           "FROM events"):
        problem = _event_problem(uuid, wall, kind, detail, crc)
        if problem:
            bad.append(BadRecord("events", rowid, f"event of GPU {uuid!r}", problem))
        elif crc is None:
            unstamped.add("events")
    for rowid, record, data, crc in db.execute("SELECT rowid AS row_id, record, data, crc FROM jobs"):
        problem = _job_problem(data, crc)
        if problem:
            bad.append(BadRecord("jobs", rowid, f"job {record!r}"[:80], problem))
        elif crc is None:
            unstamped.add("jobs")
    return docs, bad, unstamped


def _set_aside(db: sqlite3.Connection, docs: dict[str, dict[str, Any]], bad: list[BadRecord]) -> None:
    """In one transaction, move each bad record into the set_aside table (kept, never counted) and delete it where
    it was; when a GPU record or a wear log row is among them, write every good GPU's record whole and empty the
    log (its rows name the GPUs they change)."""
    with _transaction(db):
        for b in bad:
            if b.part is not _ABSENT:  # a value removed from a GPU's record: the record is written again below
                data = json.dumps(b.part)
            else:
                row = db.execute(f"SELECT * FROM {b.table} WHERE rowid = ?", (b.rowid,)).fetchone()
                data = json.dumps([v.hex() if isinstance(v, bytes) else v for v in row]) if row else "null"
                db.execute(f"DELETE FROM {b.table} WHERE rowid = ?", (b.rowid,))
            db.execute("INSERT INTO set_aside (wall, source, what, reason, data) VALUES (?, ?, ?, ?, ?)",
                       (time.time(), b.table, b.what[:300], b.reason[:1000], data))
        if any(b.table == "jobs" for b in bad):  # their kept lines go too, by whatever name they were kept under (a
            # damaged record name no longer names them)
            db.execute("DELETE FROM job_lines WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.record = "
                       "job_lines.record)")
        if any(b.table in ("gpus", "wear_log") for b in bad):
            for uuid, doc in docs.items():
                text = json.dumps(doc, separators=(",", ":"))
                db.execute("UPDATE gpus SET wear = ?, crc = ? WHERE uuid = ?", (text, _stored_crc(text), uuid))
            db.execute("DELETE FROM wear_log")
