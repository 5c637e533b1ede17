"""The durable wear ledger: SQLite (stdlib) in the state directory, keyed by GPU UUID.

Every save is one transaction (WAL journal, ``synchronous=FULL``): a crash at any instant leaves the previous save
or the new one, never a mix. Every record is validated before it is written (:mod:`gpuwear.wear.schema`); events and
job records carry a CRC-32 of what was written. The daemon's open checks every record (checksums where there are
some): one that fails costs only itself (:func:`_salvage`, the ``set_aside`` table), and a file SQLite cannot read
whole is recovered into a new one, the damaged file kept beside it (:func:`recover`). Readers (``gpuwear report``)
open the file read-only while the daemon writes and prove what they read. A ledger written by a newer gpuwear is
refused (:class:`LedgerTooNewError`), never replaced. The state directory is the daemon's alone: :class:`StateLock`
holds it for the daemon's life, it is created 0700 and the ledger 0600, and symbolic links are not followed.
``meta.schema_version`` allows migrations.
"""

from __future__ import annotations

import fcntl
import functools
import heapq
import json
import logging
import os
import shutil
import sqlite3
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwear import __version__
from gpuwear.config import Config
from gpuwear.wear.accumulate import SCHEMA as WEAR_SCHEMA
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.schema import SchemaError, check_event, check_import, check_job, check_wear

log = logging.getLogger(__name__)

# 2: the wear log (saves write what changed); 3: records may hold "seen" (which kinds of reading a history held),
# which an older gpuwear's strict validator would refuse record by record: it refuses the whole ledger instead;
# 5: the set_aside table, checksums (crc) on events and jobs; 6: the checksums in every ledger called 5 (the first
# schema 5 had none: a number names one schema, so the files called 5 are brought to 6 by what they hold)
SCHEMA_VERSION = 6
EXPORT_VERSION = 1  # the `gpuwear export` document
PAGE_SIZE = 1024
COMPACT_AFTER = 60  # saves logged before one rewrites every GPU's whole record and empties the log
VACUUM_FREE_PAGES = 1024  # free pages (1 MiB) after which a save gives them back to the file system
MAX_LOG_ROW_BYTES = 16 << 20  # a wear-log row inflates to no more than this (a larger one is corrupt)
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
    wear TEXT NOT NULL                 -- GpuWear.to_json()
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
    wear TEXT NOT NULL                 -- GpuWear.to_json() of the imported rows alone
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
CREATE TABLE IF NOT EXISTS wear_log (  -- what each save changed in the GPUs' records, applied in id order
    id INTEGER PRIMARY KEY,
    deltas BLOB NOT NULL               -- zlib of JSON {uuid: changed keys (nested maps by key; null: removed)}
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



def _add_column(db: sqlite3.Connection, table: str, column: str, declared: str) -> None:
    """ALTER TABLE ... ADD COLUMN unless the file's table has it already (a migration runs safely twice)."""
    if column not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declared}")


def _checksums_and_set_aside(db: sqlite3.Connection) -> None:
    _add_column(db, "events", "crc", "INTEGER")
    _add_column(db, "jobs", "crc", "INTEGER")
    db.execute(_SET_ASIDE)


# Schema migrations, from version N to N + 1: each driven by what the file holds, safe to run again.
_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], object]] = {
    1: lambda db: db.execute("CREATE TABLE IF NOT EXISTS wear_log (id INTEGER PRIMARY KEY, deltas BLOB NOT NULL)"),
    2: lambda db: None,  # nothing to change: records without "seen" are read as before
    3: lambda db: None,  # nothing to change: records without "index" are read as before
    4: _checksums_and_set_aside,
    5: _checksums_and_set_aside,  # a schema 5 written before the checksums (d941c07) has none
}


class LedgerError(RuntimeError):
    """The ledger cannot be used; the message names the file and the reason."""


class LedgerRefusedError(LedgerError):
    """The file cannot be used as this gpuwear's ledger for a reason that is not damage (a newer schema, a schema
    version that is not one, an error of ours): refused, kept byte for byte, never recovered nor moved aside."""


class LedgerTooNewError(LedgerRefusedError):
    """The ledger was written by a newer gpuwear: refused, never moved aside (a downgrade must not discard it)."""


class LedgerDamagedError(LedgerError):
    """SQLite's integrity check found damage in the file: what can be read is recovered (:func:`recover`)."""


class StateLockedError(LedgerError):
    """Another process (a running daemon) holds the state directory."""


PID_FILE = "gpuwear.pid"


