"""`gpuwear doctor`, and a card's ledger following it to another box (export / import ledger)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuwear.backends.nvml import NvmlBackend
from gpuwear.clock import SystemClock
from gpuwear.config import Config
from gpuwear.doctor import Doctor
from gpuwear.service import Daemon, open_source
from gpuwear.sim.fakenvml import FakeNvmlLibrary
from gpuwear.sim.simulated import load_scenario
from helpers import free_port


def gpuwear(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwear", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_doctor_on_simulated_gpus(tmp_path: Path) -> None:
    """On a port of its own: the default 9941 may be taken by a daemon the developer runs (the README's first
    command), which doctor rightly counts as a second thing to fix."""
    config = tmp_path / "config.yaml"
    config.write_text(f'listen: "127.0.0.1:{free_port()}"\n')
    result = gpuwear("doctor", "--simulate", "--config", str(config), "--state-dir", str(tmp_path))
    out = result.stdout
    # the simulated RTX 4090 runs without persistence mode: a remark, not a thing to fix (it was one before)
    assert result.returncode == 0, out
    assert "[note] GPU 0 NVIDIA GeForce RTX 4090: persistence mode off" in out and "nvidia-persistenced" in out
    assert "[ok] GPU 1 NVIDIA H100 80GB HBM3: persistence mode on" in out
    assert "; not supported: ecc_corrected_aggregate, " in out
    assert "nothing to fix; 1 note(s)" in out


def test_doctor_finds_the_port_taken_and_a_bad_ledger(tmp_path: Path) -> None:
    port = free_port()
    ledger = tmp_path / "simulated" / "demo" / "ledger.sqlite"
    ledger.parent.mkdir(parents=True)
    ledger.write_bytes(b"not a database at all" * 10)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        config = Config(listen=f"127.0.0.1:{port}", state_dir=str(tmp_path))
        findings = Doctor(config, NvmlBackend(FakeNvmlLibrary(load_scenario("idle"), SystemClock())), ledger).run()
    bad = {f.what.split(":")[0]: f.fix for f in findings if not f.ok}
    assert "ledger" in bad and "backup" in bad["ledger"]
    assert "127.0.0.1" in bad and "ss -ltnp" in bad["127.0.0.1"]


@pytest.mark.slow  # it starts a daemon (issue 53: it was not marked)
def test_doctor_notes_a_running_gpuwear_on_its_port_but_does_not_count_it(tmp_path: Path) -> None:
    """The README's first command runs the daemon on 127.0.0.1:9941; a doctor run beside it counted that port as a
    thing to fix. A port held by a gpuwear daemon is a remark; one held by anything else stays a thing to fix."""
    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path / "daemon"))
    daemon = Daemon(config, open_source(config, "idle", 1.0, False))
    daemon.start()
    try:
        findings = Doctor(replace(config, state_dir=str(tmp_path)),
                          NvmlBackend(FakeNvmlLibrary(load_scenario("idle"), SystemClock())),
                          tmp_path / "ledger.sqlite", proc=None).run()
    finally:
        daemon.stop()
    (port,) = [f for f in findings if f.what.startswith(config.listen)]
    assert port.ok and "a gpuwear daemon serves /metrics there" in port.what and "stop this one" in port.note


@pytest.mark.slow
def test_a_cards_history_follows_it_to_another_box(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    box_a, box_b = tmp_path / "a", tmp_path / "b"
    config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(box_a))
    daemon = Daemon(config, open_source(config, "demo", 600.0, False))
    daemon.start()
    time.sleep(4)
    daemon.stop()
    a = json.loads(gpuwear("report", "--json", "--simulated", "--state-dir", str(box_a)).stdout)["gpus"][1]
    export = tmp_path / "card.json"
    result = gpuwear("export", a["uuid"], "--simulated", "--state-dir", str(box_a), "--output", str(export))
    assert result.returncode == 0, result.stderr
    # a simulated card (the demo's): a real ledger takes it only when told to
    first = gpuwear("import", "ledger", str(export), "--state-dir", str(box_b), "--allow-simulated")
    assert "1 part(s) imported" in first.stdout, first.stderr
    again = gpuwear("import", "ledger", str(export), "--state-dir", str(box_b), "--allow-simulated")
    assert "0 part(s) imported, 1 skipped (already imported)" in again.stdout
    b = json.loads(gpuwear("report", "--json", "--state-dir", str(box_b)).stdout)["gpus"]
    assert len(b) == 1 and b[0]["uuid"] == a["uuid"]
    # marked in the real ledger wherever it shows (before: no mark at all)
    assert b[0]["name"] == f"{a['name']} (simulated)"
    assert f"{a['name']} (simulated)" in gpuwear("report", "--state-dir", str(box_b)).stdout
    listed = json.loads(gpuwear("jobs", "--json", "--state-dir", str(box_b)).stdout)["jobs"]
    host = socket.gethostname()
    assert [j["name"] for j in listed] == [f"simulated: ledger:{export} (host {host})"], listed
    # issue 55: the box it was seen on is said and kept in its history (before: an imported history said nowhere
    # where it came from, and left no trace in the card's events)
    assert json.loads(export.read_text())["host"] == host
    moved = b[0]["elsewhere"]
    assert [(m["relation"], m["first"] <= m["last"]) for m in moved] == [("only", True)], moved
    assert [(e["kind"], e["host"], e["parts"]) for e in b[0]["events"]] == [("history imported", host, 1)]
    assert "  MOVED: seen elsewhere from " in gpuwear("report", "--state-dir", str(box_b)).stdout
    gpuwear("report", "--html", str(tmp_path / "b.html"), "--state-dir", str(box_b))
    assert '<p class="banner"><strong>Moved.</strong> Seen elsewhere from ' in (tmp_path / "b.html").read_text()
    for key in ("observed_seconds", "energy_joules"):
        assert b[0][key] == a[key]
    assert b[0]["thermal_aging_equivalent_hours"]["central"] == a["thermal_aging_equivalent_hours"]["central"]
    missing = gpuwear("export", "GPU-nope", "--simulated", "--state-dir", str(box_a))
    assert missing.returncode == 2 and "GPU-nope: no such GPU (known: 0 GPU-" in missing.stderr
    _passport_of_the_export(export, a, box_b, capfd)


def _passport_of_the_export(export: Path, a: dict[str, Any], box: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 55, item 5: the passport a buyer reads from the export the card's history travels in, in words and
    JSON (the figures of `report --json`), and the export's checksum: a damaged file is refused in one line by the
    passport and by `import ledger`; an export a gpuwear before the checksum wrote still reads, saying it cannot
    tell whether it arrived whole; one whose checksum was taken out is refused."""
    from gpuwear.cli import main
    from gpuwear.wear.schema import checksum

    def run(*args: str) -> tuple[int, str, str]:
        rc = main(list(args))
        out, err = capfd.readouterr()
        return rc, out, err

    rc, out, _ = run("passport", "--from", str(export))
    assert f"by the box named {socket.gethostname()};" in out, out
    assert rc == 0 and out.startswith(f"PASSPORT of {a['name']} ({a['uuid']}, serial ") and \
        "matches the file's content: it arrived whole (this detects damage, not forgery)" in out, out
    assert "Not known: the card's age and use before gpuwear first saw it" in out and "Health:" in out
    rc, out, _ = run("passport", "--from", str(export), "--json")
    passport = json.loads(out)
    g = passport["gpus"][0]
    assert all(g[k] == a[k] for k in ("observed_seconds", "energy_joules")), (g, a)
    assert passport["passport"]["checksum"] == json.loads(export.read_text())["checksum"]
    doc = json.loads(export.read_text())
    doc["parts"][0]["energy_joules"] += 1.0  # damaged in transit, or changed by hand
    damaged = export.with_name("damaged.json")
    damaged.write_text(json.dumps(doc))
    rc, out, err = run("passport", "--from", str(damaged))
    assert rc == 1 and not out and err.count("\n") == 1 and "checksum: missing or not the file's own" in err, err
    rc, out, err = run("import", "ledger", str(damaged), "--state-dir", str(box / "c"), "--allow-simulated")
    assert rc == 1 and err.count("\n") == 1 and "not imported: checksum: missing or not the file's own" in err, err
    old = {k: v for k, v in json.loads(export.read_text()).items() if k not in ("checksum", "exported_at", "host")}
    older = export.with_name("v1.json")
    older.write_text(json.dumps({**old, "version": 1}))
    rc, out, _ = run("passport", "--from", str(older))
    assert rc == 0 and "written by a gpuwear before exports carried a checksum" in out, out
    v2 = {**old, "version": 2, "exported_at": doc["exported_at"]}  # before exports named their box
    older.write_text(json.dumps({**v2, "checksum": checksum(v2)}))
    rc, out, _ = run("passport", "--from", str(older))
    assert rc == 0 and "arrived whole" in out and "by the box named" not in out, out
    older.write_text(json.dumps({**old, "version": 2, "exported_at": doc["exported_at"], "host": "box"}))
    rc, _, err = run("passport", "--from", str(older))  # a key version 2 did not have
    assert rc == 1 and "host" in err, err
    stripped = export.with_name("stripped.json")
    stripped.write_text(json.dumps({**old, "exported_at": doc["exported_at"]}))
    rc, _, err = run("passport", "--from", str(stripped))
    assert rc == 1 and "checksum: missing" in err, err
    rc, _, err = run("passport", "--state-dir", str(box))
    assert rc == 2 and "name one GPU of this ledger, or an export with --from FILE" in err


