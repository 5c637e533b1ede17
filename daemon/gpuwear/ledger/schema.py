"""The ledger's SQLite schema and where its file lives. One schema number names one schema (:data:`SCHEMA_VERSION`);
migrations from N to N + 1 are functions driven by what the file holds, each safe to run again; a transaction is
committed whole or rolled back (:func:`_transaction`).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from gpuwear import __version__
from gpuwear.config import Config
from gpuwear.ledger.errors import LedgerRefusedError, printable

# 2: the wear log (saves write what changed); 3: records may hold "seen" (which kinds of reading a history held),
# which an older gpuwear's strict validator would refuse record by record: it refuses the whole ledger instead;
# 5: the set_aside table, checksums (crc) on events and jobs; 6: the checksums in every ledger called 5 (the first
# schema 5 had none: a number names one schema, so the files called 5 are brought to 6 by what they hold); 7: checksums
# on the GPUs' lifetime records, the wear log and the imports (the history that never ages out); 8: job_lines (each
# job record's lines, kept as the record is saved: listings total them without reading every record) and line_totals
# (their sums by GPU and line name, kept by triggers: the page's shares without a pass over the lines); 9: records
# may hold "incidents" (the newest incidents that called for a reset or a reboot), which an older gpuwear's validator
# would refuse record by record: it refuses the whole ledger instead; 10: records may hold "error_counts" (error
# counters by loaded and idle time), for the same reason; 11: records may hold "error_days" (the error counters'
# loaded time and events by UTC day), for the same reason; 12: records may hold "slow_reads" (the GPU's slow
# NVML reads by load), for the same reason; 13: records may hold "health_days" (the health rules' windows by UTC
# day), for the same reason; 14: records may hold "firmware" (the card's VBIOS and InfoROM at first sight, now, and
# their changes), for the same reason
SCHEMA_VERSION = 14
PAGE_SIZE = 1024
FILENAME = "ledger.sqlite"


def ledger_path(config: Config, simulated: str | None) -> Path:
    """The ledger file of the real GPUs, or of a simulation scenario (its name: a built-in one, or a scenario file's
    name without .yaml): each scenario keeps its own history apart, and a real ledger never holds simulated GPUs."""
    folder = config.resolved_state_dir()
    if simulated is None:
        return folder / FILENAME
    name = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in simulated).lstrip(".")
    return folder / "simulated" / (name or "_") / FILENAME


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gpus (
    uuid TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    serial TEXT,
    first_seen REAL,
    last_seen REAL,
    saved REAL NOT NULL,
    wear TEXT NOT NULL,                -- GpuWear.to_json()
    crc INTEGER                        -- crc32 of wear, written with it (NULL: a row from before schema 7)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL,
    wall REAL NOT NULL,                -- Unix seconds
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,              -- JSON
    crc INTEGER                        -- _event_crc, written with the row (NULL: a row from before schema 5)
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
    wear TEXT NOT NULL,                -- GpuWear.to_json() of the imported rows alone
    crc INTEGER                        -- crc32 of wear, written with it (NULL: a row from before schema 7)
);
CREATE TABLE IF NOT EXISTS jobs (      -- a job's run, or one idle period of one GPU
    record TEXT PRIMARY KEY,           -- job key @ start
    kind TEXT NOT NULL,
    start REAL NOT NULL,
    end REAL,                          -- NULL while running
    data TEXT NOT NULL,                -- JobRecord.to_json(): zlib of the JSON (a BLOB), or the JSON (before schema 5)
    crc INTEGER                        -- crc32 of data, written with it (NULL: a row from before schema 5)
);
CREATE INDEX IF NOT EXISTS jobs_by_start ON jobs (start);
CREATE TABLE IF NOT EXISTS job_lines ( -- each job record's lines (gpuwear.jobs.lines.Line), written with the record
    record TEXT NOT NULL,              -- jobs.record
    slice INTEGER NOT NULL,            -- its place in the record's GPUs
    uuid TEXT NOT NULL,
    kind TEXT NOT NULL,
    line TEXT NOT NULL,
    title TEXT NOT NULL,
    observed INTEGER NOT NULL,         -- milliseconds
    energy INTEGER NOT NULL,           -- millijoules
    aging INTEGER NOT NULL,            -- billionths of an equivalent hour (central)
    fatigue INTEGER NOT NULL,          -- billionths of a reference cycle (central)
    peak,                              -- hottest GPU °C as the record holds it (no affinity: 85 stays 85), or NULL
    start REAL NOT NULL,               -- the record's start and end (NULL while running), as in jobs
    end REAL,
    key INTEGER NOT NULL,              -- gpuwear.jobs.lines.key(): the parameters its figures were computed with
    crc INTEGER NOT NULL,              -- crc32 of the JSON of the values above, in order (Ledger.verify_lines)
    PRIMARY KEY (record, slice)
);
CREATE INDEX IF NOT EXISTS job_lines_sums ON job_lines (key, uuid, line, end, slice, observed, energy, aging, fatigue);
CREATE TABLE IF NOT EXISTS line_totals ( -- job_lines added up by key, GPU and line name, kept by the triggers below
    key INTEGER NOT NULL, uuid TEXT NOT NULL, line TEXT NOT NULL,
    lines INTEGER NOT NULL, firsts INTEGER NOT NULL,   -- lines, and lines that are their record's first (slice 0)
    observed INTEGER NOT NULL, energy INTEGER NOT NULL, aging INTEGER NOT NULL, fatigue INTEGER NOT NULL,
    PRIMARY KEY (key, uuid, line)
);
CREATE TRIGGER IF NOT EXISTS line_added AFTER INSERT ON job_lines BEGIN
    INSERT INTO line_totals VALUES (new.key, new.uuid, new.line, 1, new.slice = 0, new.observed, new.energy,
                                    new.aging, new.fatigue)
    ON CONFLICT (key, uuid, line) DO UPDATE SET lines = lines + 1, firsts = firsts + excluded.firsts,
        observed = observed + excluded.observed, energy = energy + excluded.energy, aging = aging + excluded.aging,
        fatigue = fatigue + excluded.fatigue;
END;
CREATE TRIGGER IF NOT EXISTS line_removed AFTER DELETE ON job_lines BEGIN
    UPDATE line_totals SET lines = lines - 1, firsts = firsts - (old.slice = 0), observed = observed - old.observed,
        energy = energy - old.energy, aging = aging - old.aging, fatigue = fatigue - old.fatigue
    WHERE key = old.key AND uuid = old.uuid AND line = old.line;
    DELETE FROM line_totals WHERE key = old.key AND uuid = old.uuid AND line = old.line AND lines <= 0;
END;
CREATE INDEX IF NOT EXISTS job_lines_hottest ON job_lines (key, peak, start, record, slice);
CREATE INDEX IF NOT EXISTS jobs_by_end ON jobs (end, record);
CREATE TABLE IF NOT EXISTS wear_log (  -- what each save changed in the GPUs' records, applied in id order
    id INTEGER PRIMARY KEY,
    deltas BLOB NOT NULL,              -- zlib of JSON {uuid: changed keys (nested maps by key; null: removed)}
    crc INTEGER                        -- crc32 of deltas, written with it (NULL: a row from before schema 7)
);
CREATE TABLE IF NOT EXISTS set_aside ( -- records (or values of a GPU's record) that failed validation at an open
    id INTEGER PRIMARY KEY,
    wall REAL NOT NULL,                -- when they were set aside, Unix seconds
    source TEXT NOT NULL,              -- the table they came from
    what TEXT NOT NULL,
    reason TEXT NOT NULL,
    data TEXT NOT NULL                 -- JSON: the row's values, or the value removed from a GPU's record
);
"""