class StateLock:
    """An exclusive lock on a state directory: ``flock`` on the directory itself (possible even while it is
    read-only), held until :meth:`release` or the process ends (a kill -9 included: the kernel drops it). The
    holder's PID is written to ``gpuwear.pid`` beside the ledger where the directory allows, for the message a
    second process gets."""

    def __init__(self, folder: Path, fd: int) -> None:
        self.folder = folder
        self._fd = fd

    @classmethod
    def acquire(cls, folder: Path) -> StateLock:
        """Lock ``folder`` (created 0700 when missing). Raises :class:`StateLockedError` naming the holder, or
        OSError when the folder cannot be made or opened."""
        private_folder(folder)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _read_pid(folder / PID_FILE)
            raise StateLockedError(f"the state directory {folder} is locked by another gpuwear"
                                   + (f" (PID {holder})" if holder else "")
                                   + ": only one process may write its ledger") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            pid_fd = os.open(folder / PID_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(pid_fd, "w") as f:
                f.write(f"{os.getpid()}\n")
        except OSError:  # a read-only directory: locked all the same, the holder just goes unnamed
            pass
        return cls(folder, fd)

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            if _read_pid(self.folder / PID_FILE) == os.getpid():
                (self.folder / PID_FILE).unlink()
        except OSError:
            pass
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = -1


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text()[:32].strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def private_folder(folder: Path) -> None:
    """Create ``folder`` mode 0700 whatever the umask, refusing a symbolic link (but systemd's own: with
    ``DynamicUser=``, ``/var/lib/gpuwear`` is a link into ``/var/lib/private``)."""
    if folder.is_symlink() and not os.path.realpath(folder).startswith("/var/lib/private/"):
        raise LedgerError(f"the state directory {folder} is a symbolic link: refusing to follow it "
                          "(point state_dir at the real directory)")
    if not folder.is_dir():
        folder.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        return
    st = folder.stat()
    if st.st_mode & (stat.S_IWOTH | stat.S_ISVTX):  # /tmp, /var/tmp: other users' files live there
        raise LedgerError(f"{folder} is a shared directory (writable by everyone): give gpuwear a folder of its own "
                          "(state_dir, --state-dir), which it keeps private")
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(folder, 0o700)


def _private_file(path: Path) -> None:
    """Create the ledger file mode 0600 (SQLite gives its -wal and -shm files the same mode), refusing links."""
    for candidate in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if candidate.is_symlink():
            raise LedgerError(f"{candidate} is a symbolic link: refusing to follow it")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Event:
    """Something that happened to a GPU: a gap, a lost GPU, an XID, a memory-error change."""

    uuid: str
    wall: float
    kind: str
    detail: dict[str, Any]


class Ledger:
    """One ledger file. Use :meth:`open` (daemon, read-write) or :meth:`open_read_only`."""

    def __init__(self, path: Path, connection: sqlite3.Connection, recovered: Path | None = None,
                 set_aside: int = 0) -> None:
        self.path = path
        self._db = connection
        self.recovered = recovered  # where the damaged file was kept when it was recovered at open
        self.set_aside = set_aside  # records (or values of records) set aside at open
        self._saved: dict[str, dict[str, Any]] | None = None  # each GPU's record as committed (base + log)
        self._log_rows = 0
        self._vacuum_failed = False  # said once in the log, not at every save
        self.left_out: list[str] = []  # the rows a read left out (why, one each), for the reader to say

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path) -> Ledger:
        """Open or create the ledger, every record validated. A record (or a value of a GPU's record) that fails
        validation is set aside (the ``set_aside`` table) and the rest kept; a file SQLite cannot read whole is
        recovered (:func:`recover`: what can still be read, in a new ledger; the damaged file kept beside it).
        Raises :class:`LedgerTooNewError` for a ledger of a newer gpuwear, LedgerError for a symbolic link,
        OSError / sqlite3.Error when the directory cannot be written."""
        private_folder(path.parent)
        finish_recovery(path)  # one a kill interrupted
        _private_file(path)
        recovered: Path | None = None
        for attempt in range(2):
            legacy: list[tuple[str, int, int]] = []
            try:
                db = cls._connect(path)
                try:
                    docs, bad = _audit(db, legacy)
                except BaseException:
                    db.close()
                    raise
                break
            except LedgerRefusedError:
                raise
            except (sqlite3.DatabaseError, LedgerError, UnicodeDecodeError) as exc:  # SQLite's message on a damaged
                # page can hold the page's own bytes, which are not UTF-8
                if isinstance(exc, sqlite3.Error) and environment_error(exc):
                    raise  # the disk or the directory, not the file: kept as it is, retried by the caller
                if not damaged(exc) or attempt:  # an error of ours, or a file recovery did not mend: never rewritten
                    why = "still damaged once recovered" if attempt else "not recovered (not damage SQLite reports)"
                    raise LedgerRefusedError(f"{path}: {printable(str(exc))[:300]}: {why}; the file is kept as it "
                                             "is") from exc
                recovered = recover(path, exc)
        if legacy:  # rows from before checksums, validated once: stamped, so that later opens only check them
            with _transaction(db):
                for table in ("events", "jobs"):
                    db.executemany(f"UPDATE {table} SET crc = ? WHERE rowid = ?",
                                   [(crc, rowid) for t, rowid, crc in legacy if t == table])
        if bad:
            _set_aside(db, docs, bad)
            what, why = bad[0].what, bad[0].reason
            first = printable(why if why.startswith(what) else f"{what}: {why}")[:300]
            log.error("ledger %s: set aside %d record(s) that fail validation, the rest of the history kept (%s%s); "
                      "they are kept in its set_aside table", path, len(bad), first,
                      f"; and {len(bad) - 1} more" if len(bad) > 1 else "")
        return cls(path, db, recovered, len(bad))

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        if path.exists() and path.stat().st_size:
            _examine(path)
        db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        db.text_factory = _text
        try:
            version = _schema_version(db)
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                # 1 KiB pages for a new ledger: a save appends a few KiB to the wear log, and every page it
                # touches is written whole (twice: the WAL, then the checkpoint); pages freed by retention can be
                # given back (incremental vacuum, which must be chosen before the first table)
                db.execute(f"PRAGMA page_size={PAGE_SIZE}")
                db.execute("PRAGMA auto_vacuum=INCREMENTAL")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            # a 256 KiB page cache, not the default 2 MiB: the ledger is written once a minute and read at start,
            # and the default cache grew the daemon's RSS by 2 MiB over its first week as the file grew
            db.execute("PRAGMA cache_size=-256")
            if version is None:
                db.executescript(_SCHEMA)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            while version is not None and version < SCHEMA_VERSION:
                if version not in _MIGRATIONS:
                    raise LedgerRefusedError(f"{path}: no migration from ledger schema {version}")
                db.execute("BEGIN IMMEDIATE")
                _MIGRATIONS[version](db)
                version += 1
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(version),))
                db.execute("COMMIT")
            present = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if missing := sorted(set(_tables()) - present):  # dropped: nothing of them is left to lose
                db.executescript(_SCHEMA)
                log.error("ledger %s had no %s table: created empty, the rest of the history kept", path,
                          ", ".join(missing))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('written_by', ?)", (__version__,))
            if db.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:  # a ledger from before: once, rewritten whole
                db.execute("PRAGMA auto_vacuum=INCREMENTAL")
                db.execute("VACUUM")
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
            db.text_factory = _text
            db.execute("PRAGMA cache_size=-256")  # as the daemon's own: the page at / reads through one of these
            version = _schema_version(db)
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise LedgerError(f"{path}: not a readable gpuwear ledger ({exc})") from None
        if version is None or version > SCHEMA_VERSION:
            message = (_too_new(path, db, version) if version is not None else
                       f"{path}: not a gpuwear ledger this version can read (no schema version)")
            db.close()
            raise LedgerTooNewError(message) if version is not None else LedgerError(message)
        # no pass over the whole history: each read proves what it reads (checksums, validation)
        return cls(path, db)

    def close(self) -> None:
        self._db.close()

    # -- reading ------------------------------------------------------------------------

    def load(self, gate_celsius: float) -> dict[str, GpuWear]:
        """Every GPU's accumulators, by UUID."""
        return {uuid: GpuWear.from_json(_checked(doc, f"{self.path}: GPU {uuid}"), gate_celsius)
                for uuid, doc in sorted(_read_docs(self._db).items())}

    def meta(self, key: str) -> str | None:
        """A value of the meta table (``save(meta=...)`` writes them), None where absent."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row and isinstance(row[0], str) else None

    def rows(self) -> dict[str, int]:
        """Rows per table: what the file's size is made of (``gpuwear doctor``)."""
        present = {name for (name,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {table: self._db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("gpus", "wear_log", "jobs", "events", "imports", "set_aside") if table in present}

    def events(self, uuid: str | None = None, since: float | None = None, last: int | None = None) -> list[Event]:
        """A GPU's events (all GPUs': None) from ``since`` on, oldest first: the newest ``last`` of them where given.
        Each is proved whole by its checksum (validated where it has none); one that is not is left out and said in
        :attr:`left_out`."""
        query = ("SELECT uuid, wall, kind, detail, crc FROM events WHERE (? IS NULL OR uuid = ?) AND wall >= ? "
                 "ORDER BY id DESC LIMIT ?")
        rows = self._db.execute(query, (uuid, uuid, since if since is not None else float("-inf"),
                                        -1 if last is None else last)).fetchall()
        out = []
        for u, w, k, d, crc in reversed(rows):
            problem = _event_problem(u, w, k, d, crc)
            if problem:
                self.left_out.append(f"an event of GPU {printable(str(u))[:80]!r}: {problem}")
                continue
            out.append(Event(u, w, k, json.loads(d)))
        return out

    def covered(self, uuid: str) -> list[tuple[float, float]]:
        """The wall-clock intervals this ledger's history of a GPU observed, live and imported, sorted: what an
        import must not count again. A record from before intervals were kept counts as its whole span."""
        out: list[tuple[float, float]] = []
        live = _read_docs(self._db).get(uuid)
        if live and live.get("covered"):
            out += [(float(a), float(b)) for a, b in live["covered"].items()]
        elif live and live.get("first_seen") is not None and live.get("last_seen") is not None:
            out.append((float(live["first_seen"]), float(live["last_seen"])))
        # an import covers the intervals it integrated: its whole span only where it holds observed time but no
        # intervals (a ledger export's part from before intervals were kept), never for rows that observed nothing
        # (two rows years apart, from a clock that was off, would otherwise cover every later log of the card)
        for first, last, text in self._db.execute("SELECT first, last, wear FROM imports WHERE uuid = ?", (uuid,)):
            doc = _json_object(text, f"import of GPU {uuid!r}")
            if doc.get("covered"):
                out += [(float(a), float(b)) for a, b in doc["covered"].items()]
            elif doc.get("observed_seconds"):
                out.append((float(first), float(last)))
        return sorted(out)

    def imported_spans(self, uuid: str) -> list[tuple[float, float]]:
        """Time spans already imported for a GPU."""
        return list(self._db.execute("SELECT first, last FROM imports WHERE uuid = ? ORDER BY first", (uuid,)))

    def load_imported(self, gate_celsius: float) -> dict[str, GpuWear]:
        """The history imported from logs, all imports of a GPU merged, by UUID."""
        out: dict[str, GpuWear] = {}
        for uuid, text in self._db.execute("SELECT uuid, wear FROM imports ORDER BY first"):
            w = GpuWear.from_json(_wear(text, f"{self.path}: import of GPU {uuid}"), gate_celsius)
            out[uuid] = out[uuid].merged(w) if uuid in out else GpuWear(uuid, gate_celsius=gate_celsius).merged(w)
        return out

    def export(self, uuid: str, simulated: bool = False) -> dict[str, Any]:
        """One GPU's history (live and imported, and its events) as a document another box's
        ledger can import: the ledger follows the card. A simulated card's says so (``"simulated": true``)."""
        live = _read_docs(self._db).get(uuid)
        imports = [json.loads(w) for (w,) in self._db.execute("SELECT wear FROM imports WHERE uuid = ?", (uuid,))]
        if live is None and not imports:
            raise LedgerError(f"{self.path}: no GPU {uuid}")
        parts = ([live] if live else []) + imports
        doc = {"format": "gpuwear-ledger-export", "version": EXPORT_VERSION, "uuid": uuid, "parts": parts,
               "events": [{"wall": e.wall, "kind": e.kind, "detail": e.detail} for e in self.events(uuid)]}
        return {**doc, "simulated": True} if simulated else doc

    def forget(self, uuid: str) -> dict[str, int]:
        """Remove every record of one GPU in one transaction: its live record, its imports, its events and its share of
        each job (a job left with no GPU goes). The wear log is folded into the records first: its rows name GPUs.
        Returns what was removed, by kind; LedgerError when the ledger holds nothing of that GPU."""
        docs = _read_docs(self._db)
        imports = self._db.execute("SELECT count(*) FROM imports WHERE uuid = ?", (uuid,)).fetchone()[0]
        if uuid not in docs and not imports:
            raise LedgerError(f"{self.path}: no GPU {uuid}")
        removed = {"records": int(uuid in docs), "imports": imports, "events": 0, "jobs": 0}
        with self._transaction() as db:
            for u, d in docs.items():
                if u != uuid:
                    db.execute("UPDATE gpus SET wear = ? WHERE uuid = ?", (json.dumps(d, separators=(",", ":")), u))
            db.execute("DELETE FROM wear_log")
            db.execute("DELETE FROM gpus WHERE uuid = ?", (uuid,))
            db.execute("DELETE FROM imports WHERE uuid = ?", (uuid,))
            removed["events"] = db.execute("DELETE FROM events WHERE uuid = ?", (uuid,)).rowcount
            for record, data in db.execute("SELECT record, data FROM jobs").fetchall():
                job = _json_object(_job_text(data, f"job {record!r}"), f"job {record!r}")
                gpus = [g for g in job.get("gpus", []) if g.get("uuid") != uuid]
                if len(gpus) == len(job.get("gpus", [])):
                    continue
                removed["jobs"] += 1
                if gpus:
                    blob = _job_blob(json.dumps({**job, "gpus": gpus}, separators=(",", ":")))
                    db.execute("UPDATE jobs SET data = ?, crc = ? WHERE record = ?", (blob, zlib.crc32(blob), record))
                else:
                    db.execute("DELETE FROM jobs WHERE record = ?", (record,))
        self._saved = None  # what is committed changed under the save cache
        return removed

    def load_all(self, gate_celsius: float) -> dict[str, GpuWear]:
        """Live and imported history merged, by UUID (what a report shows)."""
        live = self.load(gate_celsius)
        for uuid, imported in self.load_imported(gate_celsius).items():
            live[uuid] = live[uuid].merged(imported) if uuid in live else imported
        return live

    # -- writing ------------------------------------------------------------------------

    def import_periods(self, since: float | None = None) -> list[dict[str, Any]]:
        """Each import that reaches past ``since`` as a period shaped like a job record (kind "imported", id the
        source file), so that `gpuwear jobs` lists imported history beside the jobs and idle lines."""
        out = []
        rows = self._db.execute("SELECT rowid AS row_id, uuid, source, first, last, wear FROM imports WHERE last >= ? "
                                "ORDER BY first DESC", (since if since is not None else float("-inf"),))
        for rowid, uuid, source, first, last, text in rows:
            wear = _wear(text, f"{self.path}: import of GPU {uuid}")
            hottest = {sensor: max(int(t) for t in hist) for sensor, hist in wear.get("temperature_seconds", {}).items()
                       if hist}
            out.append({"record": f"import-{rowid}", "kind": "imported", "id": Path(source).name, "user": None,
                        "name": source, "start": first, "end": last, "last_seen": last,
                        "gpus": [{"uuid": uuid, "start": first, "end": last, "max_celsius": hottest, "events": {},
                                  "wear": wear}]})
        return out

    def jobs(self, since: float | None = None, running_only: bool = False) -> list[dict[str, Any]]:
        """Job records (``JobRecord.to_json()``) that ended after ``since`` or still run, newest first."""
        return list(self.iter_jobs(since, running_only))

    def iter_jobs(self, since: float | None = None, running_only: bool = False) -> Iterator[dict[str, Any]]:
        """:meth:`jobs` one record at a time (a listing of a busy box's months holds one in memory, not all), each
        proved whole by its checksum (validated where it has none); one that is not is left out and said in
        :attr:`left_out`."""
        rows = self._db.execute(
            "SELECT record, data, crc FROM jobs WHERE (end IS NULL OR end >= ?) AND (? = 0 OR end IS NULL) "
            "ORDER BY start DESC", (since if since is not None else float("-inf"), int(running_only)))
        for record, data, crc in rows:
            problem = _job_problem(data, crc)
            if problem:
                self.left_out.append(f"job {printable(str(record))[:80]!r}: {problem}")
                continue
            yield json.loads(_job_text(data, f"job {record!r}"))

    def left_out_note(self) -> str | None:
        """What the reads so far left out, in one line for the person reading (None: nothing)."""
        if not self.left_out:
            return None
        more = f" and {len(self.left_out) - 1} more" if len(self.left_out) > 1 else ""
        return (f"{self.path}: {len(self.left_out)} record(s) left out of what is shown ({self.left_out[0]}{more}); "
                "the daemon sets them aside at its next start")

    def periods(self, since: float | None = None) -> Iterator[dict[str, Any]]:
        """Job records and import periods (:meth:`import_periods`) together, newest first, one at a time."""
        return heapq.merge(self.iter_jobs(since), self.import_periods(since), key=lambda r: -r["start"])

    def save(self, wears: Iterable[dict[str, Any]], events: Iterable[Event],
             imports: Iterable[tuple[str, str, float, float, int, dict[str, Any]]] = (),
             jobs: Iterable[dict[str, Any]] = (), forget_jobs_before: float | None = None,
             meta: dict[str, str] | None = None, forget_events_before: float | None = None) -> None:
        """Write accumulators (``GpuWear.to_json()`` dicts), events, imports (uuid, source,
        first, last, rows, wear) and job records in one transaction, removing the job records that ended before
        ``forget_jobs_before`` and the events before ``forget_events_before`` (retention: each GPU's own record keeps
        its lifetime figures; the pages they held are given back to the file system once enough are free). Raises
        ``sqlite3.Error`` (disk full, read-only directory) with nothing written; once it has committed it raises
        nothing, so a caller that saves again what failed never writes an event twice."""
        now = time.time()
        if self._saved is None:  # what is committed, to write only what changed
            self._saved = _read_docs(self._db)
            self._log_rows = self._db.execute("SELECT count(*) FROM wear_log").fetchone()[0]
        saved = self._saved
        # a copy as JSON reads it back: to_json() hands out the live accumulators' own maps, which go on changing
        docs = {w["uuid"]: json.loads(json.dumps(_compact(w), separators=(",", ":"))) for w in wears}
        jobs, events, imports = list(jobs), list(events), list(imports)
        try:  # never write what the next open would refuse (and set aside)
            for uuid, doc in docs.items():
                check_wear(doc, f"GPU {uuid}", WEAR_SCHEMA)
            for job in jobs:
                check_job(job, f"job {job.get('record')!r}")
            for event in events:
                check_event({"wall": event.wall, "kind": event.kind, "detail": event.detail}, f"event of {event.uuid}")
            for uuid, _, first, last, rows, wear in imports:
                check_import(uuid, first, last, rows, json.loads(_dump(wear)), WEAR_SCHEMA)
        except SchemaError as exc:
            raise LedgerError(f"refusing to save a record that would not read back: {exc}") from None
        compact = self._log_rows >= COMPACT_AFTER
        whole = [d for u, d in docs.items() if compact or u not in saved]
        changed = {u: _diff(saved[u], d) for u, d in docs.items() if not compact and u in saved}
        deltas = {u: d for u, d in changed.items() if d}
        if compact:
            whole += [d for u, d in saved.items() if u not in docs]
        with self._transaction() as db:
            for d in whole:
                db.execute("INSERT INTO gpus (uuid, name, serial, first_seen, last_seen, saved, wear) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO UPDATE SET name = excluded.name, "
                           "serial = excluded.serial, first_seen = excluded.first_seen, "
                           "last_seen = excluded.last_seen, saved = excluded.saved, wear = excluded.wear",
                           (d["uuid"], d.get("name", ""), d.get("serial"), d.get("first_seen"), d.get("last_seen"),
                            now, json.dumps(d, separators=(",", ":"))))
            if compact:
                db.execute("DELETE FROM wear_log")
            if deltas:  # one row a save: its GPUs' changes compressed together (their keys repeat)
                db.execute("INSERT INTO wear_log (deltas) VALUES (?)",
                           (zlib.compress(json.dumps(deltas, separators=(",", ":")).encode(), 6),))
            fields = [(e.uuid, float(e.wall), e.kind, json.dumps(e.detail)) for e in events]
            db.executemany("INSERT INTO events (uuid, wall, kind, detail, crc) VALUES (?, ?, ?, ?, ?)",
                           [(*f, _event_crc(*f)) for f in fields])
            db.executemany("INSERT INTO imports (uuid, source, first, last, rows, imported, wear) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(u, src, a, b, n, now, _dump(w)) for u, src, a, b, n, w in imports])
            blobs = [(j, _job_blob(json.dumps({**j, "gpus": [{**g, "wear": _compact(g["wear"])} for g in j["gpus"]]},
                                              separators=(",", ":")))) for j in jobs]
            db.executemany("INSERT INTO jobs (record, kind, start, end, data, crc) VALUES (?, ?, ?, ?, ?, ?) "
                           "ON CONFLICT (record) DO UPDATE SET end = excluded.end, data = excluded.data, "
                           "crc = excluded.crc",
                           [(j["record"], j["kind"], j["start"], j["end"], blob, zlib.crc32(blob))
                            for j, blob in blobs])
            if forget_jobs_before is not None:
                db.execute("DELETE FROM jobs WHERE end IS NOT NULL AND end < ?", (forget_jobs_before,))
            if forget_events_before is not None:
                db.execute("DELETE FROM events WHERE wall < ?", (forget_events_before,))
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list((meta or {}).items()))
        saved.update(docs)  # committed: from here on nothing may fail the save (the caller would save it again)
        self._log_rows = 0 if compact else self._log_rows + bool(deltas)
        try:
            self._give_back_pages()
            self._vacuum_failed = False
        except sqlite3.Error as exc:  # a full disk, most likely: the pages stay free, given back at a later save
            if not self._vacuum_failed:
                log.warning("ledger %s: saved, but its free pages could not be given back yet (%s)", self.path, exc)
            self._vacuum_failed = True

    def _give_back_pages(self) -> None:
        """Give the pages retention freed back to the file system (incremental vacuum, a transaction of its own) once
        VACUUM_FREE_PAGES are free: the file shrinks after pruning, and the pages a save frees meanwhile are reused."""
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        if free >= VACUUM_FREE_PAGES and self._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
            # executescript steps it to the end (sqlite3_exec); execute() would free one page
            self._db.executescript(f"PRAGMA incremental_vacuum({int(free)});")

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return _transaction(self._db)


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
    never sees a base from before a compaction with the log from after it). LedgerError for text that is not a
    JSON object."""
    if db.in_transaction:
        return _read_docs_now(db)
    db.execute("BEGIN")
    try:
        return _read_docs_now(db)
    finally:
        db.execute("COMMIT")


def _read_docs_now(db: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    docs, bad, _ = _read_docs_tolerant(db)
    if bad:
        raise LedgerError(bad[0].reason)
    return docs


def _read_docs_tolerant(db: sqlite3.Connection,
                        ) -> tuple[dict[str, dict[str, Any]], list[BadRecord], dict[str, tuple[int, Any]]]:
    """Each GPU's record with the wear log applied, the GPU rows and log rows that could not be read (a log row
    that cannot be applied is left out whole: the records stay as the rows before it left them), and each GPU
    row's rowid and name (read with it: an index may hold other bytes than a damaged row)."""
    docs: dict[str, dict[str, Any]] = {}
    bad: list[BadRecord] = []
    unreadable: set[str] = set()
    rows: dict[str, tuple[int, Any]] = {}
    for rowid, uuid, name, text in db.execute("SELECT rowid AS row_id, uuid, name, wear FROM gpus"):
        rows[uuid] = (rowid, name)
        try:
            docs[uuid] = _json_object(text, f"GPU {uuid!r}")
        except LedgerError as exc:
            bad.append(BadRecord("gpus", rowid, f"GPU {uuid!r}", str(exc)))
            unreadable.add(uuid)
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'wear_log'").fetchone() is None:
        return docs, bad, rows  # a schema-1 ledger read before the daemon migrated it
    for row, blob in db.execute("SELECT id, deltas FROM wear_log ORDER BY id"):
        where = f"wear log row {row}"
        try:
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


