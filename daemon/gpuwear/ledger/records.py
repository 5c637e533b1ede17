"""The records as stored and read back: each GPU's lifetime record (a base row and the wear log of what each save
changed), events and job records with the CRC-32 written with them (a byte changed on disk that still reads as JSON
is caught), and the reading of a GPU's record that keeps every value it can (:func:`_read_docs_tolerant`). Pure
functions of rows: no file is opened here.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from dataclasses import dataclass
from typing import Any

from gpuwear.ledger.errors import LedgerError
from gpuwear.wear.accumulate import SCHEMA as WEAR_SCHEMA
from gpuwear.wear.events import Event as Event  # the events the records keep (ledger.Event names it)
from gpuwear.wear.schema import SchemaError, check_event, check_job, check_wear

MAX_LOG_ROW_BYTES = 16 << 20  # a wear-log row inflates to no more than this (a larger one is corrupt)


_KEPT = frozenset({"schema", "uuid", "name"})
_NUMBERS = frozenset({"index"})  # 0 is a value here (GPU 0), not an empty one


def _compact(w: dict[str, Any]) -> dict[str, Any]:
    """An accumulator document without its zero, empty and null values (``GpuWear.from_json`` and the validator
    read a missing key as its default): a third smaller, and so fewer pages written at each save."""
    return {k: v for k, v in w.items()
            if k in _KEPT or (v is not None and (v != 0 or k in _NUMBERS) and v != {} and v != [])}


def _dump(w: dict[str, Any]) -> str:
    return json.dumps(_compact(w), separators=(",", ":"))


_ABSENT = object()


def _diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What turns ``old`` into ``new``: changed keys, nested maps by their changed keys, null for a removed key
    (the records hold no null values: :func:`_compact`, and nested nulls read as absent)."""
    out: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key, _ABSENT)
        if before == value:
            continue
        out[key] = _diff(before, value) if isinstance(value, dict) and isinstance(before, dict) else value
    for key in old:
        if key not in new:
            out[key] = None
    return out


def _apply(doc: dict[str, Any], delta: dict[str, Any]) -> None:
    for key, value in delta.items():
        if value is None:
            doc.pop(key, None)
        elif isinstance(value, dict) and isinstance(doc.get(key), dict):
            _apply(doc[key], value)
        else:
            doc[key] = value


