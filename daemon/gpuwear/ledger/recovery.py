"""A ledger file SQLite reports damaged (SQLITE_CORRUPT, SQLITE_NOTADB, a failed quick_check, bytes that are not
text) is recovered: every row SQLite can still read goes into a new ledger, rowid by rowid past damage, the pass
that keeps every GPU's lifetime record preferred; the damaged file and its WAL are kept beside it byte for byte
(they are examined read-only: a read-write connection would checkpoint the WAL into them). A kill at any instant
leaves the damaged ledger or the new one (:func:`finish_recovery`); a full disk leaves the damaged one as it was.
Anything else (:func:`damaged` is False) is never recovered, and a ledger of a newer schema never rewritten.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuwear import __version__
from gpuwear.ledger.errors import LedgerDamagedError, LedgerTooNewError, _text, printable
from gpuwear.ledger.schema import _SCHEMA, DERIVED, PAGE_SIZE, SCHEMA_VERSION, _schema_version, _tables, _too_new

log = logging.getLogger(__name__)


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
                    if table in present and table not in DERIVED:  # computed again from what is recovered
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