def _audit(db: sqlite3.Connection, legacy: list[tuple[str, int, int]] | None = None,
           ) -> tuple[dict[str, dict[str, Any]], list[BadRecord]]:
    """Read every record back and validate it: each GPU's record (its row with the wear log applied, a log row that
    cannot be applied left out) and the records that fail, each on its own. Raises sqlite3.DatabaseError where
    SQLite itself cannot read the file."""
    bad: list[BadRecord] = []
    legacy = [] if legacy is None else legacy  # (table, rowid, checksum) of valid rows written without one
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
    for rowid, uuid, first, last, count, text in db.execute("SELECT rowid AS row_id, uuid, first, last, rows, wear "
                                                            "FROM imports"):
        try:
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
            legacy.append(("events", rowid, _event_crc(uuid, float(wall), kind, detail)))
    for rowid, record, data, crc in db.execute("SELECT rowid AS row_id, record, data, crc FROM jobs"):
        problem = _job_problem(data, crc)
        if problem:
            bad.append(BadRecord("jobs", rowid, f"job {record!r}"[:80], problem))
        elif crc is None:
            legacy.append(("jobs", rowid, _stored_crc(data)))
    return docs, bad


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


def _event_crc(uuid: str, wall: float, kind: str, detail: str) -> int:
    return _crc(f"{uuid}\x1f{wall!r}\x1f{kind}\x1f{detail}")