def test_doctor_says_whether_the_kernel_log_can_be_read(tmp_path: Path) -> None:
    """Issue 51: XIDs 79, 119 and 120 come from the kernel log alone; doctor checks that its user can read the one
    health.kernel_log names (here a file: missing, then there), and says when it is off."""
    from gpuwear.config import HostHealthConfig

    kern = tmp_path / "kern.log"

    def findings(source: str) -> list[tuple[bool, str, str, str]]:
        config = Config(listen=f"127.0.0.1:{free_port()}", state_dir=str(tmp_path),
                        health=HostHealthConfig(kernel_log=source))
        found = Doctor(config, NvmlBackend(FakeNvmlLibrary(load_scenario("idle"), SystemClock())),
                       tmp_path / "ledger.sqlite").run()
        return [(f.ok, f.what, f.fix, f.note) for f in found if "kernel log" in f.what]

    (missing,) = findings(str(kern))
    assert not missing[0] and missing[1] == f"kernel log ({kern}) cannot be read by this user: No such file or " \
        "directory" and "systemd-journal" in missing[2], missing
    kern.write_text("")
    assert findings(str(kern)) == [(True, f"kernel log ({kern}) readable", "", "")]
    (off,) = findings("off")
    assert off[0] and "79, 119 or 120" in off[3]


