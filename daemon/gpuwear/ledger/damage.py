"""What an open of a ledger needs whether or not it is damaged: the file examined read-only before anything writes
it (:func:`_examine`), a recovery a kill interrupted finished (:func:`finish_recovery`), and an error told apart as
the file's damage (:func:`damaged`: recovered then, by :mod:`gpuwear.ledger.recovery`, loaded only for it) or the
environment's (:func:`environment_error`: the file kept as it is)."""

from __future__ import annotations

import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from gpuwear.ledger.errors import LedgerDamagedError, LedgerTooNewError, _text, printable
from gpuwear.ledger.schema import SCHEMA_VERSION, _schema_version, _too_new

RECOVERING = ".recovering"  # the new ledger being written
RECOVERED = ".recovered"  # the new ledger complete, waiting to replace the damaged one (finish_recovery)
SCRATCH = ".scratch"  # a copy of the damaged file whose table definitions are put right before it is read


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


# SQLite result codes that say the disk, the directory or another process stood in the way, not that the file is
# bad: PERM, BUSY, LOCKED, NOMEM, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL.
_ENVIRONMENT_CODES = frozenset({3, 5, 6, 7, 8, 10, 13, 14, 15})
# SQLite result codes that say the file itself is damaged: CORRUPT, NOTADB.
_DAMAGE_CODES = frozenset({11, 26})


# sqlite3_errmsg()'s words for those codes, for Python 3.10, whose sqlite3 exceptions carry no code (sqlite_errorcode
# came with 3.11): SQLite's own texts (sqlite3ErrStr in main.c; a damaged schema's "malformed database schema (...)")
_CODE_OF_WORDS = {"access permission denied": 3, "database is locked": 5, "database table is locked": 6,
                  "out of memory": 7, "attempt to write a readonly database": 8, "disk I/O error": 10,
                  "database disk image is malformed": 11, "malformed database schema": 11,
                  "database or disk is full": 13, "unable to open database file": 14, "locking protocol": 15,
                  "file is not a database": 26}


def _code(exc: BaseException) -> int | None:
    """The SQLite result code of an error (its primary code), from the exception (Python 3.11+) or its words."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF
    if not isinstance(exc, sqlite3.Error) or not exc.args:
        return None
    words = str(exc.args[0])
    return next((c for w, c in _CODE_OF_WORDS.items() if words == w or words.startswith(w + " (")), None)


def damaged(exc: BaseException) -> bool:
    """Whether an error at open says the file is damaged (recovered then): SQLite's corruption answers, a failed
    integrity check, or bytes that do not decode as text. Anything else (an error of ours, a failed migration, an
    unreadable schema version) leaves the file as it is."""
    if isinstance(exc, (LedgerDamagedError, UnicodeDecodeError)):
        return True
    return isinstance(exc, sqlite3.DatabaseError) and _code(exc) in _DAMAGE_CODES


def environment_error(exc: sqlite3.Error) -> bool:
    """Whether an SQLite error is the environment's (a full disk, a read-only directory, a lock), after which the
    file must be kept as it is, rather than the file's own (corrupt, not a database, tables missing)."""
    return _code(exc) in _ENVIRONMENT_CODES