def _event_problem(uuid: Any, wall: Any, kind: Any, detail: Any, crc: Any) -> str | None:
    """Why a stored event cannot be read (None: it can): its checksum, else (a row from before schema 5) its
    fields. Validated when it was written, an event whose checksum holds needs nothing more."""
    if isinstance(crc, int) and isinstance(detail, str) and isinstance(wall, float) and isinstance(uuid, str) \
            and isinstance(kind, str):
        return None if crc == _event_crc(uuid, wall, kind, detail) else "its bytes changed since it was written"
    if crc is not None:
        return "its bytes changed since it was written"
    try:
        check_event({"wall": wall, "kind": kind, "detail": json.loads(detail)}, "")
    except (ValueError, TypeError, RecursionError) as exc:
        return str(exc)
    return None


def _job_problem(data: Any, crc: Any) -> str | None:
    """Why a stored job record cannot be read (None: it can), as :func:`_event_problem`."""
    if isinstance(crc, int) and isinstance(data, (str, bytes)):
        return None if crc == _stored_crc(data) else "its bytes changed since it was written"
    if crc is not None:
        return "its bytes changed since it was written"
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
        if any(b.table in ("gpus", "wear_log") for b in bad):
            for uuid, doc in docs.items():
                db.execute("UPDATE gpus SET wear = ? WHERE uuid = ?", (json.dumps(doc, separators=(",", ":")), uuid))
            db.execute("DELETE FROM wear_log")


