"""Ledgers older releases wrote (issue 52): one per ledger schema, written by the commit that introduced it running
its own daemon (tests/fixtures/ledgers/make.py says how; rerun it after a schema change), opened, migrated and read
by this one. The old-schema tests elsewhere alter a file this version wrote; these are the files users have."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from gpuwear.cli import main
from gpuwear.config import WearConfig
from gpuwear.jobs import report as jobreport
from gpuwear.jobs.lines import Summariser
from gpuwear.ledger import SCHEMA_VERSION, Ledger

FIXTURES = Path(__file__).parent / "fixtures" / "ledgers"
OLD = sorted(FIXTURES.glob("schema-*.sqlite"))


def test_every_older_schema_has_its_ledger() -> None:
    """One fixture per schema before this one: a schema change adds the next (make.py's COMMITS)."""
    assert [int(re.match(r"schema-(\d+)-", p.name).group(1)) for p in OLD] == list(range(1, SCHEMA_VERSION))  # type: ignore[union-attr]


@pytest.mark.parametrize("fixture", OLD, ids=[p.stem for p in OLD])
def test_an_older_releases_ledger_opens_migrates_and_reads_whole(fixture: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The daemon's open migrates it in place, saying nothing alarming, setting nothing aside and recovering nothing
    (before: 797f9a4's ledger, schema 1, was refused, 'no such table: jobs'; its idle baseline's old keys would be
    set aside; e27b638's, schema 8, was listed with no totals, and its line_totals said lost); every GPU it held is
    there with its observed time; its job records are listed and, once their lines are kept, the listing totals
    what each record counts, byte for byte; a second open finds nothing to do; report and jobs answer."""
    state = tmp_path / "state"
    path = state / "ledger.sqlite"
    state.mkdir(mode=0o700)
    shutil.copyfile(fixture, path)
    path.chmod(0o600)
    with sqlite3.connect(fixture) as db:
        before = {u: json.loads(w).get("observed_seconds", 0) for u, w in db.execute("SELECT uuid, wear FROM gpus")}
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        jobs = db.execute("SELECT count(*) FROM jobs").fetchone()[0] if "jobs" in tables else 0
    assert before and (jobs or "jobs" not in tables), fixture  # the fixture holds history to migrate
    p = WearConfig()
    with caplog.at_level("WARNING", logger="gpuwear"):
        ledger = Ledger.open(path)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    try:
        assert ledger.meta("schema_version") == str(SCHEMA_VERSION)
        assert ledger.recovered is None and ledger.set_aside == 0
        gpus = ledger.load(p.cycles.hysteresis_celsius)
        assert set(gpus) == set(before) and all(gpus[u].observed_seconds >= before[u] > 0 for u in before)
        assert sum(1 for _ in ledger.jobs()) == jobs
        fast = jobreport.ledger_document(ledger, gpus, p, None)  # what a reader meets before the daemon indexes:
        # the lines an older release kept (under the same key) or none
        slow = jobreport.document(ledger.periods(None), gpus, p, None)
        assert json.dumps(fast) == json.dumps(slow)
        ledger.fill_lines(Summariser(p), 10_000)
        fast = jobreport.ledger_document(ledger, gpus, p, None)
        slow = jobreport.document(ledger.periods(None), gpus, p, None)
        assert json.dumps(fast) == json.dumps(slow) and fast["not_indexed"] == 0
        assert not ledger.left_out
    finally:
        ledger.close()
    again = Ledger.open(path)
    try:
        assert again.set_aside == 0 and again.recovered is None
    finally:
        again.close()
    for command in (["report"], ["report", "--json"], ["jobs", "--all"]):
        assert main([*command, "--state-dir", str(state)]) == 0, command
        assert capsys.readouterr().err == "", command
