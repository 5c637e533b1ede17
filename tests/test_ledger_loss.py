"""No single input sets history aside (issue 26): impossible timestamps in imported logs, bytes damaged inside the
SQLite file, absurd spans, and `export --output` aimed at what it must not replace. Each case failed on 7452d28."""

from __future__ import annotations

import contextlib
import datetime
import json
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from gpuwear.cli import main
from gpuwear.ledger import SCHEMA_VERSION, Event, Ledger
from gpuwear.ledger.recovery import recover
from helpers import free_port, wait_for
from test_ledger_hostile import T0, UUID, ledger_with_history, observed, wear_doc

SMI_UUID = "GPU-11111111-2222-3333-4444-555555555555"


def _smi(path: Path, stamps: list[str], uuid: str = SMI_UUID) -> Path:
    lines = ["timestamp, uuid, temperature.gpu, power.draw [W], utilization.gpu [%]"]
    lines += [f"{t}, {uuid}, {50 + i % 5}, 100.00 W, 50 %" for i, t in enumerate(stamps)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _stamps(start: float, seconds: int) -> list[str]:
    return [f"{datetime.datetime.fromtimestamp(start + i, datetime.timezone.utc):%Y/%m/%d %H:%M:%S}.000"
            for i in range(seconds)]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    return err


# -- impossible timestamps in an imported log ----------------------------------------------------------------------

@pytest.mark.parametrize("reader", ["columns", "rows"])
@pytest.mark.parametrize("odd", ["1970/01/01 00:00:05.000", "100000000000000000000000", "2100/06/01 00:00:00.000",
                                 "2099/01/01 00:00:00.000"])
def test_an_impossible_timestamp_is_refused_and_the_rest_imported(odd: str, reader: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwear.config import WearConfig
    from gpuwear.imports.reader import import_file

    state = tmp_path / "state"
    log = _smi(tmp_path / "log.csv", [odd, *_stamps(T0, 120)])
    ledger = Ledger.open(state / "ledger.sqlite")
    try:
        said: list[str] = []
        result = import_file(log, ledger, WearConfig(), tz=datetime.timezone.utc, say=said.append,
                             rows_only=reader == "rows", latest=T0 + 86400)
    finally:
        ledger.close()
    assert result.problems == 1 and result.imported[SMI_UUID] == 120
    assert len(said) == 1 and said[0].endswith("which no reading can have (the logging box's clock was not set): "
                                               f"'{odd}'; row skipped"), said
    assert main(["report", "--state-dir", str(state)]) == 0  # readable: nothing that the validator refuses
    _one_line(capsys)
    opened = Ledger.open(state / "ledger.sqlite")  # what the daemon does at its start: nothing set aside
    try:
        assert opened.set_aside == 0 and opened.recovered is None
        assert opened.load_imported(2.0)[SMI_UUID].observed_seconds == 119
    finally:
        opened.close()


def test_the_cli_refuses_rows_ahead_of_this_machines_clock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=3)
    log = _smi(tmp_path / "log.csv", [f"{future:%Y/%m/%d %H:%M:%S}.000", *_stamps(T0, 60)])
    assert main(["import", "nvidia-smi", str(log), "--state-dir", str(state), "--timezone", "UTC"]) == 0
    out, err = capsys.readouterr()
    assert "60 row(s) imported" in out and "over a day ahead of this machine's clock" in err


def test_rows_years_apart_never_cover_the_logs_between_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log holding one 2023 row and one 2100 row (or 2025: both possible) covered its whole span, and every later
    log of the card imported as "0 imported, N skipped (already imported)"."""
    state = tmp_path / "state"
    y2023 = datetime.datetime(2023, 3, 1, tzinfo=datetime.timezone.utc).timestamp()
    y2025 = datetime.datetime(2025, 3, 1, tzinfo=datetime.timezone.utc).timestamp()
    for i, last in enumerate(("2100/01/02 00:00:00.000", "2099/12/31 00:00:00.000", _stamps(y2025, 1)[0])):
        odd = _smi(tmp_path / f"odd{i}.csv", [_stamps(y2023, 1)[0], last])
        assert main(["import", "nvidia-smi", str(odd), "--state-dir", str(state), "--timezone", "UTC"]) == 0
    real = _smi(tmp_path / "real.csv", _stamps(T0, 100))  # 2025-06
    assert main(["import", "nvidia-smi", str(real), "--state-dir", str(state), "--timezone", "UTC"]) == 0
    out = capsys.readouterr().out
    assert "100 row(s) imported" in out.splitlines()[-1] and "skipped" not in out.splitlines()[-1], out
    assert observed(state / "ledger.sqlite") == 99
    assert sorted(p.name for p in state.iterdir() if p.name.startswith("ledger.sqlite.")) == []  # nothing set aside


# -- bytes damaged inside the SQLite file -------------------------------------------------------------------------

def _busy_ledger(folder: Path) -> Path:
    """Eight GPUs, hundreds of events and a job each, checkpointed into the main file (no WAL)."""
    path = folder / "ledger.sqlite"
    ledger = Ledger.open(path)
    docs = [wear_doc(uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666") for i in range(8)]
    recent = time.time() - 86400  # within the daemon's event retention
    ledger.save(docs, [Event(d["uuid"], recent + k, "gap", {"seconds": 1.0}) for d in docs for k in range(200)])
    ledger.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def _flip(path: Path, seed: int, count: int, start: int = 1024) -> None:
    data = bytearray(path.read_bytes())
    rnd = random.Random(seed)
    for _ in range(count):
        i = rnd.randrange(start, len(data))  # past the first page (SQLite's header and the schema) by default
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_recovery_says_it_begins_and_how_far_it_got(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 52: a recovery logged nothing until it ended (3.8-5.4 s on a damaged 3-year ledger, minutes on a
    larger or slower one): a person watching the log saw a daemon that said nothing. Now it says it begins, and how
    far it got at most once every RECOVERY_SAY_SECONDS (here every commit)."""
    from gpuwear.ledger.store import _RecoveryProgress

    path = _busy_ledger(tmp_path)
    _flip(path, 0, 30)
    with caplog.at_level("WARNING", logger="gpuwear.ledger"):
        Ledger.open(path).close()
    said = [r.getMessage() for r in caplog.records]
    begins = next(i for i, m in enumerate(said) if "is damaged" in m and "copying what SQLite can still read" in m)
    ends = next(i for i, m in enumerate(said) if "recovered what SQLite could still read" in m)
    assert begins < ends, said
    caplog.clear()
    progress = _RecoveryProgress(path, every=0.0)
    with caplog.at_level("WARNING", logger="gpuwear.ledger"):
        progress.said(1234)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"ledger {path}: recovering, 1234 rows copied"), line


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_flipped_bytes_are_recovered_and_every_command_answers_in_one_line(
        seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    path = _busy_ledger(state / "simulated" / "demo")
    _flip(path, seed, 30)
    for command in (["report"], ["report", "--json"], ["jobs"], ["jobs", "--all"], ["doctor", "--simulate"],
                    ["export", "GPU-00000000", "--output", str(tmp_path / "out.json")]):
        code = main([*command, "--simulated" if command[0] != "doctor" else "--simulate", "--state-dir", str(state)]
                    if command[0] != "doctor" else [*command, "--state-dir", str(state)])
        assert code in (0, 1), command
        _one_line(capsys)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", "--speed", "60", "--listen",
                             f"127.0.0.1:{port}", "--state-dir", str(state)], stderr=subprocess.PIPE, text=True)
    try:
        # recovery runs before the first scrape is served: 0.1-0.3 s (seed 5 took 14 s quiet, 22-54 s loaded while
        # every query of a table whose schema SQLite could not parse was tried rowid by rowid)
        body = wait_for(f"http://127.0.0.1:{port}/metrics", "gpuwear_ledger_persist_success 1.0")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=20)
    assert proc.returncode == 0, log[-2000:]
    assert "gpuwear_ledger_moved_aside 1.0" in body
    assert "recovered what SQLite could still read" in log
    kept = [p for p in path.parent.glob("ledger.sqlite.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(kept) == 1
    assert main(["report", "--simulated", "--state-dir", str(state)]) == 0
    capsys.readouterr()
    ledger = Ledger.open_read_only(path)
    try:
        rows = ledger.rows()
        aside = dict(ledger._db.execute("SELECT source, count(*) FROM set_aside GROUP BY source").fetchall())
    finally:
        ledger.close()
    for table in ("gpus", "events"):  # every row SQLite can still read is there, or set aside for failing its check
        assert rows[table] + aside.get(table, 0) >= _readable(kept[0], table), table


@pytest.mark.slow
def test_a_start_that_recovers_asks_systemd_for_more_time_first(tmp_path: Path) -> None:
    """Recovery runs before READY=1: a start whose recovery outlasts TimeoutStartSec was killed and began it again
    at every restart. A real datagram socket stands in for systemd's NOTIFY_SOCKET; an intact ledger asks for
    nothing."""
    import os
    import socket

    state = tmp_path / "state"
    path = _busy_ledger(state / "simulated" / "demo")
    _flip(path, 0, 30)
    notify = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(60)

    def start_until_ready() -> list[str]:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", "--speed", "60", "--listen",
                                 f"127.0.0.1:{port}", "--state-dir", str(state)], stderr=subprocess.DEVNULL,
                                env={**os.environ, "NOTIFY_SOCKET": str(notify)})
        told: list[str] = []
        try:
            while not told or not told[-1].startswith("READY=1"):
                told.append(sock.recv(4096).decode())
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        return told

    try:
        first = start_until_ready()
        second = start_until_ready()
    finally:
        sock.close()
    assert [p for p in path.parent.glob("ledger.sqlite.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    extend = [m for m in first if m.startswith("EXTEND_TIMEOUT_USEC=")]
    assert len(extend) == 1 and first.index(extend[0]) < len(first) - 1, first
    assert int(extend[0].split("\n")[0].split("=")[1]) >= 60_000_000 and "STATUS=recovering" in extend[0]
    assert not [m for m in second if "EXTEND_TIMEOUT_USEC" in m], second


# -- what is recovered, and what is refused and kept as it is ----------------------------------------------------

def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != "gpuwear.pid"}


def test_a_ledger_of_the_first_schema_5_is_brought_up_to_date_not_recovered(tmp_path: Path) -> None:
    """d941c07 wrote schema 5 without the crc columns that e121de2 added under the same number: its ledgers failed
    "no such column: crc" at open and were recovered, the original renamed."""
    path = _busy_ledger(tmp_path)
    ledger = Ledger.open(path)
    ledger.save([], [], jobs=[_job(time.time() - 600)])
    ledger.close()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:  # the tables as d941c07 made them
        db.executescript("""
            BEGIN;
            CREATE TABLE events5 (id INTEGER PRIMARY KEY, uuid TEXT NOT NULL, wall REAL NOT NULL, kind TEXT NOT NULL,
                                  detail TEXT NOT NULL);
            INSERT INTO events5 SELECT id, uuid, wall, kind, detail FROM events;
            CREATE TABLE jobs5 (record TEXT PRIMARY KEY, kind TEXT NOT NULL, start REAL NOT NULL, end REAL,
                                data TEXT NOT NULL);
            INSERT INTO jobs5 SELECT record, kind, start, end, data FROM jobs;
            DROP TABLE events; DROP TABLE jobs;
            ALTER TABLE events5 RENAME TO events; ALTER TABLE jobs5 RENAME TO jobs;
            CREATE INDEX events_by_gpu ON events (uuid, wall); CREATE INDEX jobs_by_start ON jobs (start);
            UPDATE meta SET value = '5' WHERE key = 'schema_version';
            COMMIT;""")
    opened = Ledger.open(path)
    try:
        assert opened.recovered is None and opened.set_aside == 0
        assert opened.rows()["events"] == 8 * 200 and opened.rows()["jobs"] == 1 and len(opened.load(2.0)) == 8
        assert opened.meta("schema_version") == str(SCHEMA_VERSION)
    finally:
        opened.close()
    assert not list(tmp_path.glob("*.damaged-*"))
    with sqlite3.connect(path) as db:  # validated once, then stamped
        assert db.execute("SELECT count(*) FROM events WHERE crc IS NULL").fetchone()[0] == 0
    Ledger.open(path).close()  # and the migration's second run changes nothing


@pytest.mark.parametrize("version", ["five", "0", "5x", "-1", "\x1b[2J"])
def test_an_unreadable_schema_version_is_refused_and_the_file_never_touched(
        version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwear.ledger import LedgerRefusedError

    path = ledger_with_history(tmp_path / "state")
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = _files(path.parent)
    with pytest.raises(LedgerRefusedError, match="not a schema version"):
        Ledger.open(path)
    assert main(["report", "--state-dir", str(tmp_path / "state")]) == 1
    err = _one_line(capsys)
    assert "not a schema version" in err and "\x1b" not in err
    after = _files(path.parent)
    assert after.get("ledger.sqlite") == before["ledger.sqlite"]
    assert not [name for name in after if "damaged" in name or "recover" in name]


def test_a_damaged_ledger_of_a_newer_gpuwear_is_refused_never_rewritten(tmp_path: Path) -> None:
    from gpuwear.ledger import LedgerTooNewError

    path = _busy_ledger(tmp_path)
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("UPDATE meta SET value = '" + str(SCHEMA_VERSION + 1) + "' WHERE key = 'schema_version'")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _flip(path, 5, 30, path.stat().st_size // 4)  # the rows, past the meta table
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:  # damaged indeed
        db.text_factory = bytes
        try:
            whole = db.execute("PRAGMA quick_check").fetchone()[0] == b"ok"
        except (sqlite3.DatabaseError, UnicodeDecodeError):  # SQLite's message can hold the page's bytes
            whole = False
        assert not whole
    before = _files(path.parent)
    with pytest.raises(LedgerTooNewError, match="upgrade gpuwear"):
        Ledger.open(path)
    after = _files(path.parent)
    assert after.get("ledger.sqlite") == before["ledger.sqlite"]
    assert not [name for name in after if "damaged" in name or "recover" in name]


def _readable(path: Path, table: str) -> int:
    """The rows of a table SQLite can read in a damaged file, one point lookup each (the slow, plain oracle), the
    schema read both ways."""
    best = 0
    for lenient in (False, True):
        found = 0
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                db.text_factory = bytes
                if lenient:
                    db.execute("PRAGMA writable_schema=ON")
                for rowid in range(1, 3000):
                    try:
                        found += len(db.execute(f"SELECT * FROM {table} WHERE rowid = ?", (rowid,)).fetchall())
                    except sqlite3.OperationalError as exc:
                        if "no such" in str(exc):
                            break
                    except (sqlite3.DatabaseError, UnicodeDecodeError):
                        pass
        except (sqlite3.DatabaseError, UnicodeDecodeError):
            pass
        best = max(best, found)
    return best


RECOVERY_KILLER = """
import os, sys
from pathlib import Path
sys.path.insert(0, {daemon!r})
import gpuwear.ledger as ledger
steps = [0]
real = {{name: getattr(os, name) for name in ("replace", "link", "unlink")}}
def counted(name):
    def call(*args, **kwargs):
        steps[0] += 1
        if steps[0] == {kill_at}:
            os.kill(os.getpid(), 9)
        return real[name](*args, **kwargs)
    return call
for name in real:
    setattr(os, name, counted(name))
ledger.Ledger.open(Path({path!r})).close()
"""


RECOVERY_ON_A_FULL_DISK = """
import resource, signal, sqlite3, sys
from pathlib import Path
sys.path.insert(0, {daemon!r})
import gpuwear.ledger as ledger
import gpuwear.ledger.recovery as recovery
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
copy = recovery._schema_repaired_copy
def copy_then_fill_the_disk(src, dst):  # the damaged file copied, then no file may grow past 8 KiB
    copy(src, dst)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.RLIM_INFINITY))
recovery._schema_repaired_copy = copy_then_fill_the_disk
try:
    ledger.Ledger.open(Path({path!r})).close()
except (sqlite3.Error, OSError) as exc:
    print("refused:", ledger.environment_error(exc) if isinstance(exc, sqlite3.Error) else "os", exc)
"""


def test_a_disk_that_fills_up_during_recovery_leaves_the_damaged_ledger_as_it_was(tmp_path: Path) -> None:
    """Recovery's inserts swallowed every error, a full disk's included: rows it could read but not write were
    dropped from the recovered ledger as if unreadable."""
    path = _busy_ledger(tmp_path)
    _flip(path, 0, 30)
    damaged = path.read_bytes()
    script = RECOVERY_ON_A_FULL_DISK.format(daemon=str(Path(__file__).parent.parent / "daemon"), path=str(path))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.startswith("refused: True"), (result.stdout, result.stderr[-2000:])
    assert path.read_bytes() == damaged  # kept as it was: recovered at a start with room
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("ledger.sqlite.")]  # no trial, nothing kept
    reopened = Ledger.open(path)
    try:
        assert reopened.recovered is not None and len(reopened.load(2.0)) >= 5
    finally:
        reopened.close()


@pytest.mark.slow
def test_kill_9_at_any_step_of_a_recovery_leaves_the_damaged_ledger_or_the_recovered_one(tmp_path: Path) -> None:
    daemon = str(Path(__file__).parent.parent / "daemon")
    for kill_at in range(1, 12):
        folder = tmp_path / f"k{kill_at}"
        folder.mkdir(mode=0o700)
        path = _busy_ledger(folder)
        _flip(path, 0, 30)  # damage SQLite reads around (other seeds destroy the table definitions themselves)
        damaged = path.read_bytes()
        script = RECOVERY_KILLER.format(daemon=daemon, path=str(path), kill_at=kill_at)
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60, check=False)
        assert result.returncode in (0, -signal.SIGKILL), result.stderr[-2000:]
        assert path.exists()
        if path.read_bytes() != damaged:  # the new ledger in place: complete, and never with the damaged WAL
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
                assert db.execute("SELECT value FROM meta WHERE key = 'recovered_from'").fetchone()
        reopened = Ledger.open(path)  # the next start: recovery done, or ended where the kill left it
        try:
            assert len(reopened.load(2.0)) >= 5
        finally:
            reopened.close()
        kept = [p for p in folder.glob("ledger.sqlite.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
        assert kept and all(p.read_bytes() == damaged for p in kept)
        assert not list(folder.glob("*.recovering")) or not (folder / "ledger.sqlite.recovered").exists()


RECOVERY_KILLED_IN_MID_COPY = """
import os, sys
from pathlib import Path
sys.path.insert(0, {daemon!r})
from gpuwear.ledger import recovery
commits = []
def progress(rows):  # each commit: killed at the {kill_at}th, in the middle of the events
    commits.append(rows)
    print(rows, flush=True)
    if len(commits) == {kill_at}:
        os.kill(os.getpid(), 9)
recovery.recover(Path({path!r}), RuntimeError("damaged"), progress=progress, commit_seconds=0.0)
"""


def _rows(path: Path) -> dict[str, list[Any]]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        db.text_factory = bytes
        return {t: db.execute(f"SELECT rowid, * FROM {t} ORDER BY rowid").fetchall() for t in tables
                if t != "meta"} | {"meta": db.execute("SELECT * FROM meta WHERE key != 'recovered_from' "
                                                       "ORDER BY key").fetchall()}


@pytest.mark.parametrize("between", ["nothing", "the damaged file changed"])
def test_a_recovery_killed_in_mid_copy_resumes_where_it_stopped(between: str, tmp_path: Path) -> None:
    """Recovery wrote each pass in one transaction: a kill (systemd's, when a start outlasts its timeout) threw the
    pass away, and the next start began it again. Each pass now commits as it goes, and goes on from its last commit,
    only over the same damaged bytes; the ledger it makes is the one an uninterrupted recovery makes."""
    path = _busy_ledger(tmp_path)
    _flip(path, 0, 30)
    script = RECOVERY_KILLED_IN_MID_COPY.format(daemon=str(Path(__file__).parent.parent / "daemon"), path=str(path),
                                                kill_at=6)
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    committed = int(killed.stdout.split()[-1])  # rows the killed pass had committed
    assert committed > 200 and list(tmp_path.glob("ledger.sqlite.recovering-0")), killed.stdout
    if between != "nothing":
        _flip(path, 1, 1)
    oracle = tmp_path / "oracle"
    oracle.mkdir()
    shutil.copyfile(path, oracle / "ledger.sqlite")
    recover(oracle / "ledger.sqlite", RuntimeError("damaged"))

    seen: list[int] = []
    recover(path, RuntimeError("damaged"), progress=seen.append, commit_seconds=0.0)
    if between == "nothing":
        assert seen[0] >= committed, (seen[:3], committed)  # went on from the killed pass's rows
    else:
        assert seen[0] < committed, (seen[:3], committed)  # other bytes: begun again
    assert _rows(path) == _rows(oracle / "ledger.sqlite") and "recovery_state" not in _rows(path)
    assert not [p.name for p in tmp_path.iterdir() if "recover" in p.name]


# -- export --output ----------------------------------------------------------------------------------------------

def test_export_never_replaces_the_ledger_a_link_or_a_foreign_file(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    path = ledger_with_history(state)
    before = path.read_bytes()
    target = tmp_path / "precious.txt"
    target.write_text("not an export\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    (tmp_path / "folder").mkdir()
    cases = {str(path): "inside the state directory", str(state / "other.json"): "inside the state directory",
             str(link): "symbolic link", str(target): "not a gpuwear export", str(tmp_path / "folder"): "directory",
             str(tmp_path / "missing" / "x.json"): "No such file or directory",
             "/dev/null": "not a regular file"}
    for output, why in cases.items():
        assert main(["export", UUID, "--output", output, "--state-dir", str(state)]) == 1, output
        err = _one_line(capsys)
        assert why in err and "nothing written" in err, err
    assert path.read_bytes() == before and target.read_text() == "not an export\n"
    assert observed(path) == 3600
    out = tmp_path / "card.json"
    for replaced in (False, True):  # a new file, then an earlier export replaced: said (issue 53: nothing was)
        assert main(["export", UUID, "--output", str(out), "--state-dir", str(state)]) == 0
        assert json.loads(out.read_text())["uuid"] == UUID
        said = capsys.readouterr().out.strip()
        assert said == f"wrote GPU {UUID}'s history to {out}" + (", replacing the file there" if replaced else "")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_export_that_cannot_be_written_whole_says_so_in_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """A disk that fills mid-write: the file-size limit stands in for it (EFBIG where ENOSPC would be)."""
    state = tmp_path / "state"
    ledger = Ledger.open(ledger_with_history(state))
    ledger.save([], [Event(UUID, T0 + k, "gap", {"seconds": 1.0}) for k in range(2000)])  # an export of ~100 kB
    ledger.close()
    out = tmp_path / "card.json"
    # 48 kB: more than the ledger's -shm file (32 kB), which a reader may create, less than the export
    script = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (48000, 48000)); from gpuwear.cli import main; "
              f"sys.exit(main(['export', {UUID!r}, '--output', {str(out)!r}, '--state-dir', {str(state)!r}]))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("gpuwear: export --output ") and "nothing written" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*card.json*"))


# -- clocks that jump ---------------------------------------------------------------------------------------------

def _simulated_run(state: Path, base: object, seconds: int, speed: float = 1.0) -> tuple[float, float, float]:
    """One run of the simulated daemon on ``base`` (a ManualClock standing for the machine's): ticks, saves, stops.
    Returns the first GPU's (last_seen, coverage, observed seconds) as saved."""
    from gpuwear.backends.nvml import NvmlBackend
    from gpuwear.clock import ManualClock, ScaledClock
    from gpuwear.config import Config
    from gpuwear.metrics import DaemonInfo
    from gpuwear.service import Daemon, Source, _sampler
    from gpuwear.sim.fakenvml import FakeNvmlLibrary
    from gpuwear.sim.simulated import load_scenario

    assert isinstance(base, ManualClock)
    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(state))
    simulation = load_scenario("demo")
    clock = ScaledClock(speed, base)
    sampler = _sampler(NvmlBackend(FakeNvmlLibrary(simulation, clock)), clock, config)
    sampler.open()
    daemon = Daemon(config, Source(sampler, clock, DaemonInfo("t", "3", "simulated", "demo"), speed, simulation))
    try:
        for _ in range(seconds):
            base.advance(1.0 / speed)
            daemon._tick()
        assert daemon.persist(final=True)
    finally:
        daemon.stop()
    ledger = Ledger.open_read_only(state / "simulated" / "demo" / "ledger.sqlite")
    try:
        w = sorted(ledger.load(2.0).items())[0][1]
    finally:
        ledger.close()
    assert w.last_seen is not None
    return w.last_seen, w.coverage() or 0.0, w.observed_seconds


TEN_YEARS = 10 * 365 * 86400.0


def test_a_restart_ten_years_ahead_then_corrected_leaves_coverage_and_last_seen_right(tmp_path: Path) -> None:
    from gpuwear.clock import ManualClock

    base = ManualClock(start_wall=T0)
    _simulated_run(tmp_path, base, 300)
    base.set_wall(base.wall() + TEN_YEARS)  # the machine's clock 10 years ahead at a restart
    ahead, _, _ = _simulated_run(tmp_path, base, 300)
    assert ahead > T0 + TEN_YEARS
    base.set_wall(base.wall() - TEN_YEARS + 60)  # corrected before the next start
    last_seen, coverage, seen = _simulated_run(tmp_path, base, 300)
    assert last_seen <= base.wall() + 1  # not left in 2035 for good
    assert coverage > 0.8 and 890 <= seen <= 905, (coverage, seen)


@pytest.mark.slow
def test_a_fast_simulation_goes_on_from_where_its_history_ends(tmp_path: Path) -> None:
    from gpuwear.clock import ManualClock

    base = ManualClock(start_wall=T0)
    first, _, _ = _simulated_run(tmp_path, base, 3600, speed=600.0)  # an hour simulated in 6 s of the machine's
    assert first > base.wall() + 3500
    base.advance(10.0)
    second, coverage, _ = _simulated_run(tmp_path, base, 600, speed=600.0)
    assert second >= first + 600  # never back into its own history
    assert coverage > 0.9


# -- retention ----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_retention_prunes_detail_keeps_lifetime_figures_and_the_file_shrinks(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger.open(path)
    try:
        doc = wear_doc()
        job = {"record": "slurm:1@x", "kind": "slurm", "id": "1", "user": None, "name": "a", "start": T0,
               "last_seen": T0 + 60, "end": T0 + 60, "gpus": [{"uuid": UUID, "start": T0, "end": T0 + 60,
                                                             "wear": wear_doc(seconds=60), "max_celsius": {},
                                                             "events": {}}]}
        for day in range(20):
            ledger.save([doc], [Event(UUID, T0 + day * 86400 + k, "xid", {"code": 13, "note": "x" * 200})
                                for k in range(1000)],
                        jobs=[{**job, "record": f"slurm:{day}-{k}@x", "start": T0 + day * 86400 + k,
                               "end": T0 + day * 86400 + k + 60, "last_seen": T0 + day * 86400 + k + 60}
                              for k in range(200)])
        big = path.stat().st_size + Path(f"{path}-wal").stat().st_size
        ledger.save([doc], [], forget_jobs_before=T0 + 18 * 86400, forget_events_before=T0 + 18 * 86400)
        rows = ledger.rows()
        assert rows["events"] == 2000 and rows["jobs"] == 400
        assert ledger.load(2.0)[UUID].observed_seconds == 3600  # the lifetime figures are the GPU's own record's
    finally:
        ledger.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
    assert free < 1024 and path.stat().st_size < big / 4, (free, path.stat().st_size, big)


PRUNER = """
import sys
from pathlib import Path
sys.path.insert(0, {daemon!r})
sys.path.insert(0, {tests!r})
from gpuwear.ledger import SCHEMA_VERSION, Event, Ledger
from gpuwear.ledger.recovery import recover
from test_ledger_hostile import T0, UUID, wear_doc
ledger = Ledger.open(Path({path!r}))
held = ledger.load(2.0).get(UUID)
doc = held.to_json() if held is not None else wear_doc()
day = int(ledger.meta("next_day") or 0)  # committed with the day before it: a day is never saved twice
print("ready", flush=True)
while True:
    doc["observed_seconds"] += 1.0
    ledger.save([doc], [Event(UUID, T0 + day * 86400 + k, "gap", {{"seconds": 1.0, "pad": "p" * 300}})
                        for k in range(300)], forget_events_before=T0 + (day - 3) * 86400,
                meta={{"next_day": str(day + 1)}})
    print("saved", flush=True)
    day += 1
"""


@pytest.mark.slow
def test_kill_9_during_pruning_and_vacuum_leaves_a_whole_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    script = PRUNER.format(daemon=str(Path(__file__).parent.parent / "daemon"), tests=str(Path(__file__).parent),
                           path=str(path))
    rng = random.Random(5)
    last, saved = 0.0, 0
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert proc.stdout.readline().strip() == "saved"  # then killed anywhere in the saves that follow
        try:
            proc.wait(timeout=rng.uniform(0.0, 0.4))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        saved += 1 + proc.stdout.read().count("saved")  # each said after its commit
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        ledger = Ledger.open(path)
        try:
            assert ledger.recovered is None and ledger.set_aside == 0
            seen = ledger.load(2.0)[UUID].observed_seconds
            assert ledger.rows()["events"] <= 5 * 300  # pruned as it goes: the last days' only
        finally:
            ledger.close()
        assert seen >= last and seen >= 3600 + saved, (seen, saved)  # every save said committed is there
        last = seen


# -- checksums: what is read is proved whole without validating the whole history again --------------------------

def _job(start: float) -> dict[str, object]:
    return {"record": f"slurm:1@{start:.0f}", "kind": "slurm", "id": "1", "user": None, "name": "train",
            "start": start, "last_seen": start + 60, "end": start + 60,
            "gpus": [{"uuid": UUID, "start": start, "end": start + 60, "wear": wear_doc(first=start, seconds=60),
                      "max_celsius": {"gpu": 70.0}, "events": {}}]}


def test_a_job_or_event_changed_on_disk_is_caught_by_its_checksum(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    path = ledger_with_history(state)
    recent = time.time() - 3600
    ledger = Ledger.open(path)
    ledger.save([], [Event(UUID, recent, "xid", {"code": 13})], jobs=[_job(recent)])
    ledger.close()
    with sqlite3.connect(path) as db:  # still valid JSON of a valid record: only the checksum can tell
        (blob,) = db.execute("SELECT data FROM jobs").fetchone()
        changed = zlib.decompress(blob).replace(b'"observed_seconds":60', b'"observed_seconds":90')
        db.execute("UPDATE jobs SET data = ?", (zlib.compress(changed),))
        db.execute("UPDATE events SET detail = '{\"code\": 79}'")
    # a bad row costs that row, never the command (they failed whole until the daemon's next start)
    for command, shown in ((["jobs", "--all"], "train"), (["report", "--json"], '"events": []')):
        assert main([*command, "--state-dir", str(state)]) == 0
        out, err = capsys.readouterr()
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "1 record(s) left out of what is shown" in err and "its bytes changed since it was written" in err
        assert "sets them aside at its next start" in err and (shown not in out if command[0] == "jobs"
                                                                 else shown in out), out
    assert main(["export", UUID, "--state-dir", str(state)]) == 0  # the event is not exported, and that is said
    out, err = capsys.readouterr()
    assert json.loads(out)["events"] == [] and "1 record(s) left out of what is shown" in err, err
    opened = Ledger.open(path)  # the daemon's open: both set aside, the rest kept
    try:
        assert opened.set_aside == 2 and opened.rows()["jobs"] == 0 and opened.rows()["events"] == 0
        assert opened.load(2.0)[UUID].observed_seconds == 3600
    finally:
        opened.close()
    assert main(["jobs", "--state-dir", str(state)]) == 0


def test_rows_written_before_checksums_are_validated_once_then_stamped(tmp_path: Path) -> None:
    path = ledger_with_history(tmp_path)
    ledger = Ledger.open(path)
    ledger.save([], [Event(UUID, time.time() - 60, "gap", {"seconds": 5.0})], jobs=[_job(time.time() - 600)])
    ledger.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE jobs SET crc = NULL")
        db.execute("UPDATE events SET crc = NULL")
    reader = Ledger.open_read_only(path)  # a reader validates them, and trusts nothing it did not check
    try:
        assert len(reader.jobs()) == 1 and len(reader.events()) == 1
    finally:
        reader.close()
    Ledger.open(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM jobs WHERE crc IS NULL").fetchone()[0] == 0
        assert db.execute("SELECT count(*) FROM events WHERE crc IS NULL").fetchone()[0] == 0
    again = Ledger.open(path)  # stamped with the checksums of what they hold: the next open proves them whole
    try:
        assert again.set_aside == 0 and again.rows()["jobs"] == 1 and again.rows()["events"] == 1
    finally:
        again.close()
    reader = Ledger.open_read_only(path)
    try:
        assert len(reader.jobs()) == 1 and len(reader.events()) == 1
    finally:
        reader.close()


# -- every save exactly once -------------------------------------------------------------------------------------

class _FullAtVacuum(Ledger):
    """A ledger whose disk fills up just after a save committed, as the incremental vacuum that follows runs."""

    def _give_back_pages(self) -> None:
        raise sqlite3.OperationalError("database or disk is full")


def test_a_vacuum_failing_after_the_commit_never_writes_an_event_twice(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """save() vacuumed after its commit, and a full disk there made it raise: the daemon gave the events back and
    its next save inserted them again (events have no natural key)."""
    path = tmp_path / "ledger.sqlite"
    ledger = _FullAtVacuum.open(path)
    events = [Event(UUID, time.time() - 60 + k, "xid", {"code": 79}) for k in range(5)]
    try:
        for _ in range(3):
            try:
                ledger.save([wear_doc()], events)
                break
            except sqlite3.Error:  # what the daemon does: the events given back, saved again with the next save
                continue
        for k in range(2):  # later saves, the disk still full
            with contextlib.suppress(sqlite3.Error):
                ledger.save([wear_doc()], [Event(UUID, time.time() + k, "gap", {"seconds": 1.0})])
    finally:
        ledger.close()
    reader = Ledger.open_read_only(path)
    try:
        assert [e.detail for e in reader.events()].count({"code": 79}) == 5
    finally:
        reader.close()
    assert sum("could not be given back" in r.getMessage() for r in caplog.records) == 1  # said once


def test_a_ledger_export_ending_in_2099_is_refused_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`import ledger` took a part ending in 2099 (its bound was 2100; the CSV import refuses rows over a day ahead):
    the GPU showed last_seen 2099 and a coverage of 0."""
    from test_ledger_hostile import export_doc

    state = tmp_path / "state"
    y2099 = datetime.datetime(2099, 1, 1, tzinfo=datetime.timezone.utc).timestamp()
    ahead = tmp_path / "ahead.json"
    ahead.write_text(json.dumps(export_doc(wear_doc(first=T0, seconds=600), wear_doc(first=y2099 - 600, seconds=600))))
    assert main(["import", "ledger", str(ahead), "--state-dir", str(state)]) == 1
    err = _one_line(capsys)
    assert "part 2 ends at 2099-01-01 00:00 UTC, over a day ahead of this machine's clock" in err, err
    fine = tmp_path / "fine.json"
    fine.write_text(json.dumps(export_doc(wear_doc(first=T0, seconds=600))))
    assert main(["import", "ledger", str(fine), "--state-dir", str(state)]) == 0
    assert "1 part(s) imported" in capsys.readouterr().out
    ledger = Ledger.open_read_only(state / "ledger.sqlite")
    try:
        assert ledger.imported_spans(UUID) == [(T0, T0 + 600)]
    finally:
        ledger.close()


def test_recovery_keeps_the_pass_that_kept_every_gpu_then_the_most_rows() -> None:
    """Recovery reads a damaged file twice (its schema strict, then lenient) and keeps one pass: weighing events and
    GPU records alike, a pass that lost a card's lifetime record could win on its events."""
    from gpuwear.ledger.recovery import _kept_more

    every_gpu = {"gpus": 8, "events": 100, "jobs": 3, "imports": 1}
    lost_one = {"gpus": 7, "events": 1600, "jobs": 40, "imports": 1}
    assert _kept_more(every_gpu, lost_one) and not _kept_more(lost_one, every_gpu)
    assert not _kept_more({**every_gpu, "imports": 0, "events": 900}, every_gpu)  # an import is a GPU's history too
    more_events = {**every_gpu, "events": 101}
    assert _kept_more(more_events, every_gpu) and not _kept_more(every_gpu, more_events)
    assert not _kept_more(every_gpu, dict(every_gpu))  # a tie keeps the first pass


def _crashed_ledger(tmp_path: Path, writes: Callable[[Ledger], object]) -> Path:
    """A busy ledger (state/ledger.sqlite under ``tmp_path``) as a crash leaves it: ``writes`` made and still in
    its WAL, not yet checkpointed into the file."""
    live = _busy_ledger(tmp_path / "live")
    writer = Ledger.open(live)
    try:
        with closing(writer._db.cursor()) as cursor:
            cursor.execute("PRAGMA wal_autocheckpoint=0")
        writes(writer)
        folder = tmp_path / "state"
        folder.mkdir(mode=0o700)
        for suffix in ("", "-wal"):
            Path(f"{folder / 'ledger.sqlite'}{suffix}").write_bytes(Path(f"{live}{suffix}").read_bytes())
    finally:
        writer.close()
    return folder / "ledger.sqlite"


OPEN_ON_A_FILLING_DISK = """
import resource, signal, sqlite3, sys
from pathlib import Path
sys.path.insert(0, {daemon!r})
import gpuwear.ledger as ledger
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))  # room for a few pages more
try:
    ledger.Ledger.open(Path({path!r})).close()
    print("opened")
except sqlite3.Error as exc:
    print("refused:", ledger.environment_error(exc), exc)
"""


def test_an_open_that_fails_after_writing_puts_the_ledger_and_its_wal_back_as_they_were(tmp_path: Path) -> None:
    """The open writes before it has met every part of the file (the version it was written by, checksums stamped on
    older rows, records set aside): a failure after those writes (here a disk that fills up, as damage found late
    does) left them in the WAL, and the file was no longer the one found."""
    def unstamped(writer: Ledger) -> None:  # rows from before checksums: the open stamps them
        with closing(writer._db.cursor()) as cursor:
            cursor.execute("UPDATE events SET crc = NULL")

    path = _crashed_ledger(tmp_path, unstamped)
    folder = path.parent
    found = {suffix: Path(f"{path}{suffix}").read_bytes() for suffix in ("", "-wal")}
    assert len(found["-wal"]) > 50_000
    script = OPEN_ON_A_FILLING_DISK.format(daemon=str(Path(__file__).parent.parent / "daemon"), path=str(path),
                                           limit=len(found["-wal"]) + 4096)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.stdout.startswith("refused: True"), (result.stdout, result.stderr[-2000:])
    assert {suffix: Path(f"{path}{suffix}").read_bytes() for suffix in ("", "-wal")} == found
    assert sorted(p.name for p in folder.iterdir() if p.name != "ledger.sqlite-shm") == \
        ["ledger.sqlite", "ledger.sqlite-wal"]
    reopened = Ledger.open(path)  # with room: opened, stamped, nothing lost
    try:
        assert reopened.recovered is None and reopened.rows()["events"] == 8 * 200 and len(reopened.load(2.0)) == 8
    finally:
        reopened.close()


@pytest.mark.parametrize("seed", range(2, 12))
def test_a_recovered_ledger_never_takes_the_damaged_files_wal(seed: int, tmp_path: Path) -> None:
    """A damaged ledger whose WAL still holds its last saves: the WAL is kept beside the damaged file, byte for byte,
    and never applied to the recovered ledger (its frames would overwrite the new file's pages). Some damage answers
    only once the open writes (an index page no read met): what the open wrote is put back first."""
    path = _crashed_ledger(tmp_path, lambda writer: writer.save(
        [wear_doc(uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666") for i in range(8)],
        [Event(UUID, time.time() - 60 + k, "gap", {"seconds": 1.0}) for k in range(300)]))
    wal = Path(f"{path}-wal").read_bytes()
    assert len(wal) > 50_000
    _flip(path, seed, 30, path.stat().st_size // 4)
    damaged = path.read_bytes()
    recovered = Ledger.open(path)
    try:
        assert recovered.recovered is not None
        rows = recovered.rows()
    finally:
        recovered.close()
    assert recovered.recovered.read_bytes() == damaged  # kept byte for byte, with its WAL
    assert Path(f"{recovered.recovered}-wal").read_bytes() == wal
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        assert db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    again = Ledger.open(path)
    try:
        assert again.recovered is None and again.rows() == rows and len(again.load(2.0)) == 8
    finally:
        again.close()


@pytest.mark.slow
def test_a_row_changed_under_a_running_daemon_costs_the_page_that_row_only(tmp_path: Path) -> None:
    """The page at / answered "the ledger cannot be read yet" for one bad row until the daemon restarted."""
    from gpuwear.config import Config
    from gpuwear.service import Daemon, open_source

    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path))
    daemon = Daemon(config, open_source(config, "demo", 60.0, False))
    daemon.start()
    try:
        assert daemon.persist() and daemon.ledger is not None
        gpu = sorted(daemon.ledger.load(2.0))[0]
        daemon.ledger.save([], [Event(gpu, time.time() - 60, "xid", {"code": 13})])
        with closing(sqlite3.connect(daemon.ledger_file, isolation_level=None)) as db:
            db.execute("UPDATE events SET detail = '{\"code\": 79}' WHERE kind = 'xid'")
        assert daemon.persist()  # a new save: the page renders afresh
        page = daemon.page().decode()
    finally:
        daemon.stop()
    assert "cannot be read" not in page and gpu in page
    assert "1 record(s) left out of what is shown" in page and "its bytes changed since it was written" in page


# -- checksums where history lives forever: the GPUs' records, the wear log, the imports ----------------------------

def test_a_gpu_record_or_import_changed_on_disk_is_caught_and_costs_no_lifetime(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checksums guarded events and jobs only, which age out anyway: a byte changed in a card's lifetime record or
    in an import that still read as valid JSON was taken as the card's history."""
    state = tmp_path / "state"
    path = ledger_with_history(state)
    other = "GPU-99999999-1111-2222-3333-444455556666"
    ledger = Ledger.open(path)
    ledger.save([], [], imports=[(other, "log.csv", T0, T0 + 600, 600, wear_doc(first=T0, seconds=600, uuid=other))])
    ledger.close()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:  # valid JSON, plausible figures: only a checksum
        db.execute("UPDATE gpus SET wear = replace(wear, '\"observed_seconds\":3600', '\"observed_seconds\":3609')")
        db.execute("UPDATE imports SET wear = replace(wear, '\"observed_seconds\":600', '\"observed_seconds\":900')")
        assert db.total_changes == 2
    assert main(["report", "--json", "--state-dir", str(state)]) == 0  # a reader: left out, said, never failing
    out, err = capsys.readouterr()
    assert json.loads(out)["gpus"] == [] and len(err.strip().splitlines()) == 1
    assert "2 record(s) left out of what is shown" in err and "its bytes changed since it was written" in err, err
    opened = Ledger.open(path)  # the daemon's open: the card's record validated value by value and kept, its bytes
    try:                        # kept aside; the import (one log's history) set aside whole
        assert opened.set_aside == 2 and opened.load(2.0)[UUID].observed_seconds == 3609
        assert opened.load_imported(2.0) == {} and opened.rows()["set_aside"] == 2
        (kept,) = opened._db.execute("SELECT data FROM set_aside WHERE source = 'gpus'").fetchone()
        assert '\\"observed_seconds\\":3609' in kept  # the bytes as they were found
    finally:
        opened.close()
    again = Ledger.open(path)  # written again with their checksums: nothing more to set aside
    try:
        assert again.set_aside == 0 and again.left_out == []
    finally:
        again.close()
    assert main(["report", "--json", "--state-dir", str(state)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    # and said afterwards (issue 52: the card's changed record was kept with its changed value, and no reader said
    # so once the daemon's open had set its bytes aside)
    from gpuwear import page

    assert "<strong>Set aside.</strong> 1 record(s) or value(s) of this GPU" in page.render(json.loads(out))
    (gpu,) = json.loads(out)["gpus"]
    assert gpu["set_aside"]["count"] == 1 and gpu["set_aside"]["newest"]["why"].endswith("its bytes changed since it "
                                                                                          "was written"), gpu
    assert main(["report", "--state-dir", str(state)]) == 0
    text = capsys.readouterr().out
    assert "SET ASIDE: 1 record(s) or value(s) of this GPU failed their check at a daemon start" in text, text
    assert "its values were checked one by one and kept, the bytes as found set aside" in text, text


def test_records_from_before_schema_7_are_stamped_once_and_read_back_whole(tmp_path: Path) -> None:
    path = ledger_with_history(tmp_path)
    ledger = Ledger.open(path)
    ledger.save([wear_doc(seconds=4000.0)], [],
                imports=[(UUID, "log.csv", T0 - 7200, T0 - 3600, 3600, wear_doc(first=T0 - 7200, seconds=3600))])
    ledger.close()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        assert db.execute("SELECT count(*) FROM wear_log").fetchone()[0] == 1
        for table in ("gpus", "wear_log", "imports"):
            db.execute(f"UPDATE {table} SET crc = NULL")
    Ledger.open(path).close()
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        for table in ("gpus", "wear_log", "imports"):
            assert db.execute(f"SELECT count(*) FROM {table} WHERE crc IS NULL").fetchone()[0] == 0, table
    again = Ledger.open(path)
    try:
        assert again.set_aside == 0 and again.load(2.0)[UUID].observed_seconds == 4000
        assert again.load_imported(2.0)[UUID].observed_seconds == 3600 and again.left_out == []
    finally:
        again.close()


# -- what reaches a terminal -------------------------------------------------------------------------------------

HOSTILE = "\x1b[2J\x07\x9b31m\u202e"  # clear the screen, bell, a C1 CSI, a right-to-left override


def test_names_from_outside_never_reach_the_terminal_raw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`report` printed raw ESC/BEL from an imported log's or an export's GPU name and UUID, and `jobs` printed job
    names raw (ESC, BEL, C1 CSI, RLO) where they came from a scenario or an import."""
    state = tmp_path / "state"
    gpu = f"GPU-{HOSTILE}-0000"
    ledger = Ledger.open(state / "ledger.sqlite")
    job = _job(time.time() - 600)
    job["name"], job["gpus"][0]["uuid"] = f"train{HOSTILE}", gpu  # type: ignore[index]
    job["gpus"][0]["wear"] = wear_doc(first=job["start"], seconds=60, uuid=gpu)  # type: ignore[index, arg-type]
    ledger.save([{**wear_doc(uuid=gpu), "name": f"H100{HOSTILE}"}], [Event(gpu, time.time() - 60, "xid", {"code": 79})],
                jobs=[job])
    ledger.close()
    for command in (["report"], ["jobs", "--all"], ["jobs", f"train{HOSTILE}"], ["report", "--gpu", gpu]):
        code = main([*command, "--state-dir", str(state)])
        out, err = capsys.readouterr()
        assert code == 0, err
        shown = out + err
        assert "H100" in shown or "train" in shown, shown
        assert not any(c in shown for c in "\x1b\x07\x9b\u202e"), (command, shown[:400])
        assert "\\x1b" in shown  # said, as an escape


@pytest.mark.slow
def test_the_daemons_log_shows_outside_text_printable(tmp_path: Path) -> None:
    """The log (the journal, a terminal) carried paths, GPU and job names raw: here the state directory's name."""
    state = tmp_path / f"state{HOSTILE}"
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpuwear", "run", "--simulate", "--listen", f"127.0.0.1:{port}",
                             "--state-dir", str(state)], stderr=subprocess.PIPE, text=True)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", "ok")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=60)
    assert proc.returncode == 0, log[-2000:]
    assert "state\\x1b[2J\\x07\\x9b31m\\u202e" in log, log[-2000:]  # said, as escapes
    assert not any(c in log for c in "\x1b\x07\x9b\u202e"), log[-2000:]