def _too_new(path: Path, db: sqlite3.Connection, version: int) -> str:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'written_by'").fetchone()
    except sqlite3.Error:
        row = None
    by = f"gpuwear {row[0]}" if row else "a newer gpuwear"
    return (f"{path} was written by {by} (ledger schema {version}); this gpuwear {__version__} reads schema "
            f"{SCHEMA_VERSION} and older: upgrade gpuwear (the ledger is kept as it is, never replaced)")


def _text(raw: bytes) -> str:
    """TEXT as str: bytes damaged on disk that are not UTF-8 become U+FFFD (and then fail validation), never a
    UnicodeDecodeError out of a query."""
    return raw.decode("utf-8", "replace")


def printable(text: str) -> str:
    """Text from outside (a file's bytes, SQLite's messages about them) made safe for a terminal or a log line:
    control and format characters (ESC, BEL, C1, bidi overrides) shown as escapes."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


# -- recovery of a file SQLite cannot read whole ------------------------------------------------------------------

RECOVERING = ".recovering"  # the new ledger being written
RECOVERED = ".recovered"  # the new ledger complete, waiting to replace the damaged one (finish_recovery)
SCRATCH = ".scratch"  # a copy of the damaged file whose table definitions are put right before it is read


def recover(path: Path, exc: BaseException) -> Path:
    """Copy what SQLite can still read of a damaged ledger, row by row, into a new ledger that replaces it; the
    damaged file (and its WAL) is kept beside it, named ``ledger.sqlite.damaged-TIME``, which is returned. A kill
    at any instant leaves the damaged ledger in place (recovered again at the next open) or the new one complete
    (:func:`finish_recovery` ends an interrupted swap)."""
    kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    work = path.with_name(path.name + RECOVERING)
    scratch = path.with_name(path.name + SCRATCH)
    for leftover in (work, Path(f"{work}-journal"), *(Path(f"{scratch}{x}") for x in ("", "-wal", "-shm"))):
        leftover.unlink(missing_ok=True)
    try:
        _schema_repaired_copy(path, scratch)
        if (version := _readable_version(scratch)) is not None and version > SCHEMA_VERSION:
            raise LedgerTooNewError(f"{path}: damaged, and written by a newer gpuwear (ledger schema {version}); "
                                    f"this gpuwear {__version__} reads schema {SCHEMA_VERSION} and older: upgrade "
                                    "gpuwear (the ledger is kept as it is, never replaced)")
        best: dict[str, int] | None = None
        for lenient in (False, True):  # the reading that keeps more rows
            trial = path.with_name(f"{path.name}{RECOVERING}-{int(lenient)}")
            trial.unlink(missing_ok=True)
            counts = _copy_readable(scratch, trial, kept.name, lenient)
            if best is None or _kept_more(counts, best):
                best = counts
                os.replace(trial, work)
            else:
                trial.unlink()
        assert best is not None
        counts = best
    except BaseException:  # a full disk, say: the damaged ledger stays as it was, recovered at a later start
        for leftover in (work, *(path.with_name(f"{path.name}{RECOVERING}-{n}") for n in (0, 1))):
            for suffix in ("", "-journal"):
                Path(f"{leftover}{suffix}").unlink(missing_ok=True)
        raise
    finally:
        for leftover in (Path(f"{scratch}{x}") for x in ("", "-wal", "-shm")):
            leftover.unlink(missing_ok=True)
    _fsync(work)
    os.replace(work, path.with_name(path.name + RECOVERED))
    _fsync(path.parent)
    finish_recovery(path)
    log.error("ledger %s is damaged (%s): recovered what SQLite could still read into a new ledger (%s) and kept "
              "the damaged file as %s", path, printable(str(exc))[:300],
              ", ".join(f"{n} {table}" for table, n in counts.items() if table != "meta")
              if any(counts.values()) else "nothing readable",
              kept)
    return kept


def _examine(path: Path) -> None:
    """Check an existing ledger through a read-only connection before anything may write it: its schema version
    first (a newer ledger is never written, damaged or not), then SQLite's quick_check. Read-only, because the last
    connection to close a WAL database checkpoints it: a read-write one would write the WAL's frames into a damaged
    file, which recovery keeps byte for byte."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0, isolation_level=None)) as db:
        db.text_factory = _text
        version = _schema_version(db)
        if version is not None and version > SCHEMA_VERSION:
            raise LedgerTooNewError(_too_new(path, db, version))
        ok = db.execute("PRAGMA quick_check").fetchone()
        if not ok or ok[0] != "ok":
            raise LedgerDamagedError(f"integrity check failed: {printable(str(ok[0]))[:200] if ok else 'no answer'}")


