"""The durable wear ledger: SQLite (stdlib) in the state directory, keyed by GPU UUID.

Every save is one transaction (WAL journal, ``synchronous=FULL``): a crash at any instant
leaves the previous save or the new one, never a mix. Readers (``gpuwear report``) open
the file read-only while the daemon writes. A file that cannot be read as a ledger is
moved aside (never silently replaced) and the move is reported. ``meta.schema_version``
allows migrations.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwear.wear.accumulate import GpuWear

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
FILENAME = "ledger.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gpus (
    uuid TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    serial TEXT,
    first_seen REAL,
    last_seen REAL,
    saved REAL NOT NULL,
    wear TEXT NOT NULL                 -- GpuWear.to_json()
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL,
    wall REAL NOT NULL,                -- Unix seconds
    kind TEXT NOT NULL,
    detail TEXT NOT NULL               -- JSON
);
CREATE INDEX IF NOT EXISTS events_by_gpu ON events (uuid, wall);
CREATE TABLE IF NOT EXISTS imports (  -- history backfilled from logs, kept apart from the live one
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL,
    source TEXT NOT NULL,
    first REAL NOT NULL,               -- the time span imported, Unix seconds
    last REAL NOT NULL,
    rows INTEGER NOT NULL,
    imported REAL NOT NULL,
    wear TEXT NOT NULL                 -- GpuWear.to_json() of the imported rows alone
);
CREATE TABLE IF NOT EXISTS jobs (      -- a job's run, or one idle period of one GPU
    record TEXT PRIMARY KEY,           -- job key @ start
    kind TEXT NOT NULL,
    start REAL NOT NULL,
    end REAL,                          -- NULL while running
    data TEXT NOT NULL                 -- JobRecord.to_json()
);
CREATE INDEX IF NOT EXISTS jobs_by_start ON jobs (start);
"""


class LedgerError(RuntimeError):
    """The ledger cannot be used; the message names the file and the reason."""


@dataclass(frozen=True)
class Event:
    """Something that happened to a GPU: a gap, a lost GPU, an XID, a memory-error change."""

    uuid: str
    wall: float
    kind: str
    detail: dict[str, Any]