_SET_ASIDE = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS set_aside"):]


def _statements(script: str) -> list[str]:
    """An SQL script's statements, one each (a trigger's body holds statements of its own)."""
    out, buffer = [], ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            out.append(buffer.strip())
            buffer = ""
    return out


_JOB_LINES = _statements(_SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS job_lines"):
                                 _SCHEMA.index("CREATE TABLE IF NOT EXISTS wear_log")])
# tables computed from others (recovery leaves them empty: a line is computed again from its record)
DERIVED = frozenset({"job_lines", "line_totals"})
# line_totals' rows, added up afresh from job_lines
LINE_RECOUNT = ("SELECT key, uuid, line, count(*), sum(slice = 0), sum(observed), sum(energy), sum(aging), "
                "sum(fatigue) FROM job_lines GROUP BY key, uuid, line")


def add_missing_tables(db: sqlite3.Connection, missing: Iterable[str]) -> None:
    """Create the tables of this gpuwear a file lacks (and their indexes and triggers), in one transaction; a
    line_totals made here is added up from the lines the file keeps (a ledger of e27b638, schema 8, kept lines
    before their totals)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in _statements(_SCHEMA):
            db.execute(statement)
        if "line_totals" in missing:
            db.execute(f"INSERT INTO line_totals {LINE_RECOUNT}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _has_table(db: sqlite3.Connection, table: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None


def _add_column(db: sqlite3.Connection, table: str, column: str, declared: str) -> None:
    """ALTER TABLE ... ADD COLUMN unless the file's table has it already (a migration runs safely twice), or the file
    has no such table (a ledger of 797f9a4, schema 1, has no jobs table: made whole once migrated)."""
    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if columns and column not in columns:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declared}")


def _wear_log(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS wear_log (id INTEGER PRIMARY KEY, deltas BLOB NOT NULL)")
    # the first schema 1 (797f9a4) kept no figures of an import apart: its rows are set aside, said
    _add_column(db, "imports", "wear", "TEXT NOT NULL DEFAULT ''")


def _checksums_and_set_aside(db: sqlite3.Connection) -> None:
    _add_column(db, "events", "crc", "INTEGER")
    _add_column(db, "jobs", "crc", "INTEGER")
    db.execute(_SET_ASIDE)


def _record_checksums(db: sqlite3.Connection) -> None:
    for table in ("gpus", "wear_log", "imports"):
        _add_column(db, table, "crc", "INTEGER")


# Schema migrations, from version N to N + 1: each driven by what the file holds, safe to run again.
_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], object]] = {
    1: _wear_log,
    2: lambda db: None,  # nothing to change: records without "seen" are read as before
    3: lambda db: None,  # nothing to change: records without "index" are read as before
    4: _checksums_and_set_aside,
    5: _checksums_and_set_aside,  # a schema 5 written before the checksums (d941c07) has none
    6: _record_checksums,
    7: lambda db: [db.execute(statement) for statement in _JOB_LINES] if _has_table(db, "jobs") else None,  # empty:
    # the daemon fills it from the records (readers count the rest meanwhile); a file without jobs (schema 1) gets
    # them whole once migrated (add_missing_tables)
    8: lambda db: None,  # nothing to change: records without "incidents" are read as before
    9: lambda db: None,  # nothing to change: records without "error_counts" are read as before
    10: lambda db: None,  # nothing to change: records without "error_days" are read as before
    11: lambda db: None,  # nothing to change: records without "slow_reads" are read as before
    12: lambda db: None,  # nothing to change: records without "health_days" are read as before
    13: lambda db: None,  # nothing to change: records without "firmware" are read as before
}


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on ``db``: committed at the end of the block, rolled back if it raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _too_new(path: Path, db: sqlite3.Connection, version: int) -> str:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'written_by'").fetchone()
    except sqlite3.Error:
        row = None
    by = f"gpuwear {row[0]}" if row else "a newer gpuwear"
    return (f"{path} was written by {by} (ledger schema {version}); this gpuwear {__version__} reads schema "
            f"{SCHEMA_VERSION} and older: upgrade gpuwear (the ledger is kept as it is, never replaced)")


@functools.cache
def _tables() -> dict[str, tuple[str, tuple[str, ...]]]:
    """This gpuwear's tables: each one's CREATE statement as sqlite_master holds it, and its columns but an
    ``INTEGER PRIMARY KEY`` (the rowid, which recovery copies as such)."""
    with closing(sqlite3.connect(":memory:")) as db:
        db.executescript(_SCHEMA)
        return {name: (sql, tuple(c[1] for c in db.execute(f"PRAGMA table_info({name})")
                                  if not (c[5] and c[2].upper() == "INTEGER")))
                for name, sql in db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()}


def _schema_version(db: sqlite3.Connection) -> int | None:
    with closing(db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'meta'")) as cur:
        if cur.fetchone() is None:
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables:
                raise LedgerRefusedError("the file holds an SQLite database that is not a gpuwear ledger")
            return None
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        return None
    text = row[0]
    if not isinstance(text, str) or not text.isdigit() or int(text) < 1:
        raise LedgerRefusedError(f"meta.schema_version is {printable(repr(text))[:40]}, not a schema version")
    return int(text)