def _kept_more(counts: dict[str, int], than: dict[str, int]) -> bool:
    """Whether a recovery pass's rows (per table) keep more than another's: first the GPUs' lifetime records, which
    nothing else holds, then the imports, then every row; the first pass wins a tie."""
    def weight(c: dict[str, int]) -> tuple[int, int, int]:
        return c.get("gpus", 0), c.get("imports", 0), sum(c.values())
    return weight(counts) > weight(than)


def _readable_version(path: Path) -> int | None:
    """The schema version a damaged ledger still says, read with its schema strict and lenient; None if neither
    reads it."""
    for lenient in (False, True):
        try:
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                db.text_factory = _text
                if lenient:
                    db.execute("PRAGMA writable_schema=ON")
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except (sqlite3.DatabaseError, UnicodeDecodeError):
            continue
        if row is not None and isinstance(row[0], str) and row[0].isdigit():
            return int(row[0])
    return None


def _schema_repaired_copy(src: Path, dst: Path) -> None:
    """A copy of a damaged ledger (and its WAL) whose known tables' definitions are written again from this
    gpuwear's schema: a damaged byte in a CREATE statement otherwise makes SQLite refuse every query on the file
    (its pages are found by the root page kept in the entry). Definitions it cannot rewrite are left as they are."""
    for suffix in ("", "-wal"):
        if Path(f"{src}{suffix}").exists():
            shutil.copyfile(f"{src}{suffix}", f"{dst}{suffix}")
    try:
        with closing(sqlite3.connect(dst, isolation_level=None)) as db:
            db.text_factory = _text
            db.execute("PRAGMA writable_schema=ON")  # also: the entries that do not parse are passed over, not fatal
            db.executemany("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ? AND sql IS NOT ?",
                           [(sql, name, sql) for name, (sql, _) in _tables().items()])
    except (sqlite3.DatabaseError, UnicodeDecodeError):
        pass