class Ledger:
    """One ledger file. Use :meth:`open` (daemon, read-write) or :meth:`open_read_only`."""

    def __init__(self, path: Path, connection: sqlite3.Connection, moved_aside: Path | None = None) -> None:
        self.path = path
        self._db = connection
        self.moved_aside = moved_aside  # where an unreadable ledger was moved at open, if it was

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path) -> Ledger:
        """Open or create the ledger; an unreadable file is moved aside with an error log."""
        path.parent.mkdir(parents=True, exist_ok=True)
        moved: Path | None = None
        try:
            db = cls._connect(path)
        except (sqlite3.DatabaseError, LedgerError) as exc:
            moved = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(path) + suffix)
                if src.exists():
                    src.rename(Path(str(moved) + suffix))
            log.error("ledger %s cannot be read (%s); moved it aside to %s and started a new ledger: the "
                      "history it held is not counted until it is repaired", path, exc, moved)
            db = cls._connect(path)
        return cls(path, db, moved)

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        try:
            ok = db.execute("PRAGMA quick_check").fetchone()
            if not ok or ok[0] != "ok":
                raise LedgerError(f"integrity check failed: {ok[0] if ok else 'no answer'}")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            # a 256 KiB page cache, not the default 2 MiB: the ledger is written once a minute and read at start,
            # and the default cache grew the daemon's RSS by 2 MiB over its first week as the file grew
            db.execute("PRAGMA cache_size=-256")
            version = _schema_version(db)
            if version is None:
                db.executescript(_SCHEMA)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif version > SCHEMA_VERSION:
                raise LedgerError(f"schema version {version} is newer than this gpuwear's ({SCHEMA_VERSION})")
        except BaseException:
            db.close()
            raise
        return db

    @classmethod
    def open_read_only(cls, path: Path) -> Ledger:
        """Open an existing ledger for reading (while the daemon may be writing it)."""
        if not path.exists():
            raise LedgerError(f"no ledger at {path}: has the daemon run with this state directory?")
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0, isolation_level=None)
            version = _schema_version(db)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{path}: not a readable gpuwear ledger ({exc})") from None
        if version is None or version > SCHEMA_VERSION:
            db.close()
            raise LedgerError(f"{path}: not a gpuwear ledger this version can read (schema {version})")
        return cls(path, db)

    def close(self) -> None:
        self._db.close()

    # -- reading ------------------------------------------------------------------------

    def load(self, gate_celsius: float) -> dict[str, GpuWear]:
        """Every GPU's accumulators, by UUID."""
        out: dict[str, GpuWear] = {}
        for uuid, text in self._db.execute("SELECT uuid, wear FROM gpus ORDER BY uuid"):
            try:
                out[uuid] = GpuWear.from_json(json.loads(text), gate_celsius)
            except (ValueError, KeyError, TypeError) as exc:
                raise LedgerError(f"{self.path}: GPU {uuid}: unreadable accumulators ({exc})") from None
        return out

    def events(self, uuid: str | None = None, since: float | None = None) -> list[Event]:
        query = "SELECT uuid, wall, kind, detail FROM events WHERE (? IS NULL OR uuid = ?) AND wall >= ? ORDER BY id"
        rows = self._db.execute(query, (uuid, uuid, since if since is not None else float("-inf")))
        return [Event(u, w, k, json.loads(d)) for u, w, k, d in rows]

    def imported_spans(self, uuid: str) -> list[tuple[float, float]]:
        """Time spans already imported for a GPU."""
        return list(self._db.execute("SELECT first, last FROM imports WHERE uuid = ? ORDER BY first", (uuid,)))

    def load_imported(self, gate_celsius: float) -> dict[str, GpuWear]:
        """The history imported from logs, all imports of a GPU merged, by UUID."""
        out: dict[str, GpuWear] = {}
        for uuid, text in self._db.execute("SELECT uuid, wear FROM imports ORDER BY first"):
            w = GpuWear.from_json(json.loads(text), gate_celsius)
            out[uuid] = out[uuid].merged(w) if uuid in out else GpuWear(uuid, gate_celsius=gate_celsius).merged(w)
        return out

    def export(self, uuid: str) -> dict[str, Any]:
        """One GPU's history (live and imported, and its events) as a document another box's
        ledger can import: the ledger follows the card."""
        row = self._db.execute("SELECT wear FROM gpus WHERE uuid = ?", (uuid,)).fetchone()
        imports = [json.loads(w) for (w,) in self._db.execute("SELECT wear FROM imports WHERE uuid = ?", (uuid,))]
        if row is None and not imports:
            raise LedgerError(f"{self.path}: no GPU {uuid}")
        parts = ([json.loads(row[0])] if row else []) + imports
        return {"format": "gpuwear-ledger-export", "version": SCHEMA_VERSION, "uuid": uuid, "parts": parts,
                "events": [{"wall": e.wall, "kind": e.kind, "detail": e.detail} for e in self.events(uuid)]}

    def load_all(self, gate_celsius: float) -> dict[str, GpuWear]:
        """Live and imported history merged, by UUID (what a report shows)."""
        live = self.load(gate_celsius)
        for uuid, imported in self.load_imported(gate_celsius).items():
            live[uuid] = live[uuid].merged(imported) if uuid in live else imported
        return live

    # -- writing ------------------------------------------------------------------------

    def jobs(self, since: float | None = None, running_only: bool = False) -> list[dict[str, Any]]:
        """Job records (``JobRecord.to_json()``) that ended after ``since`` or still run, newest first."""
        rows = self._db.execute(
            "SELECT data FROM jobs WHERE (end IS NULL OR end >= ?) AND (? = 0 OR end IS NULL) ORDER BY start DESC",
            (since if since is not None else float("-inf"), int(running_only)))
        return [json.loads(d) for (d,) in rows]

    def save(self, wears: Iterable[dict[str, Any]], events: Iterable[Event],
             imports: Iterable[tuple[str, str, float, float, int, dict[str, Any]]] = (),
             jobs: Iterable[dict[str, Any]] = ()) -> None:
        """Write accumulators (``GpuWear.to_json()`` dicts), events, imports (uuid, source,
        first, last, rows, wear) and job records in one transaction. Raises ``sqlite3.Error``
        (disk full, read-only directory) with nothing written."""
        now = time.time()
        with self._transaction() as db:
            for w in wears:
                db.execute("INSERT INTO gpus (uuid, name, serial, first_seen, last_seen, saved, wear) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO UPDATE SET name = excluded.name, "
                           "serial = excluded.serial, first_seen = excluded.first_seen, "
                           "last_seen = excluded.last_seen, saved = excluded.saved, wear = excluded.wear",
                           (w["uuid"], w["name"], w["serial"], w["first_seen"], w["last_seen"], now,
                            json.dumps(w, separators=(",", ":"))))
            db.executemany("INSERT INTO events (uuid, wall, kind, detail) VALUES (?, ?, ?, ?)",
                           [(e.uuid, e.wall, e.kind, json.dumps(e.detail)) for e in events])
            db.executemany("INSERT INTO imports (uuid, source, first, last, rows, imported, wear) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(u, src, a, b, n, now, json.dumps(w, separators=(",", ":")))
                            for u, src, a, b, n, w in imports])
            db.executemany("INSERT OR REPLACE INTO jobs (record, kind, start, end, data) VALUES (?, ?, ?, ?, ?)",
                           [(j["record"], j["kind"], j["start"], j["end"], json.dumps(j, separators=(",", ":")))
                            for j in jobs])

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise


def _schema_version(db: sqlite3.Connection) -> int | None:
    with closing(db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'meta'")) as cur:
        if cur.fetchone() is None:
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables:
                raise LedgerError("the file holds an SQLite database that is not a gpuwear ledger")
            return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else None