def test_history_from_elsewhere_is_placed_against_the_cards_time_here() -> None:
    """Issue 55, item 3: a card back after a move. Each imported part of its history is placed against its own time
    on this box: before it came, after it left, between two spells here (it left and came back), overlapping (a
    clock was off), or the only history (never seen here)."""
    from gpuwear.report import elsewhere, elsewhere_words
    from gpuwear.wear.accumulate import GpuWear

    day = 86400.0
    here = GpuWear("GPU-x", name="card")
    here.first_seen, here.last_seen = 10 * day, 50 * day
    here.covered = {str(10 * day): 20 * day, str(40 * day): 50 * day}  # here, away for 20 days, back
    parts = [("ledger:a.json (host a)", 1 * day, 9 * day), ("ledger:b.json (host b)", 22 * day, 38 * day),
             ("ledger:c.json (host c)", 51 * day, 60 * day), ("ledger:d.json (host d)", 15 * day, 45 * day)]
    placed = elsewhere(parts, here)
    assert [p["relation"] for p in placed] == ["before", "between", "after", "during"]
    assert [p["relation"] for p in elsewhere(parts[:1], None)] == ["only"]
    words = elsewhere_words({"elsewhere": placed})
    assert words[1] == ("seen elsewhere from 1970-01-23 to 1970-02-08, between two spells on this box: it left and "
                        "came back: imported from ledger:b.json (host b)")
    assert "\x1b" not in elsewhere_words({"elsewhere": [{**placed[0], "source": "ledger:\x1b[2Jx"}]})[0]