@functools.cache
def _tables() -> dict[str, tuple[str, tuple[str, ...]]]:
    """This gpuwear's tables: each one's CREATE statement as sqlite_master holds it, and its columns but an
    ``INTEGER PRIMARY KEY`` (the rowid, which recovery copies as such)."""
    with closing(sqlite3.connect(":memory:")) as db:
        db.executescript(_SCHEMA)
        return {name: (sql, tuple(c[1] for c in db.execute(f"PRAGMA table_info({name})")
                                  if not (c[5] and c[2].upper() == "INTEGER")))
                for name, sql in db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()}


def finish_recovery(path: Path) -> None:
    """Put a complete recovered ledger in the damaged one's place: link the damaged files to their kept names, drop
    the damaged WAL (which must never be applied to the new file), then rename. Each step can be run again."""
    done = path.with_name(path.name + RECOVERED)
    if not done.exists():
        return
    with closing(sqlite3.connect(f"file:{done}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value FROM meta WHERE key = 'recovered_from'").fetchone()
    kept = path.with_name(str(row[0]) if row else f"{path.name}.damaged")
    for suffix in ("", "-wal", "-shm"):
        src, dst = Path(f"{path}{suffix}"), Path(f"{kept}{suffix}")
        if src.exists() and not dst.exists():
            try:
                os.link(src, dst)
            except OSError:  # a file system without hard links
                shutil.copy2(src, dst)
    _fsync(path.parent)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(done, path)
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_readable(src: Path, dst: Path, kept: str, lenient: bool) -> dict[str, int]:
    """Every row SQLite can still read of the known tables of ``src`` into a new ledger at ``dst``, rowids kept
    (events and wear log rows are read in id order); rows it cannot read are stepped over. ``lenient``: the schema
    read with ``writable_schema`` (a damaged entry passed over rather than failing every query; some damage reads
    better one way, some the other)."""
    out = sqlite3.connect(dst, isolation_level=None)
    counts: dict[str, int] = {}
    try:
        out.execute(f"PRAGMA page_size={PAGE_SIZE}")
        out.execute("PRAGMA auto_vacuum=INCREMENTAL")
        out.executescript(_SCHEMA)
        out.execute("BEGIN")
        try:
            source: sqlite3.Connection | None = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=10.0)
        except sqlite3.Error:
            source = None
        if source is not None:
            source.text_factory = _text
            if lenient:
                try:
                    source.execute("PRAGMA writable_schema=ON")  # schema entries that do not parse are passed over
                except (sqlite3.DatabaseError, UnicodeDecodeError):
                    pass
            try:
                try:
                    present = {name for (name,) in source.execute("SELECT name FROM sqlite_master WHERE type = "
                                                                  "'table'")}
                except (sqlite3.DatabaseError, UnicodeDecodeError):  # its pages damaged: each table is tried
                    present = set(_tables())
                for table, (_, columns) in _tables().items():
                    if table in present:
                        try:  # a ledger of an older schema lacks some (the checksums: read as none)
                            have = {row[1] for row in source.execute(f"PRAGMA table_info({table})")}
                        except (sqlite3.DatabaseError, UnicodeDecodeError):
                            have = set(columns)
                        counts[table] = _copy_rows(source, out, table, tuple(c for c in columns if c in have))
            finally:
                source.close()
        out.execute("DELETE FROM meta WHERE key IN ('schema_version', 'recovered_from')")
        out.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        out.execute("INSERT INTO meta VALUES ('recovered_from', ?)", (kept,))
        out.execute("COMMIT")
    finally:
        out.close()
    return counts


