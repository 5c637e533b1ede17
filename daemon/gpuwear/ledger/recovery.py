"""A ledger file SQLite reports damaged (SQLITE_CORRUPT, SQLITE_NOTADB, a failed quick_check, bytes that are not
text) is recovered: every row SQLite can still read goes into a new ledger, rowid by rowid past damage, the pass
that keeps every GPU's lifetime record preferred; the damaged file and its WAL are kept beside it byte for byte
(they are examined read-only: a read-write connection would checkpoint the WAL into them). A kill at any instant
leaves the damaged ledger or the new one (:func:`finish_recovery`), and a kill in mid-copy is resumed where the
last commit left it (each pass commits its rows as it goes, with its progress, under a digest of the damaged files:
a pass of other files is begun again); a full disk leaves the damaged one as it was. Anything else
(:func:`damaged` is False) is never recovered, and a ledger of a newer schema never rewritten.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from gpuwear import __version__
from gpuwear.ledger.damage import RECOVERED, RECOVERING, SCRATCH, _fsync, finish_recovery
from gpuwear.ledger.errors import LedgerTooNewError, _text, printable
from gpuwear.ledger.schema import _SCHEMA, DERIVED, PAGE_SIZE, SCHEMA_VERSION, _tables

log = logging.getLogger(__name__)


# -- recovery of a file SQLite cannot read whole ------------------------------------------------------------------



def recover(path: Path, exc: BaseException, progress: Callable[[int], object] | None = None,
            commit_seconds: float = 1.0) -> Path:
    """Copy what SQLite can still read of a damaged ledger, row by row, into a new ledger that replaces it; the
    damaged file (and its WAL) is kept beside it, named ``ledger.sqlite.damaged-TIME``, which is returned. A kill
    at any instant leaves the damaged ledger in place (recovered again at the next open, each pass resumed from its
    last commit) or the new one complete (:func:`finish_recovery` ends an interrupted swap). ``progress``: called
    with the rows the pass holds at each commit (every ``commit_seconds``)."""
    kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    work = path.with_name(path.name + RECOVERING)
    scratch = path.with_name(path.name + SCRATCH)
    trials = [path.with_name(f"{path.name}{RECOVERING}-{n}") for n in (0, 1)]
    for leftover in (work, Path(f"{work}-journal"), *(Path(f"{scratch}{x}") for x in ("", "-wal", "-shm"))):
        leftover.unlink(missing_ok=True)  # (work: the name a recovery before resumable passes wrote under)
    try:
        digest = _digest(path)
        _schema_repaired_copy(path, scratch)
        if (version := _readable_version(scratch)) is not None and version > SCHEMA_VERSION:
            raise LedgerTooNewError(f"{path}: damaged, and written by a newer gpuwear (ledger schema {version}); "
                                    f"this gpuwear {__version__} reads schema {SCHEMA_VERSION} and older: upgrade "
                                    "gpuwear (the ledger is kept as it is, never replaced)")
        passes = [_copy_readable(scratch, trial, kept.name, lenient, f"{digest}:{int(lenient)}", commit_seconds,
                                 progress) for lenient, trial in zip((False, True), trials, strict=True)]
        best = 1 if _kept_more(passes[1], passes[0]) else 0  # the reading that keeps more rows; the first, in a tie
        counts = passes[best]
        with closing(sqlite3.connect(trials[best], isolation_level=None)) as db:
            db.execute("DROP TABLE IF EXISTS recovery_state")
    except BaseException:  # a full disk, say: the damaged ledger stays as it was, recovered afresh at a later start
        for leftover in (work, *trials):
            for suffix in ("", "-journal"):
                Path(f"{leftover}{suffix}").unlink(missing_ok=True)
        raise
    finally:
        for leftover in (Path(f"{scratch}{x}") for x in ("", "-wal", "-shm")):
            leftover.unlink(missing_ok=True)
    _fsync(trials[best])
    os.replace(trials[best], path.with_name(path.name + RECOVERED))
    trials[1 - best].unlink(missing_ok=True)
    _fsync(path.parent)
    finish_recovery(path)
    log.error("ledger %s is damaged (%s): recovered what SQLite could still read into a new ledger (%s) and kept "
              "the damaged file as %s", path, printable(str(exc))[:300],
              ", ".join(f"{n} {table}" for table, n in counts.items() if table != "meta")
              if any(counts.values()) else "nothing readable",
              kept)
    return kept


def _digest(path: Path) -> str:
    """What a recovery pass is of: a digest of the damaged file and its WAL (a pass of other bytes is not resumed; no
    WAL reads as an empty one, which SQLite deletes when its last connection closes)."""
    h = hashlib.blake2b(digest_size=16)
    for suffix in ("", "-wal"):
        h.update(suffix.encode() + b"\0")
        try:
            with open(f"{path}{suffix}", "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        except FileNotFoundError:
            pass
    return h.hexdigest()


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


class _Pass:
    """A recovery pass's writes to its new ledger, committed as they go (every ``seconds``) with what is done, so a
    kill costs the rows since the last commit, not the pass."""

    def __init__(self, out: sqlite3.Connection, seconds: float, progress: Callable[[int], object] | None) -> None:
        self.out, self.seconds, self.progress = out, seconds, progress
        self.rows = 0
        self.since = time.monotonic()

    def wrote(self, rows: int) -> None:
        self.rows += rows
        if time.monotonic() - self.since >= self.seconds:
            self.commit()

    def commit(self, done: str | None = None) -> None:
        if done is not None:
            self.out.execute("INSERT OR REPLACE INTO recovery_state VALUES ('done:' || ?, '1')", (done,))
        self.out.execute("COMMIT")
        self.out.execute("BEGIN")
        self.since = time.monotonic()
        if self.progress is not None:
            self.progress(self.rows)


def _copy_readable(src: Path, dst: Path, kept: str, lenient: bool, of: str = "", commit_seconds: float = 1.0,
                   progress: Callable[[int], object] | None = None) -> dict[str, int]:
    """Every row SQLite can still read of the known tables of ``src`` into a new ledger at ``dst``, rowids kept
    (events and wear log rows are read in id order); rows it cannot read are stepped over. ``lenient``: the schema
    read with ``writable_schema`` (a damaged entry passed over rather than failing every query; some damage reads
    better one way, some the other). ``of``: what the pass copies (:func:`_digest`): a ``dst`` left by a pass of the
    same, killed, is resumed after its last commit (each table done is skipped; the one it was in goes on after its
    greatest rowid); any other ``dst`` is begun again. Returns the rows each table holds in ``dst``."""
    if _state(dst).get("of") != of:
        for suffix in ("", "-journal"):
            Path(f"{dst}{suffix}").unlink(missing_ok=True)
    out = sqlite3.connect(dst, isolation_level=None)  # (a journal left by a kill is rolled back here)
    counts: dict[str, int] = {}
    try:
        out.execute(f"PRAGMA page_size={PAGE_SIZE}")
        out.execute("PRAGMA auto_vacuum=INCREMENTAL")
        out.executescript(_SCHEMA)
        out.execute("CREATE TABLE IF NOT EXISTS recovery_state (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        out.execute("INSERT OR REPLACE INTO recovery_state VALUES ('of', ?)", (of,))
        state = dict(out.execute("SELECT key, value FROM recovery_state").fetchall())
        tables = [t for t in _tables() if t not in DERIVED]  # derived ones are computed again from what is recovered
        if "done:pass" not in state:
            writes = _Pass(out, commit_seconds, progress)
            writes.rows = sum(out.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables)  # resumed
            out.execute("BEGIN")
            _copy_tables(src, out, tables, lenient, state, writes)
            out.execute("DELETE FROM meta WHERE key IN ('schema_version', 'recovered_from')")
            out.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            out.execute("INSERT INTO meta VALUES ('recovered_from', ?)", (kept,))
            writes.commit("pass")
            out.execute("COMMIT")
        # what was read: not the two rows of meta a recovery writes
        counts = {t: out.execute(f"SELECT count(*) FROM {t}" + (" WHERE key NOT IN ('schema_version', "
                                 "'recovered_from')" if t == "meta" else "")).fetchone()[0] for t in tables}
    finally:
        out.close()
    return counts


def _state(dst: Path) -> dict[str, str]:
    """What a pass left in ``dst`` (nothing: none, or not a pass's file)."""
    if not dst.exists():
        return {}
    try:
        with closing(sqlite3.connect(f"file:{dst}?mode=ro", uri=True)) as db:
            return dict(db.execute("SELECT key, value FROM recovery_state").fetchall())
    except sqlite3.Error:  # (a hot journal needs a write to roll back: the read-write open does it, if resumed)
        try:
            with closing(sqlite3.connect(dst)) as db:
                return dict(db.execute("SELECT key, value FROM recovery_state").fetchall())
        except sqlite3.Error:
            return {}


def _copy_tables(src: Path, out: sqlite3.Connection, tables: list[str], lenient: bool, state: dict[str, str],
                 writes: _Pass) -> None:
    try:
        source: sqlite3.Connection | None = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error:
        source = None
    if source is None:
        return
    source.text_factory = _text
    if lenient:
        try:
            source.execute("PRAGMA writable_schema=ON")  # schema entries that do not parse are passed over
        except (sqlite3.DatabaseError, UnicodeDecodeError):
            pass
    try:
        try:
            present = {name for (name,) in source.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except (sqlite3.DatabaseError, UnicodeDecodeError):  # its pages damaged: each table is tried
            present = set(_tables())
        for table in tables:
            if table in present and f"done:{table}" not in state:
                columns = _tables()[table][1]
                try:  # a ledger of an older schema lacks some (the checksums: read as none)
                    have = {row[1] for row in source.execute(f"PRAGMA table_info({table})")}
                except (sqlite3.DatabaseError, UnicodeDecodeError):
                    have = set(columns)
                after = out.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]  # resumed: past what it holds
                _copy_rows(source, out, table, tuple(c for c in columns if c in have), writes,
                           after if isinstance(after, int) else -(1 << 63))
            writes.commit(table)
    finally:
        source.close()


def _copy_rows(source: sqlite3.Connection, out: sqlite3.Connection, table: str, columns: tuple[str, ...],
               writes: _Pass, after: int) -> None:
    """Copy a table's readable rows in rowid order: in batches while SQLite reads them; past damage, rowid by rowid
    (a point lookup reaches a row whose neighbours' pages are damaged), then by growing steps where nothing reads."""
    try:
        source.execute(f"SELECT rowid FROM {table} LIMIT 0").fetchall()
    except (sqlite3.DatabaseError, UnicodeDecodeError):  # no such table, a schema SQLite cannot parse, a root page
        return  # it cannot read: no query of this table can succeed on this connection (the other pass may read it)
    names = ", ".join(columns)
    batch = f"SELECT rowid AS row_id, {names} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT 256"
    point = f"SELECT rowid AS row_id, {names} FROM {table} WHERE rowid = ?"
    insert = f"INSERT OR IGNORE INTO {table} (rowid, {names}) VALUES ({', '.join('?' * (len(columns) + 1))})"
    try:
        last = source.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
    except (sqlite3.DatabaseError, UnicodeDecodeError):
        last = None
    step, seen = 1, max(0, after)
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
            found, written, start = 0, 0, max(after, 0)
            for rowid in range(start + 1, start + POINT_LOOKUPS + 1):
                try:
                    rows = source.execute(point, (rowid,)).fetchall()
                except (sqlite3.DatabaseError, UnicodeDecodeError):
                    continue
                for row in rows:
                    written += _insert(out, insert, row)
                    found, seen = found + 1, rowid
            after = start + POINT_LOOKUPS
            writes.wrote(written)
            if not found:  # nothing readable in that stretch: step further each time
                after, step = min(after + step, (1 << 63) - 1), min(step * 2, 1 << 40)
            continue
        writes.wrote(sum(_insert(out, insert, row) for row in rows))
        after, step = rows[-1][0], 1
        seen = max(seen, after)


POINT_LOOKUPS = 2048  # rowids looked up one by one past damage before reading in batches again


def _insert(out: sqlite3.Connection, insert: str, row: Any) -> int:
    """1 if the row was written; 0 if the new ledger refuses it (a damaged value breaking a constraint). Any other
    error (a full disk) ends the recovery: a row it could read is never dropped as if it could not."""
    try:
        out.execute(insert, row)
        return 1
    except sqlite3.IntegrityError:
        return 0