def _read_docs(db: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    """Each GPU's record: its row with the wear log applied, both read in one snapshot (a reader beside the daemon
    never sees a base from before a compaction with the log from after it). LedgerError for a row that fails its
    checksum or is not a JSON object."""
    docs, bad = _read_docs_leaving_out(db)
    if bad:
        raise LedgerError(bad[0].reason)
    return docs


def _read_docs_leaving_out(db: sqlite3.Connection) -> tuple[dict[str, dict[str, Any]], list[BadRecord]]:
    """:func:`_read_docs`, the GPU rows and log rows that cannot be read or fail their checksums left out and
    returned beside."""
    if db.in_transaction:
        docs, bad, rows = _read_docs_tolerant(db)
    else:
        db.execute("BEGIN")
        try:
            docs, bad, rows = _read_docs_tolerant(db)
        finally:
            db.execute("COMMIT")
    left_out = {b.rowid for b in bad if b.table == "gpus"}
    return {uuid: doc for uuid, doc in docs.items() if rows[uuid][0] not in left_out}, bad


def _read_docs_tolerant(db: sqlite3.Connection,
                        ) -> tuple[dict[str, dict[str, Any]], list[BadRecord], dict[str, tuple[int, Any]]]:
    """Each GPU's record with the wear log applied, the GPU rows and log rows that could not be read (a log row
    that cannot be applied is left out whole: the records stay as the rows before it left them), and each GPU
    row's rowid and name (read with it: an index may hold other bytes than a damaged row). A GPU row that reads but
    fails its checksum is in both: its record, and a bad record holding its bytes as they are (the daemon's open
    keeps them aside and validates the record value by value: one value never costs a card's lifetime)."""
    docs: dict[str, dict[str, Any]] = {}
    bad: list[BadRecord] = []
    unreadable: set[str] = set()
    rows: dict[str, tuple[int, Any]] = {}
    for rowid, uuid, name, text, crc in db.execute(f"SELECT rowid AS row_id, uuid, name, wear, {_crc_of(db, 'gpus')} "
                                                   "FROM gpus"):
        rows[uuid] = (rowid, name)
        try:
            docs[uuid] = _json_object(text, f"GPU {uuid!r}")
            if changed(text, crc):  # a card's lifetime: its bytes kept aside, its values validated one by one
                bad.append(BadRecord("gpus", rowid, f"GPU {uuid!r}", f"GPU {uuid!r}: {CHANGED}", text))
        except LedgerError as exc:
            bad.append(BadRecord("gpus", rowid, f"GPU {uuid!r}", str(exc)))
            unreadable.add(uuid)
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'wear_log'").fetchone() is None:
        return docs, bad, rows  # a schema-1 ledger read before the daemon migrated it
    for row, blob, crc in db.execute(f"SELECT id, deltas, {_crc_of(db, 'wear_log')} FROM wear_log ORDER BY id"):
        where = f"wear log row {row}"
        try:
            if changed(blob, crc):
                raise LedgerError(f"{where}: {CHANGED}")
            changes = _log_row(blob, where)
            for uuid, delta in changes.items():
                if (uuid not in docs and uuid not in unreadable) or not isinstance(delta, dict):
                    raise LedgerError(f"{where}: a change of {uuid!r}, which is not a GPU record")
        except LedgerError as exc:
            bad.append(BadRecord("wear_log", row, where, str(exc)))
            continue
        for uuid, delta in changes.items():
            if uuid in docs:  # a GPU whose row is unreadable is set aside with its changes
                _apply(docs[uuid], delta)
    return docs, bad, rows


def _log_row(blob: Any, where: str) -> dict[str, Any]:
    return _json_object(_inflate(blob, where, "log row"), where)


def _inflate(blob: Any, where: str, what: str) -> bytes:
    """A stored zlib blob inflated, to MAX_LOG_ROW_BYTES at most (a larger one is corrupt); LedgerError otherwise."""
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(blob, MAX_LOG_ROW_BYTES)
    except (zlib.error, TypeError) as exc:
        raise LedgerError(f"{where}: not a compressed {what} ({exc})") from None
    if inflater.unconsumed_tail:
        raise LedgerError(f"{where}: inflates past {MAX_LOG_ROW_BYTES >> 20} MiB")
    return raw


def _json_object(text: Any, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(text) if isinstance(text, (str, bytes)) else None
    except (ValueError, RecursionError) as exc:
        raise LedgerError(f"{where}: unreadable ({exc})") from None
    if not isinstance(doc, dict):
        raise LedgerError(f"{where}: not a JSON object")
    return doc


def _checked(doc: dict[str, Any], where: str) -> dict[str, Any]:
    try:
        return check_wear(doc, "", WEAR_SCHEMA)  # type: ignore[no-any-return]
    except SchemaError as exc:
        raise LedgerError(f"{where}: unreadable accumulators ({exc})") from None


def _wear(text: Any, where: str) -> dict[str, Any]:
    """A stored accumulator document, validated; LedgerError naming the record and the field otherwise."""
    try:
        doc = json.loads(text) if isinstance(text, (str, bytes)) else None
        if doc is None:
            raise SchemaError("", f"not JSON text but {type(text).__name__}")
        return check_wear(doc, "", WEAR_SCHEMA)  # type: ignore[no-any-return]
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and SchemaError are ValueErrors
        raise LedgerError(f"{where}: unreadable accumulators ({exc})") from None


@dataclass(frozen=True)
class BadRecord:
    """A stored record that fails validation: its table and rowid, what it is and why it fails."""

    table: str  # gpus, wear_log, imports, events or jobs
    rowid: int
    what: str
    reason: str
    part: Any = _ABSENT  # the value removed from a GPU's record, whose other figures are kept; else the whole row


CHANGED = "its bytes changed since it was written"


def changed(stored: Any, crc: Any) -> bool:
    """Whether a stored value fails the checksum written with it (a row without one, from before checksums, does
    not: it is validated instead)."""
    return crc is not None and (not isinstance(crc, int) or not isinstance(stored, (str, bytes))
                                or crc != _stored_crc(stored))


def _crc_of(db: sqlite3.Connection, table: str) -> str:
    """The column to select for a table's checksum: ``crc``, or NULL in a ledger from before it had one (read by a
    newer gpuwear before its daemon migrated it)."""
    return "crc" if "crc" in {row[1] for row in db.execute(f"PRAGMA table_info({table})")} else "NULL"


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def _event_crc(uuid: str, wall: float, kind: str, detail: str) -> int:
    return _crc(f"{uuid}\x1f{wall!r}\x1f{kind}\x1f{detail}")


def _event_problem(uuid: Any, wall: Any, kind: Any, detail: Any, crc: Any) -> str | None:
    """Why a stored event cannot be read (None: it can): its checksum, else (a row from before schema 5) its
    fields. Validated when it was written, an event whose checksum holds needs nothing more."""
    if isinstance(crc, int) and isinstance(detail, str) and isinstance(wall, float) and isinstance(uuid, str) \
            and isinstance(kind, str):
        return None if crc == _event_crc(uuid, wall, kind, detail) else CHANGED
    if crc is not None:
        return CHANGED
    try:
        check_event({"wall": wall, "kind": kind, "detail": json.loads(detail)}, "")
    except (ValueError, TypeError, RecursionError) as exc:
        return str(exc)
    return None


def _job_problem(data: Any, crc: Any) -> str | None:
    """Why a stored job record cannot be read (None: it can), as :func:`_event_problem`."""
    if isinstance(crc, int) and isinstance(data, (str, bytes)):
        return None if crc == _stored_crc(data) else CHANGED
    if crc is not None:
        return CHANGED
    try:
        check_job(json.loads(_job_text(data, "")), "")
    except (ValueError, TypeError, RecursionError, LedgerError) as exc:
        return str(exc)
    return None


def _job_blob(text: str) -> bytes:
    """A job record as stored: its JSON compressed (a job's histograms repeat their keys: about a third the bytes,
    in the file and in what a save writes)."""
    return zlib.compress(text.encode(), 6)


def _job_text(data: Any, where: str) -> str:
    """A stored job record's JSON: inflated (bounded), or as it is in a row from before schema 5."""
    if isinstance(data, str):
        return data
    try:
        return _inflate(data, where, "job record").decode()
    except UnicodeDecodeError as exc:
        raise LedgerError(f"{where}: not a compressed job record ({exc})") from None


def _stored_crc(data: str | bytes) -> int:
    return zlib.crc32(data) if isinstance(data, bytes) else _crc(data)