def _copy_rows(source: sqlite3.Connection, out: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> int:
    """Copy a table's readable rows in rowid order: in batches while SQLite reads them; past damage, rowid by rowid
    (a point lookup reaches a row whose neighbours' pages are damaged), then by growing steps where nothing reads."""
    try:
        source.execute(f"SELECT rowid FROM {table} LIMIT 0").fetchall()
    except (sqlite3.DatabaseError, UnicodeDecodeError):  # no such table, a schema SQLite cannot parse, a root page
        return 0  # it cannot read: no query of this table can succeed on this connection (the other pass may read it)
    names = ", ".join(columns)
    batch = f"SELECT rowid AS row_id, {names} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT 256"
    point = f"SELECT rowid AS row_id, {names} FROM {table} WHERE rowid = ?"
    insert = f"INSERT OR IGNORE INTO {table} (rowid, {names}) VALUES ({', '.join('?' * (len(columns) + 1))})"
    try:
        last = source.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
    except (sqlite3.DatabaseError, UnicodeDecodeError):
        last = None
    after, copied, step, seen = -(1 << 63), 0, 1, 0
    for _ in range(100_000):  # bounded: a damaged b-tree may answer errors wherever it is asked
        if after >= (last if isinstance(last, int) else seen + (1 << 20)):
            break
        try:
            rows = source.execute(batch, (after,)).fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError):
            rows = None
        if rows == []:
            break
        if rows is None:  # damage ahead: the next rows one lookup each, until a stretch reads in a batch again
            found, start = 0, max(after, 0)
            for rowid in range(start + 1, start + POINT_LOOKUPS + 1):
                try:
                    rows = source.execute(point, (rowid,)).fetchall()
                except (sqlite3.DatabaseError, UnicodeDecodeError):
                    continue
                for row in rows:
                    copied += _insert(out, insert, row)
                    found, seen = found + 1, rowid
            after = start + POINT_LOOKUPS
            if not found:  # nothing readable in that stretch: step further each time
                after, step = min(after + step, (1 << 63) - 1), min(step * 2, 1 << 40)
            continue
        for row in rows:
            copied += _insert(out, insert, row)
        after, step = rows[-1][0], 1
        seen = max(seen, after)
    return copied


POINT_LOOKUPS = 2048  # rowids looked up one by one past damage before reading in batches again


def _insert(out: sqlite3.Connection, insert: str, row: Any) -> int:
    """1 if the row was written; 0 if the new ledger refuses it (a damaged value breaking a constraint). Any other
    error (a full disk) ends the recovery: a row it could read is never dropped as if it could not."""
    try:
        out.execute(insert, row)
        return 1
    except sqlite3.IntegrityError:
        return 0


# SQLite result codes that say the disk, the directory or another process stood in the way, not that the file is
# bad: PERM, BUSY, LOCKED, NOMEM, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL.
_ENVIRONMENT_CODES = frozenset({3, 5, 6, 7, 8, 10, 13, 14, 15})


# SQLite result codes that say the file itself is damaged: CORRUPT, NOTADB.
_DAMAGE_CODES = frozenset({11, 26})


def damaged(exc: BaseException) -> bool:
    """Whether an error at open says the file is damaged (recovered then): SQLite's corruption answers, a failed
    integrity check, or bytes that do not decode as text. Anything else (an error of ours, a failed migration, an
    unreadable schema version) leaves the file as it is."""
    if isinstance(exc, (LedgerDamagedError, UnicodeDecodeError)):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.DatabaseError) and code is not None and code & 0xFF in _DAMAGE_CODES


def environment_error(exc: sqlite3.Error) -> bool:
    """Whether an SQLite error is the environment's (a full disk, a read-only directory, a lock), after which the
    file must be kept as it is, rather than the file's own (corrupt, not a database, tables missing)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _ENVIRONMENT_CODES


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
