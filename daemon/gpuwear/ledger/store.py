"""The ledger (:class:`Ledger`): opening (the daemon's, read-write, after the file is examined and migrated, and
readers', read-only while the daemon writes), reading what is shown, and saving. Every save is one transaction (WAL
journal, ``synchronous=FULL``): a crash at any instant leaves the previous save or the new one; nothing after the
commit fails a save, so a save made again never writes an event twice. A read leaves out a row that fails its
check and says so (:attr:`Ledger.left_out`), never failing the command or the page.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import shutil
import sqlite3
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from gpuwear import __version__
from gpuwear.ledger import retention
from gpuwear.ledger.damage import _examine, damaged, environment_error, finish_recovery
from gpuwear.ledger.errors import LedgerError, LedgerRefusedError, LedgerTooNewError, _text, printable
from gpuwear.ledger.integrity import _audit, _set_aside
from gpuwear.ledger.lock import _private_file, private_folder
from gpuwear.ledger.records import (
    CHANGED,
    Event,
    _checked,
    _compact,
    _crc_of,
    _diff,
    _dump,
    _event_crc,
    _event_problem,
    _job_blob,
    _job_problem,
    _job_text,
    _json_object,
    _read_docs,
    _read_docs_leaving_out,
    _stored_crc,
    _wear,
    changed,
)
from gpuwear.ledger.schema import (
    _MIGRATIONS,
    _SCHEMA,
    DERIVED,
    LINE_RECOUNT,
    PAGE_SIZE,
    SCHEMA_VERSION,
    _schema_version,
    _tables,
    _too_new,
    _transaction,
    add_missing_tables,
)
from gpuwear.wear.accumulate import SCHEMA as WEAR_SCHEMA
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.schema import SchemaError, check_event, check_import, check_job, check_wear

log = logging.getLogger(__name__)


BUSY_SECONDS = 10.0  # how long a write waits for a lock another process holds on the ledger (SQLite's busy timeout)
COMPACT_AFTER = 60  # saves logged before one rewrites every GPU's whole record and empties the log


class Summariser(Protocol):
    """What computes a job record's lines (:class:`gpuwear.jobs.lines.Summariser`): the ledger keeps them, under
    ``key`` (the parameters they were computed with), in the ``job_lines`` table, written with the record."""

    key: int

    def __call__(self, job: dict[str, Any]) -> Sequence[tuple[Any, ...]]: ...


class LineSums(NamedTuple):
    """The lines kept under one key in a window (:meth:`Ledger.line_sums`), added up in whole units."""

    by_line: list[tuple[str, str, int, int, int, int]]  # (uuid, line, observed, energy, aging, fatigue)
    by_label: list[tuple[str, int]] | None  # (label, aging); None where not asked for
    records: int  # the job records they belong to
    hottest: tuple[Any, ...] | None  # (peak, start, record, slice, uuid, title) of the hottest line but idle ones


_LINE_COLUMNS = "record, slice, uuid, kind, line, title, observed, energy, aging, fatigue, peak, start, end, key"


def _with_crc(stored: str | bytes) -> tuple[str | bytes, int]:
    """A value to store and the checksum written with it."""
    return stored, _stored_crc(stored)


def _stamp_checksums(db: sqlite3.Connection, grown: set[str]) -> None:
    """Give the rows written before checksums (validated by the open's audit, those that failed set aside) the
    checksums of what they hold: later reads prove them whole. The small tables are looked over each time; of the
    tables that grow (events, jobs), those in ``grown``, where the audit met such rows."""
    tables = [("gpus", "wear"), ("wear_log", "deltas"), ("imports", "wear")]
    if "jobs" in grown:
        tables.append(("jobs", "data"))
    stamps = {table: [(_stored_crc(value), rowid) for rowid, value in db.execute(
        f"SELECT rowid AS row_id, {column} FROM {table} WHERE crc IS NULL")] for table, column in tables}
    if "events" in grown:
        stamps["events"] = [(_event_crc(uuid, float(wall), kind, detail), rowid) for rowid, uuid, wall, kind, detail
                            in db.execute("SELECT rowid AS row_id, uuid, wall, kind, detail FROM events "
                                          "WHERE crc IS NULL")]
    if any(stamps.values()):
        with _transaction(db):
            for table, rows in stamps.items():
                db.executemany(f"UPDATE {table} SET crc = ? WHERE rowid = ?", rows)


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
        self._left_out_rows: set[tuple[str, object]] = set()
        self._refused: set[tuple[Any, ...]] = set()  # records a save left out, said once each
        self._tables: dict[str, bool] = {}  # whether the file has a table of a newer schema (job_lines: 8 on)

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path, recovering: Callable[[], object] | None = None, busy_seconds: float = BUSY_SECONDS,
             ) -> Ledger:
        """Open or create the ledger, every record validated. A record (or a value of a GPU's record) that fails
        validation is set aside (the ``set_aside`` table) and the rest kept; a file SQLite cannot read whole is
        recovered (:func:`recover`: what can still be read, in a new ledger; the damaged file kept beside it),
        ``recovering`` called first (the daemon tells systemd it needs longer to start). ``busy_seconds``: how long
        the open waits for a lock another process holds (later writes wait BUSY_SECONDS).
        Raises :class:`LedgerRefusedError` for a file that is not to be written (:class:`LedgerTooNewError`: a
        ledger of a newer gpuwear; trouble that is not damage SQLite reports), LedgerError for a symbolic link,
        OSError / sqlite3.Error when the directory or the disk stands in the way."""
        private_folder(path.parent)
        finish_recovery(path)  # one a kill interrupted
        _private_file(path)
        db, recovered, bad = cls._open_examined(path, recovering, busy_seconds)
        db.execute(f"PRAGMA busy_timeout={round(BUSY_SECONDS * 1000)}")
        db.execute("PRAGMA wal_autocheckpoint=1000")
        if bad:
            what, why = bad[0].what, bad[0].reason
            first = printable(why if why.startswith(what) else f"{what}: {why}")[:300]
            log.error("ledger %s: set aside %d record(s) that fail validation, the rest of the history kept (%s%s); "
                      "they are kept in its set_aside table", path, len(bad), first,
                      f"; and {len(bad) - 1} more" if len(bad) > 1 else "")
        return cls(path, db, recovered, len(bad))

    @classmethod
    def _open_examined(cls, path: Path, recovering: Callable[[], object] | None, busy_seconds: float,
                       ) -> tuple[sqlite3.Connection, Path | None, list[Any]]:
        """The read-write connection of a ledger examined, migrated and audited, recovered first where damaged:
        (connection, where the damaged file was kept or None, the records set aside)."""
        recovered: Path | None = None
        for attempt in range(2):
            found = _FoundFiles(path)
            try:
                with closing(found.guard()):
                    db = cls._connect(path, busy_seconds)
                    try:
                        docs, bad, unstamped = _audit(db)
                        # damage the audit's reads did not meet (an index page) may answer these writes: recovered
                        if bad:
                            _set_aside(db, docs, bad)
                        _stamp_checksums(db, unstamped)  # rows from before checksums, validated by the audit
                    except BaseException:
                        db.close()
                        raise
                found.drop()
                break
            except BaseException as exc:
                found.put_back()  # the file and its WAL as they were found, whatever the open wrote before it failed
                if isinstance(exc, LedgerRefusedError) or not isinstance(
                        exc, (sqlite3.DatabaseError, LedgerError, UnicodeDecodeError)):  # SQLite's message on a
                    raise  # damaged page can hold the page's own bytes, which are not UTF-8
                if isinstance(exc, sqlite3.Error) and environment_error(exc):
                    raise  # the disk or the directory, not the file: kept as it is, retried by the caller
                if not damaged(exc) or attempt:  # an error of ours, or a file recovery did not mend: never rewritten
                    why = "still damaged once recovered" if attempt else "not recovered (not damage SQLite reports)"
                    raise LedgerRefusedError(f"{path}: {printable(str(exc))[:300]}: {why}; the file is kept as it "
                                             "is") from exc
                if recovering is not None:
                    recovering()
                log.warning("ledger %s is damaged (%s): copying what SQLite can still read into a new ledger (two "
                            "passes; progress every %g s)", path, printable(str(exc))[:300], RECOVERY_SAY_SECONDS)
                from gpuwear.ledger.recovery import recover  # loaded for damage only

                recovered = recover(path, exc, _RecoveryProgress(path).said)
        return db, recovered, bad

    @staticmethod
    def _connect(path: Path, busy_seconds: float = BUSY_SECONDS) -> sqlite3.Connection:
        if path.exists() and path.stat().st_size:
            _examine(path)
        db = sqlite3.connect(path, timeout=busy_seconds, isolation_level=None, check_same_thread=False)
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
            # no checkpoint while the file is examined (Ledger.open sets it back): one would write the WAL's frames
            # into a file that may yet prove damaged, and recovery keeps the damaged file byte for byte
            db.execute("PRAGMA wal_autocheckpoint=0")
            db.execute("PRAGMA synchronous=FULL")
            # a 256 KiB page cache, not the default 2 MiB: the ledger is written once a minute and read at start,
            # and the default cache grew the daemon's RSS by 2 MiB over its first week as the file grew
            db.execute("PRAGMA cache_size=-256")
            if version is None:
                db.executescript(_SCHEMA)
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            found_at = version  # the file's schema as found
            while version is not None and version < SCHEMA_VERSION:
                if version not in _MIGRATIONS:
                    raise LedgerRefusedError(f"{path}: no migration from ledger schema {version}")
                db.execute("BEGIN IMMEDIATE")
                _MIGRATIONS[version](db)
                version += 1
                db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(version),))
                db.execute("COMMIT")
            present = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if missing := sorted(set(_tables()) - present):  # dropped, or a derived table of a later release
                add_missing_tables(db, missing)
                if found_at is not None and found_at < SCHEMA_VERSION:  # an older release's file: tables it never had
                    log.info("ledger %s (schema %d) migrated: %s table(s) added", path, found_at, ", ".join(missing))
                elif lost := [m for m in missing if m not in DERIVED]:  # nothing of them is left to lose
                    log.error("ledger %s had no %s table: created empty, the rest of the history kept", path,
                              ", ".join(lost))
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
        companions = [Path(f"{path}{suffix}") for suffix in ("-wal", "-shm")]
        absent = [c for c in companions if not c.exists()]  # SQLite makes them to read a WAL file, even read-only
        db = None
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0, isolation_level=None)
            db.text_factory = _text
            db.execute("PRAGMA cache_size=-256")  # as the daemon's own: the page at / reads through one of these
            version = _schema_version(db)
            if version is None or version > SCHEMA_VERSION:
                raise (LedgerTooNewError(_too_new(path, db, version)) if version is not None else
                       LedgerError(f"{path}: not a gpuwear ledger this version can read (no schema version)"))
        except (sqlite3.DatabaseError, UnicodeDecodeError, LedgerError) as exc:
            if db is not None:
                db.close()
            _remove_empty_wal(absent)  # a refused file is left as it was found, without companions of ours
            if isinstance(exc, LedgerError):
                raise
            raise LedgerError(f"{path}: not a readable gpuwear ledger ({exc})") from None
        # no pass over the whole history: each read proves what it reads (checksums, validation)
        return cls(path, db)

    def close(self) -> None:
        self._db.close()

    # -- reading ------------------------------------------------------------------------

    def load(self, gate_celsius: float) -> dict[str, GpuWear]:
        """Every GPU's accumulators, by UUID; a record that fails its checksum or its validation is left out and said
        in :attr:`left_out`."""
        docs, bad = _read_docs_leaving_out(self._db)
        for b in bad:
            self._leave_out((b.table, b.rowid), b.reason)
        out = {}
        for uuid, doc in sorted(docs.items()):
            try:
                out[uuid] = GpuWear.from_json(_checked(doc, f"GPU {uuid}"), gate_celsius)
            except LedgerError as exc:
                self._leave_out(("gpus", uuid), str(exc))
        return out

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
        query = ("SELECT id, uuid, wall, kind, detail, crc FROM events WHERE (? IS NULL OR uuid = ?) AND wall >= ? "
                 "ORDER BY id DESC LIMIT ?")
        rows = self._db.execute(query, (uuid, uuid, since if since is not None else float("-inf"),
                                        -1 if last is None else last)).fetchall()
        out = []
        for rowid, u, w, k, d, crc in reversed(rows):
            problem = _event_problem(u, w, k, d, crc)
            if problem:
                self._leave_out(("events", rowid), f"an event of GPU {printable(str(u))[:80]!r}: {problem}")
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
        by_gpu: dict[str, list[GpuWear]] = {}
        for _, uuid, _, _, _, wear in self._imports("SELECT rowid AS row_id, uuid, source, first, last, wear, {crc} "
                                                    "FROM imports ORDER BY first"):
            by_gpu.setdefault(uuid, []).append(GpuWear.from_json(wear, gate_celsius))
        return {uuid: GpuWear.merged_all(GpuWear(uuid, gate_celsius=gate_celsius), imports)
                for uuid, imports in by_gpu.items()}

    def _imports(self, query: str, params: tuple[Any, ...] = ()) -> Iterator[tuple[int, str, str, float, float,
                                                                                   dict[str, Any]]]:
        """The import rows ``query`` selects (rowid, uuid, source, first, last, wear and ``{crc}``, its checksum),
        each proved whole by its checksum (what a save writes is validated first), validated where it has none; one
        that is not is left out and said in :attr:`left_out`."""
        for rowid, uuid, source, first, last, text, crc in self._db.execute(
                query.format(crc=_crc_of(self._db, "imports")), params):
            try:
                where = f"import of GPU {uuid!r}"
                if changed(text, crc):
                    raise LedgerError(f"{where}: {CHANGED}")
                yield rowid, uuid, source, first, last, _json_object(text, where) if crc is not None else \
                    _wear(text, where)
            except LedgerError as exc:
                self._leave_out(("imports", rowid), str(exc))

    def export(self, uuid: str, simulated: bool = False, host: str = "") -> dict[str, Any]:
        """One GPU's history as a document another box's ledger can import (:func:`gpuwear.ledger.export.document`),
        ``host`` the name of this box; LedgerError when the ledger holds nothing of it."""
        from gpuwear.ledger import export  # the export command's alone

        return export.document(self._db, self.path, uuid, self.events(uuid), simulated, host)

    def imports_of(self, uuid: str) -> list[tuple[str, float, float]]:
        """The imported parts of a GPU's history: (source, first, last), the oldest first. Their source names the
        export file and, from export version 3, the box it came from."""
        return sorted((str(source), float(first), float(last)) for source, first, last in self._db.execute(
            "SELECT source, first, last FROM imports WHERE uuid = ?", (uuid,)))

    def forget(self, uuid: str) -> dict[str, int]:
        """Remove every record of one GPU in one transaction: its live record, its imports, its events and its share of
        each job (a job left with no GPU goes). The wear log is folded into the records first: its rows name GPUs.
        Returns what was removed, by kind; LedgerError when the ledger holds nothing of that GPU. The job records read
        are that GPU's (by the lines kept) and those without kept lines, not every one."""
        docs = _read_docs(self._db)
        imports = self._db.execute("SELECT count(*) FROM imports WHERE uuid = ?", (uuid,)).fetchone()[0]
        if uuid not in docs and not imports:
            raise LedgerError(f"{self.path}: no GPU {uuid}")
        removed = {"records": int(uuid in docs), "imports": imports, "events": 0, "jobs": 0}
        with self._transaction() as db:
            for u, d in docs.items():
                if u != uuid:
                    db.execute("UPDATE gpus SET wear = ?, crc = ? WHERE uuid = ?",
                               (*_with_crc(json.dumps(d, separators=(",", ":"))), u))
            db.execute("DELETE FROM wear_log")
            db.execute("DELETE FROM gpus WHERE uuid = ?", (uuid,))
            db.execute("DELETE FROM imports WHERE uuid = ?", (uuid,))
            removed["events"] = db.execute("DELETE FROM events WHERE uuid = ?", (uuid,)).rowcount
            for record, data in db.execute(self._jobs_of_sql(), (uuid,) if self._has("job_lines") else ()).fetchall():
                job = _json_object(_job_text(data, f"job {record!r}"), f"job {record!r}")
                gpus = [g for g in job.get("gpus", []) if g.get("uuid") != uuid]
                if len(gpus) == len(job.get("gpus", [])):
                    continue
                removed["jobs"] += 1
                if self._has("job_lines"):  # counted from the record again until the daemon keeps them anew
                    db.execute("DELETE FROM job_lines WHERE record = ?", (record,))
                if gpus:
                    blob = _job_blob(json.dumps({**job, "gpus": gpus}, separators=(",", ":")))
                    db.execute("UPDATE jobs SET data = ?, crc = ? WHERE record = ?", (blob, zlib.crc32(blob), record))
                else:
                    db.execute("DELETE FROM jobs WHERE record = ?", (record,))
        self._saved = None  # what is committed changed under the save cache
        return removed

    def _jobs_of_sql(self) -> str:
        """The job records :meth:`forget` reads for one GPU (its UUID the one parameter): those whose kept lines name
        it, and those without lines (a running job, one not indexed yet): a record's lines come whole, so one with
        lines and none of that GPU's does not hold it. A ledger without lines: every record."""
        if not self._has("job_lines"):
            return "SELECT record, data FROM jobs"
        return ("SELECT record, data FROM jobs WHERE record IN (SELECT record FROM job_lines WHERE uuid = ?) OR "
                "NOT EXISTS (SELECT 1 FROM job_lines l WHERE l.record = jobs.record)")

    def load_all(self, gate_celsius: float, live: dict[str, GpuWear] | None = None) -> dict[str, GpuWear]:
        """Live and imported history merged, by UUID (what a report shows); ``live``: :meth:`load`'s answer, where
        the caller has it already (left as it is)."""
        every = dict(self.load(gate_celsius) if live is None else live)
        for uuid, imported in self.load_imported(gate_celsius).items():
            every[uuid] = every[uuid].merged(imported) if uuid in every else imported
        return every

    # -- writing ------------------------------------------------------------------------

    def import_periods(self, since: float | None = None) -> list[dict[str, Any]]:
        """Each import that reaches past ``since`` as a period shaped like a job record (kind "imported", id the
        source file), so that `gpuwear jobs` lists imported history beside the jobs and idle lines."""
        out = []
        rows = self._imports("SELECT rowid AS row_id, uuid, source, first, last, wear, {crc} FROM imports "
                             "WHERE last >= ? ORDER BY first DESC", (since if since is not None else float("-inf"),))
        for rowid, uuid, source, first, last, wear in rows:
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
        return self._jobs_where("(? = 0 OR end IS NULL)", (int(running_only),), since)

    def _jobs_where(self, condition: str, params: tuple[Any, ...], since: float | None) -> Iterator[dict[str, Any]]:
        rows = self._db.execute(f"SELECT record, data, crc FROM jobs WHERE (end IS NULL OR end >= ?) AND {condition} "
                                "ORDER BY start DESC", (_since(since), *params))
        for record, data, crc in rows:
            problem = _job_problem(data, crc)
            if problem:
                self._leave_out(("jobs", record), f"job {printable(str(record))[:80]!r}: {problem}")
                continue
            yield json.loads(_job_text(data, f"job {record!r}"))

    # -- job lines (gpuwear.jobs.lines): what listings total, kept as each record is saved ----------------------

    def reading(self) -> AbstractContextManager[None]:
        """One snapshot for the reads in the block (a read transaction): the sums, the records without lines and
        the records shown agree although the daemon saves meanwhile."""
        return _reading(self._db)

    def line_sums(self, key: int, since: float | None = None, uuid: str | None = None,
                  by_label: bool = True) -> LineSums:
        """The lines kept under ``key`` of the job records in the window (ended after ``since`` or running; of one
        GPU where ``uuid`` is given), added up by GPU and line name, by label (``by_label``), their number of records
        and the hottest of them: what a listing totals, without reading a record (every retained line, ``since``
        None: the totals the triggers keep, ``line_totals``). The records whose lines are not kept under ``key``
        are :meth:`unsummarised`."""
        if not self._has("job_lines"):
            return LineSums([], [] if by_label else None, 0, None)
        where = "key = ? AND (end IS NULL OR end >= ?) AND (? IS NULL OR uuid = ?)"
        params = (key, _since(since), uuid, uuid)
        db = self._db
        if since is None and self._has("line_totals"):  # every retained line: their totals, kept as lines come and go
            groups = db.execute("SELECT uuid, line, observed, energy, aging, fatigue, lines, firsts FROM line_totals "
                                "WHERE key = ? AND (? IS NULL OR uuid = ?)", (key, uuid, uuid)).fetchall()
        else:
            groups = db.execute("SELECT uuid, line, sum(observed), sum(energy), sum(aging), sum(fatigue), "
                                f"count(*), sum(slice = 0) FROM job_lines WHERE {where} GROUP BY uuid, line",
                                params).fetchall()
        by_line = [row[:6] for row in groups]
        # a record's lines are its GPUs, each once, numbered from 0: its lines of one GPU, or its line 0, count it
        records = sum(row[6] if uuid is not None else row[7] for row in groups)
        # gpuwear.jobs.lines.label(): idle and imported lines by their kind, a job's by its title
        labels = db.execute("SELECT CASE WHEN kind IN ('idle', 'imported') THEN kind ELSE title END AS label, "
                            f"sum(aging) FROM job_lines WHERE {where} GROUP BY label", params).fetchall() \
            if by_label else None
        hottest = db.execute(f"SELECT peak, start, record, slice, uuid, title FROM job_lines WHERE {where} AND "
                             "kind != 'idle' AND peak IS NOT NULL AND peak != 0 "
                             "ORDER BY peak DESC, start DESC, record DESC, slice LIMIT 1", params).fetchone()
        return LineSums(by_line, labels, records, hottest)

    def clean_runs(self, names: Iterable[str], since: float, key: int) -> dict[str, dict[str, int]]:
        """Per line name (a job's name, its first 18 characters: jobs.lines.line_name) among ``names``, per GPU, how
        many of its runs that ended after ``since`` raised no XID on that GPU while they ran (no "xid" event between
        the run's start and end): from the lines kept under ``key`` and the events' index, never a read of a record.
        Idle, imported and unattributed lines are no application's."""
        wanted = sorted({name[:18] for name in names})
        if not wanted or not self._has("job_lines"):
            return {}
        rows = self._db.execute(
            "SELECT l.line, l.uuid, count(*) FROM job_lines l WHERE l.key = ? AND l.end IS NOT NULL AND l.end >= ? "
            "AND l.kind NOT IN ('idle', 'imported', 'unattributed') "
            f"AND l.line IN ({', '.join('?' * len(wanted))}) AND NOT EXISTS (SELECT 1 FROM events e WHERE "
            "e.uuid = l.uuid AND e.wall >= l.start AND e.wall <= l.end AND e.kind = 'xid') GROUP BY l.line, l.uuid",
            (key, since, *wanted)).fetchall()
        out: dict[str, dict[str, int]] = {}
        for line, uuid, n in rows:
            out.setdefault(str(line), {})[str(uuid)] = int(n)
        return out

    def unsummarised(self, key: int, since: float | None = None, kept: int | None = None,
                     ended: bool = False) -> Iterator[dict[str, Any]]:
        """The job records in the window (as :meth:`iter_jobs`) that have no line kept under ``key``: saved before
        lines were kept, by a reader of other wear parameters, or not yet filled (:meth:`fill_lines`). ``kept``: the
        records with lines in the window, where the caller counted them (:meth:`line_sums` of every GPU). ``ended``:
        only records that ended (a running job's lines are kept once it ends)."""
        if not self._has("job_lines"):
            return self._jobs_where("(? = 0 OR end IS NOT NULL)", (int(ended),), since)
        if not self.unsummarised_count(key, since, kept):  # each record's line 0 is kept (lines come whole with
            return iter(())  # their record): none to count
        # (a running job's record: counted from itself, once or twice per GPU; the lookup below finds it)
        # "+l.key": the lookup by record (the primary key), never a scan of the key's lines for each record
        return self._jobs_where("(? = 0 OR end IS NOT NULL) AND NOT EXISTS (SELECT 1 FROM job_lines l WHERE "
                                "l.record = jobs.record AND +l.key = ?)", (int(ended), key), since)

    def unsummarised_count(self, key: int, since: float | None = None, kept: int | None = None) -> int:
        """How many job records in the window :meth:`unsummarised` gives (running or ended), from two counts: never
        a read of the records. ``kept`` as there."""
        window = (_since(since),)
        every = self._db.execute("SELECT count(*) FROM jobs WHERE end IS NULL OR end >= ?", window).fetchone()[0]
        if not self._has("job_lines"):
            return int(every)
        if kept is None:
            kept = self._db.execute("SELECT count(*) FROM job_lines WHERE key = ? AND (end IS NULL OR end >= ?) AND "
                                    "slice = 0", (key, *window)).fetchone()[0]
        return max(0, int(every) - int(kept))

    def fill_lines(self, summarise: Summariser, limit: int) -> int:
        """Keep the lines of up to ``limit`` ended job records that have none under ``summarise.key``, newest first,
        in one transaction; returns how many records it summarised (0: none is left)."""
        with self.reading():
            records = list(itertools.islice(self.unsummarised(summarise.key, ended=True), max(0, limit)))
        if not records:
            return 0
        summaries = [(job, self._lines_of(summarise, job)) for job in records]
        with self._transaction() as db:
            for job, lines in summaries:
                _write_lines(db, job, lines, summarise.key)
        return len(records)

    def verify_lines(self) -> int:
        """Check the kept lines against what was written: their table and its indexes against each other (SQLite's
        integrity_check of the table: the listings read figures from an index) and each line against its checksum.
        Lines that fail are dropped, whole records' at a time (every line where the table fails), to be counted from
        their records and kept again (:meth:`fill_lines`). Returns the records whose lines were dropped; run by the
        daemon once a start, after it serves (a pass over every line)."""
        if not self._has("job_lines"):
            return 0
        ok = self._db.execute("PRAGMA integrity_check(job_lines)").fetchone()
        if not ok or ok[0] != "ok":
            with self._transaction() as db:
                records = db.execute("SELECT count(DISTINCT record) FROM job_lines").fetchone()[0]
                db.execute("DELETE FROM job_lines")
            return int(records)
        bad = {row[0] for row in self._db.execute(f"SELECT {_LINE_COLUMNS}, crc FROM job_lines")
               if _line_crc(row[:-1]) != row[-1]}
        if bad:
            with self._transaction() as db:
                db.executemany("DELETE FROM job_lines WHERE record = ?", [(record,) for record in bad])
        if self._has("line_totals"):  # and the totals the triggers keep, against the lines added up afresh
            recount = LINE_RECOUNT
            if sorted(self._db.execute(recount)) != sorted(self._db.execute("SELECT * FROM line_totals")):
                with self._transaction() as db:
                    db.execute("DELETE FROM line_totals")
                    db.execute(f"INSERT INTO line_totals {recount}")
                log.warning("ledger %s: the totals of the kept lines were not their sum: added up again", self.path)
        return len(bad)

    def _lines_of(self, summarise: Summariser, job: dict[str, Any]) -> Sequence[tuple[Any, ...]] | None:
        """A job record's lines; None (none kept: readers compute them from the record) where computing them
        raised, said once in the log."""
        try:
            return summarise(job)
        except Exception as exc:  # an error of ours must not cost the save: the record itself is kept
            if ("lines", job.get("record")) not in self._refused:
                self._refused.add(("lines", job.get("record")))
                log.error("ledger %s: the lines of job %r could not be computed (%s); they are counted from the "
                          "record at each read", self.path, printable(str(job.get("record")))[:80],
                          printable(f"{type(exc).__name__}: {exc}")[:200])
            return None

    def _has(self, table: str) -> bool:
        """Whether the file has ``table`` (a reader may open a ledger of an older schema), asked once."""
        if table not in self._tables:
            self._tables[table] = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                                   (table,)).fetchone() is not None
        return self._tables[table]

    def _leave_out(self, row: tuple[str, object], why: str) -> None:
        """Say a row (table, key) left out by a read: once, however many reads met it."""
        if row not in self._left_out_rows:
            self._left_out_rows.add(row)
            self.left_out.append(printable(why)[:300])

    def imported_as(self, sources: Iterable[str]) -> set[str]:
        """The GPUs whose imports came from any of ``sources`` (the file names an import was given)."""
        names = sorted(set(sources))
        if not names:
            return set()
        marks = ", ".join("?" * len(names))
        return {uuid for (uuid,) in self._db.execute(f"SELECT DISTINCT uuid FROM imports WHERE source IN ({marks})",
                                                     names)}

    def set_aside_of(self, uuid: str) -> tuple[int, tuple[float, str, str] | None]:
        """How many records, or values of its record, of one GPU an open set aside (the ``set_aside`` table: its
        record, events, imports), and the newest of them: (wall, what, why)."""
        if not self._has("set_aside"):
            return 0, None
        name = f"GPU {uuid!r}"
        count = self._db.execute("SELECT count(*) FROM set_aside WHERE instr(what, ?)", (name,)).fetchone()[0]
        newest = self._db.execute("SELECT wall, what, reason FROM set_aside WHERE instr(what, ?) ORDER BY wall DESC "
                                  "LIMIT 1", (name,)).fetchone() if count else None
        return int(count), None if newest is None else (float(newest[0]), str(newest[1]), str(newest[2]))

    def left_out_note(self) -> str | None:
        """What the reads so far left out, in one line for the person reading (None: nothing)."""
        if not self.left_out:
            return None
        more = f" and {len(self.left_out) - 1} more" if len(self.left_out) > 1 else ""
        return (f"{self.path}: {len(self.left_out)} record(s) left out of what is shown ({self.left_out[0]}{more}); "
                "the daemon sets them aside at its next start")

    def periods(self, since: float | None = None,
                imports: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
        """Job records and import periods (:meth:`import_periods`, or ``imports`` where the caller read them
        already) together, newest first, one at a time."""
        return heapq.merge(self.iter_jobs(since), self.import_periods(since) if imports is None else imports,
                           key=lambda r: -r["start"])

    def save(self, wears: Iterable[dict[str, Any]], events: Iterable[Event],
             imports: Iterable[tuple[str, str, float, float, int, dict[str, Any]]] = (),
             jobs: Iterable[dict[str, Any]] = (), forget_jobs_before: float | None = None,
             meta: dict[str, str] | None = None, forget_events_before: float | None = None,
             lines: Summariser | None = None) -> None:
        """Write accumulators (``GpuWear.to_json()`` dicts), events, imports (uuid, source,
        first, last, rows, wear) and job records in one transaction, removing the job records that ended before
        ``forget_jobs_before`` and the events before ``forget_events_before`` (retention: each GPU's own record keeps
        its lifetime figures; the pages they held are given back to the file system once enough are free). Raises
        ``sqlite3.Error`` (disk full, read-only directory) with nothing written; once it has committed it raises
        nothing, so a caller that saves again what failed never writes an event twice. A GPU record, job or event
        that would not read back is left out (said once in the log) and the rest saved; an import that would not
        raises LedgerError with nothing written. ``lines``: each job record's lines are kept with it (else the
        readers count them from the record)."""
        now = time.time()
        if self._saved is None:  # what is committed, to write only what changed
            self._saved = _read_docs(self._db)
            self._log_rows = self._db.execute("SELECT count(*) FROM wear_log").fetchone()[0]
        saved = self._saved
        # a copy as JSON reads it back: to_json() hands out the live accumulators' own maps, which go on changing
        docs = {w["uuid"]: json.loads(json.dumps(_compact(w), separators=(",", ":"))) for w in wears}
        jobs, events, imports = list(jobs), list(events), list(imports)
        # never write what the next open would refuse (and set aside): a GPU record, job or event that would not
        # read back is refused alone, said once, and the rest saved (one card's record over its caps failed every
        # card's save); an import refuses the save (its caller, a command, says so)
        docs = {uuid: doc for uuid, doc in docs.items()
                if self._valid(("gpus", uuid), check_wear, doc, f"GPU {uuid}", WEAR_SCHEMA)}
        jobs = [job for job in jobs
                if self._valid(("jobs", job.get("record")), check_job, job, f"job {job.get('record')!r}")]
        events = [e for e in events if self._valid(("events", e.uuid, e.kind), check_event,
                                                   {"wall": e.wall, "kind": e.kind, "detail": e.detail},
                                                   f"event of {e.uuid}")]
        try:
            for uuid, _, first, last, rows, wear in imports:
                check_import(uuid, first, last, rows, json.loads(_dump(wear)), WEAR_SCHEMA)
        except SchemaError as exc:
            raise LedgerError(f"refusing to save a record that would not read back: {exc}") from None
        # an ended record's lines (a running job's record is saved again every few minutes: its few lines are
        # counted from it until it ends, rather than written again each time)
        summaries = [(job, self._lines_of(lines, job) if lines is not None and job["end"] is not None else None)
                     for job in jobs]
        compact = self._log_rows >= COMPACT_AFTER
        whole = [d for u, d in docs.items() if compact or u not in saved]
        changed = {u: _diff(saved[u], d) for u, d in docs.items() if not compact and u in saved}
        deltas = {u: d for u, d in changed.items() if d}
        if compact:
            whole += [d for u, d in saved.items() if u not in docs]
        with self._transaction() as db:
            for d in whole:
                db.execute("INSERT INTO gpus (uuid, name, serial, first_seen, last_seen, saved, wear, crc) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO UPDATE SET name = excluded.name, "
                           "serial = excluded.serial, first_seen = excluded.first_seen, "
                           "last_seen = excluded.last_seen, saved = excluded.saved, wear = excluded.wear, "
                           "crc = excluded.crc",
                           (d["uuid"], d.get("name", ""), d.get("serial"), d.get("first_seen"), d.get("last_seen"),
                            now, *_with_crc(json.dumps(d, separators=(",", ":")))))
            if compact:
                db.execute("DELETE FROM wear_log")
            if deltas:  # one row a save: its GPUs' changes compressed together (their keys repeat)
                db.execute("INSERT INTO wear_log (deltas, crc) VALUES (?, ?)",
                           _with_crc(zlib.compress(json.dumps(deltas, separators=(",", ":")).encode(), 6)))
            fields = [(e.uuid, float(e.wall), e.kind, json.dumps(e.detail)) for e in events]
            db.executemany("INSERT INTO events (uuid, wall, kind, detail, crc) VALUES (?, ?, ?, ?, ?)",
                           [(*f, _event_crc(*f)) for f in fields])
            db.executemany("INSERT INTO imports (uuid, source, first, last, rows, imported, wear, crc) "
                           "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(u, src, a, b, n, now, *_with_crc(_dump(w))) for u, src, a, b, n, w in imports])
            blobs = [(j, _job_blob(json.dumps({**j, "gpus": [{**g, "wear": _compact(g["wear"])} for g in j["gpus"]]},
                                              separators=(",", ":")))) for j in jobs]
            db.executemany("INSERT INTO jobs (record, kind, start, end, data, crc) VALUES (?, ?, ?, ?, ?, ?) "
                           "ON CONFLICT (record) DO UPDATE SET end = excluded.end, data = excluded.data, "
                           "crc = excluded.crc",
                           [(j["record"], j["kind"], j["start"], j["end"], blob, zlib.crc32(blob))
                            for j, blob in blobs])
            if self._has("job_lines"):
                for job, summary in summaries:
                    _write_lines(db, job, summary, lines.key if lines is not None else 0)
            retention.prune(db, forget_jobs_before, forget_events_before)
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

    def _valid(self, key: tuple[Any, ...], check: Callable[..., object], *args: Any) -> bool:
        """Whether a record to save passes ``check(*args)``; one that does not is left out of the save and said in
        the log, once for each ``key`` (a GPU's record, a job, a kind of event), however many saves refuse it."""
        try:
            check(*args)
            return True
        except SchemaError as exc:
            if key not in self._refused:
                self._refused.add(key)
                log.error("ledger %s: not saving a record that would not read back (%s); the rest is saved",
                          self.path, printable(str(exc))[:300])
            return False

    def _give_back_pages(self) -> None:
        retention.give_back_pages(self._db)

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return _transaction(self._db)


class _FoundFiles:
    """A ledger's files as the daemon's open found them, put back if the open fails: the file, which a read-only
    connection held meanwhile (:meth:`guard`) keeps from being checkpointed into, and its WAL, copied aside first
    (the open's writes append to it). Recovery keeps a damaged ledger byte for byte, and damage can answer a write
    of the open's (an index page that no read before met)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.wal = Path(f"{path}-wal")
        self.copy = Path(f"{path}-wal.found")
        self.had_wal = self.wal.exists()
        if self.had_wal:
            try:
                shutil.copyfile(self.wal, self.copy)
            except OSError:  # a full disk: nothing half-copied left behind, and the open refused (retried later)
                self.copy.unlink(missing_ok=True)
                raise

    def guard(self) -> sqlite3.Connection:
        """A read-only connection to hold while the daemon's connection examines, migrates and audits: the last
        connection to close a WAL database checkpoints it, and a read-only one cannot."""
        if self.path.exists():
            try:
                guard = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10.0, isolation_level=None)
                guard.execute("PRAGMA user_version").fetchone()  # a read: the file and its WAL opened, and held
                return guard
            except sqlite3.Error:
                pass
        return sqlite3.connect(":memory:")

    def put_back(self) -> None:
        """The WAL as it was found (none where there was none), every connection to the file closed; the index of
        the WAL (-shm) goes, made again from the WAL by the next connection."""
        if self.had_wal:
            os.replace(self.copy, self.wal)
        else:
            self.wal.unlink(missing_ok=True)
        Path(f"{self.path}-shm").unlink(missing_ok=True)

    def drop(self) -> None:
        self.copy.unlink(missing_ok=True)


RECOVERY_SAY_SECONDS = 10.0  # a recovery under way says how far it got this often


class _RecoveryProgress:
    """A recovery's progress in the log: the rows its pass holds, at most once every RECOVERY_SAY_SECONDS."""

    def __init__(self, path: Path, every: float = RECOVERY_SAY_SECONDS) -> None:
        self.path, self.every, self.began, self.last = path, every, time.monotonic(), time.monotonic()

    def said(self, rows: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            log.warning("ledger %s: recovering, %d rows copied in this pass after %.0f s", self.path, rows,
                        now - self.began)


def _remove_empty_wal(made: list[Path]) -> None:
    """Remove the -wal and -shm files a read-only open made (``made``: those absent before it), where it made both
    and the -wal holds nothing: no writer has come to use them."""
    if len(made) < 2 or any(c.name.endswith("-wal") and c.exists() and c.stat().st_size for c in made):
        return
    for c in made:
        with suppress(FileNotFoundError):
            c.unlink()


def _since(since: float | None) -> float:
    return since if since is not None else float("-inf")


@contextmanager
def _reading(db: sqlite3.Connection) -> Iterator[None]:
    """A read transaction (one snapshot of a WAL database); nested in another transaction, that one's."""
    if db.in_transaction:
        yield
        return
    db.execute("BEGIN")
    try:
        yield
    finally:
        if db.in_transaction:
            db.execute("COMMIT")


def _write_lines(db: sqlite3.Connection, job: dict[str, Any], lines: Sequence[tuple[Any, ...]] | None,
                 key: int) -> None:
    """Replace a job record's lines in ``db`` (a transaction of the caller's); None: none kept."""
    db.execute("DELETE FROM job_lines WHERE record = ?", (job["record"],))
    if lines:
        rows = [(job["record"], *line, job["start"], job["end"], key) for line in lines]
        db.executemany(f"INSERT INTO job_lines ({_LINE_COLUMNS}, crc) VALUES ({', '.join('?' * 15)})",
                       [(*row, _line_crc(row)) for row in rows])


def _line_crc(row: Sequence[Any]) -> int:
    """The checksum of a kept line's values (_LINE_COLUMNS, in order), as written and as read back."""
    return zlib.crc32(json.dumps(list(row), separators=(",", ":")).encode())
