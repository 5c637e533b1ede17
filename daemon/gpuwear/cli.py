"""The ``gpuwear`` command: run | report | jobs | import | export | doctor | check-config."""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import logging
import os
import socket
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuwear import __version__
from gpuwear.backends.nvml import NvmlUnavailableError
from gpuwear.config import Config, ConfigError, WearConfig, parse_listen
from gpuwear.ledger import Ledger, LedgerError, StateLock, StateLockedError, ledger_path, printable
from gpuwear.wear.accumulate import GpuWear
from gpuwear.webconfig import WebConfigError

# The scenarios shipped in gpuwear/sim/scenarios/ (a test keeps the list true); named here
# so that a daemon on real GPUs never imports the simulation.
BUILTIN_SCENARIOS = ("demo", "idle", "stress", "training")
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_SIGPIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader left
JOBS_SHOWN = 20  # `gpuwear jobs` lists this many of the newest jobs unless told otherwise
GPU_HELP = "only this GPU: its index (as nvidia-smi numbers it), its UUID or the start of its UUID"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuwear", description="GPU wear and health monitoring daemon.")
    parser.add_argument("--version", action="version", version=f"gpuwear {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="sample the GPUs and serve /metrics (foreground)")
    run.add_argument("--config", metavar="FILE", help="configuration file (default: built-in defaults)")
    run.add_argument("--listen", metavar="HOST:PORT", help="serve /metrics here (config: listen)")
    run.add_argument("--state-dir", metavar="DIR", help="state directory (config: state_dir)")
    run.add_argument("--simulate", nargs="?", const="", metavar="SCENARIO",
                     help="use simulated GPUs: a built-in scenario ({}) or a YAML file; without a value, "
                          "the configured one (default demo)".format(", ".join(BUILTIN_SCENARIOS)))
    run.add_argument("--simulate-if-no-gpu", action="store_true",
                     help="use real GPUs when the NVIDIA driver is present, else simulated ones")
    run.add_argument("--speed", type=float, metavar="N",
                     help="run simulated time N times faster than wall time (config: simulation.speed)")

    check = sub.add_parser("check-config", help="validate a configuration file, listing every problem")
    check.add_argument("file", metavar="FILE")

    report = sub.add_parser("report", help="what the wear ledger knows about each GPU, in words or JSON")
    _ledger_arguments(report)
    report.add_argument("--gpu", metavar="GPU", help=GPU_HELP)
    shape = report.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="a stable machine-readable document")
    shape.add_argument("--html", metavar="FILE", help="the page (as the daemon serves at /): one self-contained file")

    jobs = sub.add_parser("jobs", help="which job wore which GPU, and by how much")
    jobs.add_argument("job", nargs="?", metavar="JOB", help="one job (its id, name or record) across its GPUs")
    _ledger_arguments(jobs)
    jobs.add_argument("--since", metavar="DURATION", help="only jobs ended within this long (30m, 12h, 1d, 2w)")
    jobs.add_argument("--gpu", metavar="GPU", help=GPU_HELP)
    jobs.add_argument("--json", action="store_true", help="a stable machine-readable document")
    shown = jobs.add_mutually_exclusive_group()
    shown.add_argument("--limit", type=int, metavar="N", help=f"the newest N jobs (default {JOBS_SHOWN} in words, "
                       "all in --json); shares and totals stay those of the whole window")
    shown.add_argument("--all", action="store_true", help="every job in the window")

    doctor = sub.add_parser("doctor", help="check the driver, devices, GPUs, ledger and port; say what to fix")
    _ledger_arguments(doctor)
    doctor.add_argument("--simulate", nargs="?", const="demo", metavar="SCENARIO",
                        help="examine simulated GPUs instead of the real ones")

    imp = sub.add_parser("import", help="backfill the wear ledger from telemetry logs")
    imp_sub = imp.add_subparsers(dest="format", required=True, metavar="FORMAT")
    smi = imp_sub.add_parser("nvidia-smi", help="CSV from nvidia-smi --query-gpu=... --format=csv (or the "
                             "llm-gpu-stress NVML logger's CSV)")
    smi.add_argument("files", nargs="+", metavar="FILE")
    _ledger_arguments(smi)
    smi.add_argument("--gpu", metavar="GPU", help="the GPU the logs are of, when they carry no uuid column "
                     "(required when they carry neither uuid nor pci.bus_id): its UUID, or for a GPU the ledger knows "
                     "its index or the start of its UUID")
    smi.add_argument("--max-gap", type=float, metavar="SECONDS",
                     help="the longest pause between two rows counted as observed time (default: 5 times the "
                     "log's median sampling interval, between sampling's max_gap_seconds and 3600)")
    smi.add_argument("--columns", metavar="NAMES", help="comma-separated query fields of a noheader CSV")
    smi.add_argument("--timezone", metavar="ZONE", help="zone of the logs' timestamps, e.g. UTC or Europe/Paris "
                     "(default: this machine's; nvidia-smi writes local time without a zone)")
    led = imp_sub.add_parser("ledger", help="a card's history exported from another box (gpuwear export)")
    led.add_argument("files", nargs="+", metavar="FILE")
    _ledger_arguments(led)
    led.add_argument("--allow-simulated", action="store_true",
                     help="take a simulated GPU's history into this ledger (refused by default: it would pass for "
                     "a real card's)")

    forget = sub.add_parser("forget", help="remove one GPU from the ledger: its history, imports, events and job "
                            "shares (asks first)")
    forget.add_argument("gpu", metavar="GPU", help="its index, UUID or the start of its UUID")
    _ledger_arguments(forget)
    forget.add_argument("--yes", action="store_true", help="do not ask (needed where there is no terminal to ask)")

    fleet = sub.add_parser("fleet", help="the fleet's answer from its Prometheus-compatible store: incident rates by "
                           "heat aging, per product, with exact intervals")
    fleet.add_argument("--prometheus", metavar="URL", required=True,
                       help="the store's HTTP API: Prometheus, Thanos Query, Mimir (with --tenant), VictoriaMetrics")
    fleet.add_argument("--span", metavar="DURATION", default="90d", help="how far back (default 90d)")
    shape = fleet.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="the answer as JSON")
    shape.add_argument("--html", metavar="FILE", help="the answer as one self-contained page")
    fleet.add_argument("--bearer-token-file", metavar="FILE", help="send this file's token as a bearer token")
    fleet.add_argument("--basic-user", metavar="USER", help="basic auth's user (with --basic-password-file)")
    fleet.add_argument("--basic-password-file", metavar="FILE", help="basic auth's password, from this file")
    fleet.add_argument("--ca-file", metavar="FILE", help="trust this CA (PEM) for https")
    fleet.add_argument("--tenant", metavar="ID", help="Mimir's tenant (the X-Scope-OrgID header)")

    passport = sub.add_parser("passport", help="one card's history for its next owner: what it carried when "
                              "first seen and what gpuwear saw since, from its export")
    passport.add_argument("uuid", nargs="?", metavar="GPU", help="its index, UUID or the start of its UUID")
    _ledger_arguments(passport)
    passport.add_argument("--from", dest="from_file", metavar="FILE",
                          help="the passport of an export file (gpuwear export GPU --output FILE) instead of a GPU of "
                          "this ledger")
    shape = passport.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="a stable machine-readable document")
    shape.add_argument("--html", metavar="FILE", help="a self-contained page")

    export = sub.add_parser("export", help="one GPU's history as a file another box can import")
    export.add_argument("uuid", metavar="GPU", help="its index, UUID or the start of its UUID")
    _ledger_arguments(export)
    export.add_argument("--output", metavar="FILE", help="write here instead of standard output")
    return parser


def _ledger_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="configuration file (model parameters, state_dir)")
    parser.add_argument("--state-dir", metavar="DIR", help="state directory (config: state_dir)")
    parser.add_argument("--simulated", nargs="?", const="demo", metavar="SCENARIO",
                        help="the ledger of a simulation (gpuwear run --simulate SCENARIO; default demo) instead of "
                        "the real one")


class PrintableFormatter(logging.Formatter):
    """The daemon's log lines made printable: GPU names, job names, paths and what a client sent reach the log (the
    journal, a terminal), and an ESC, BEL or bidi override in them must not act there."""

    def format(self, record: logging.LogRecord) -> str:
        return _printable_lines(super().format(record))


def _printable_lines(text: str) -> str:
    """``text`` with each line made printable (gpuwear.ledger.printable), its line breaks kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


def _say(message: str) -> None:
    """One line for the person on standard error, printable."""
    print(f"gpuwear: {printable(message)}", file=sys.stderr)


def _fail(message: str, code: int) -> int:
    _say(message)
    return code


def _show(text: str, end: str = "\n") -> None:
    """Print text for a person: every line made printable (names, UUIDs and job names come from GPUs, logs, exports
    and scenarios: an ESC, BEL or bidi override in them must not reach the terminal)."""
    print(_printable_lines(text), end=end)


def load_config(path: str | Path | None) -> Config:
    """config.load_config, and the health rules wear.health.rules names checked against the rule table (the config
    part knows no rule: health sits above it)."""
    from gpuwear.config import load_config as load
    from gpuwear.health import mode_problems

    config = load(path)
    if problems := mode_problems(dict(config.wear.health.rules)):
        raise ConfigError(problems)
    return config


def _config_problems(path: str, error: ConfigError) -> int:
    for problem in error.problems:
        print(f"gpuwear: {path}: {problem}", file=sys.stderr)
    return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from gpuwear.runtime import limit_malloc_arenas
    from gpuwear.service import Daemon, open_source
    from gpuwear.sim.errors import ScenarioError  # not the simulation: a daemon on real GPUs never loads it

    config = load_config(args.config)
    overrides: dict[str, Any] = {}  # what the command line sets over the file, at every reload too
    if args.listen is not None:
        try:
            parse_listen(args.listen)
        except ValueError as exc:
            return _fail(f"--listen: {exc}", EXIT_USAGE)
        overrides["listen"] = args.listen
    if args.state_dir is not None:
        overrides["state_dir"] = args.state_dir
    config = replace(config, **overrides)
    if args.speed is not None and not 0.001 <= args.speed <= 100000:
        return _fail(f"--speed: must be between 0.001 and 100000, got {args.speed:g}", EXIT_USAGE)
    if args.speed is not None and args.simulate is None and not args.simulate_if_no_gpu:
        return _fail("--speed applies to simulated GPUs only; add --simulate", EXIT_USAGE)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler])
    speed = args.speed if args.speed is not None else config.simulation.speed
    simulate = args.simulate if args.simulate != "" else config.simulation.scenario
    limit_malloc_arenas()  # before any thread starts
    os.umask(0o077)  # the state directory and ledger are the daemon's alone (the unit sets UMask=0077 too)
    try:
        source = open_source(config, simulate, speed, args.simulate_if_no_gpu)
    except NvmlUnavailableError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    except ScenarioError as exc:
        return _fail(str(exc), EXIT_USAGE)
    try:
        daemon = Daemon(config, source, config_path=args.config, overrides=overrides)
    except WebConfigError as exc:
        source.sampler.backend.close()
        return _fail(f"web_config_file: {exc}", EXIT_USAGE)
    except LedgerError as exc:  # another daemon holds the state directory, or a newer gpuwear wrote the ledger
        source.sampler.backend.close()
        return _fail(str(exc), EXIT_FAILURE)
    daemon.handle_signals()
    try:
        daemon.start()
    except OSError as exc:
        daemon.stop()
        return _fail(f"cannot serve on {config.listen}: {exc.strerror or exc}", EXIT_FAILURE)
    daemon.wait()
    if daemon.fatal:
        return _fail(daemon.fatal, EXIT_FAILURE)
    return 0


def _check_config(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    if config.web_config_file:  # and the web config it names, with its certificates, as the daemon reads them
        from gpuwear.webconfig import load_web_config

        try:
            load_web_config(config.web_config_file)
        except WebConfigError as exc:
            return _fail(f"web_config_file: {exc}", EXIT_USAGE)
        print(f"{args.file}: valid (web config {config.web_config_file}: valid)")
        return 0
    print(f"{args.file}: valid")
    return 0


def gpu_indexes(wears: Iterable[GpuWear]) -> dict[str, int]:
    """UUID -> the index nvidia-smi gave the GPU when the daemon last saw it, where no other GPU of the ledger had
    that index (a card replaced in the same slot leaves two)."""
    wears = list(wears)
    taken = Counter(w.index for w in wears if w.index is not None)
    return {w.uuid: w.index for w in wears if w.index is not None and taken[w.index] == 1}


class NoSuchGpuError(ValueError):
    """``--gpu`` names no GPU of the ledger (ambiguous names raise a plain ValueError)."""


def _no_gpu(message: str, ledger: Ledger) -> int:
    """A GPU asked for that the ledger's readable records do not name: a usage error, unless records were left out
    of the read (the GPU may be one of them: the ledger's trouble, said with the note)."""
    note = ledger.left_out_note()
    return _fail(f"{message}; {note}", EXIT_FAILURE) if note else _fail(message, EXIT_USAGE)


def select_gpu(spec: str, wears: dict[str, GpuWear]) -> str:
    """``--gpu``: an index as nvidia-smi numbers the GPU (as the daemon last saw it), a UUID, or the start of one
    (``GPU-`` may be left out, any case). Raises ValueError naming the known GPUs when it names none or several."""
    def known() -> str:
        return ", ".join(f"{i} {u}" if (i := w.index) is not None else u for u, w in sorted(wears.items())) or "none"

    text = spec.strip()
    if text.isdigit():
        matches = [u for u, w in wears.items() if w.index == int(text)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise ValueError(f"--gpu {spec}: index {text} was {' and '.join(sorted(matches))} (a card replaced in "
                             "that slot?): give the UUID")
    if text in wears:
        return text
    want = text.lower().removeprefix("gpu-")
    matches = [u for u in wears if want and u.lower().removeprefix("gpu-").startswith(want)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"--gpu {spec}: the start of {len(matches)} GPUs' UUIDs ({', '.join(sorted(matches))}): "
                         "give more of it")
    raise NoSuchGpuError(f"--gpu {spec}: no such GPU (known: {known()})")


def _ledger_config(args: argparse.Namespace) -> Config:
    config = load_config(args.config)
    return replace(config, state_dir=args.state_dir) if args.state_dir is not None else config


def _report(args: argparse.Namespace) -> int:
    from gpuwear import page
    from gpuwear.report import documents, text_report

    config = _ledger_config(args)
    _read_simulated_where_alone(args, config)
    path = ledger_path(config, args.simulated)
    try:
        ledger = _open_read_only(path, args.simulated)
        try:
            wanted = None
            if args.gpu is not None:
                try:
                    wanted = select_gpu(args.gpu, ledger.load_all(config.wear.cycles.hysteresis_celsius))
                except ValueError as exc:
                    return _no_gpu(f"{exc} in {path}", ledger)
            doc, jobs = documents(ledger, config.wear, str(path), args.simulated is not None, wanted,
                                  with_jobs=args.html is not None)
            left_out = ledger.left_out_note()
        finally:
            ledger.close()
    except (LedgerError, sqlite3.Error) as exc:
        return _fail(str(exc), EXIT_FAILURE)
    if left_out:
        _say(left_out)
    if args.html is not None:
        try:
            Path(args.html).write_text(page.render(doc, jobs), encoding="utf-8")
        except OSError as exc:
            return _fail(f"--html {args.html}: {exc.strerror or exc}", EXIT_FAILURE)
        print(f"wrote {args.html}: open it in a browser")
    elif args.json:
        print(json.dumps(doc, indent=2, sort_keys=False))
    else:
        _show(text_report(doc), end="")
    return 0


def _read_simulated_where_alone(args: argparse.Namespace, config: Config) -> None:
    """The README's first command runs --simulate-if-no-gpu: on a machine without a GPU its ledger is the simulated
    demo's. A reader asked for the real GPUs' ledger where there is none and one simulated ledger reads that one,
    saying so (``args.simulated`` set); with several, :func:`_open_read_only` names them."""
    real = ledger_path(config, None)
    if args.simulated is not None or real.exists():
        return
    found = sorted(p.parent.name for p in (real.parent / "simulated").glob("*/ledger.sqlite"))
    if len(found) == 1:
        args.simulated = found[0]
        _say(f"no ledger of real GPUs in {real.parent}: reading the simulated GPUs' (gpuwear run --simulate "
             f"{found[0]}; --simulated NAME reads another)")


def _open_read_only(path: Path, simulated: str | None) -> Ledger:
    """The ledger a command reads; where the real one does not exist but simulated GPUs' do (the README's first
    command runs --simulate-if-no-gpu), the refusal says how to read those."""
    try:
        return Ledger.open_read_only(path)
    except LedgerError as exc:
        found = sorted(p.parent.name for p in (path.parent / "simulated").glob("*/ledger.sqlite")) \
            if simulated is None and not path.exists() else []
        if found:
            others = f" (or: {', '.join(found[1:4])}{', ...' if len(found) > 4 else ''})" if len(found) > 1 else ""
            raise LedgerError(f"{exc} It holds simulated GPUs' ledgers: add --simulated {found[0]}{others}") from None
        raise


def _jobs(args: argparse.Namespace) -> int:
    from gpuwear.jobs import report as jobreport

    config = _ledger_config(args)
    since = None
    if args.since:
        try:
            since = time.time() - jobreport.parse_duration(args.since)
        except ValueError as exc:
            return _fail(f"--since: {exc}", EXIT_USAGE)
    _read_simulated_where_alone(args, config)
    path = ledger_path(config, args.simulated)
    if args.limit is not None and args.limit < 1:
        return _fail(f"--limit: expected a number of jobs, 1 or more, got {args.limit}", EXIT_USAGE)
    limit = None if args.all else args.limit if args.limit is not None else None if args.json else JOBS_SHOWN
    try:
        ledger = _open_read_only(path, args.simulated)
        try:
            gpus = ledger.load(config.wear.cycles.hysteresis_celsius)
            every = ledger.load_all(config.wear.cycles.hysteresis_celsius)
            wanted = None
            if args.gpu is not None:
                try:
                    wanted = select_gpu(args.gpu, every)
                except ValueError as exc:
                    return _no_gpu(f"{exc} in {path}", ledger)
            if args.job:
                first = next((r for r in ledger.periods(since) if args.job in (r["record"], r["id"], r["name"])),
                             None)
                if first is None:
                    return _fail(f"no job {args.job!r} in {path}", EXIT_USAGE)
                doc = jobreport.document([first], gpus, config.wear, since, wanted, shown=limit)
                doc["card_or_code"] = _card_or_code(gpus, config.wear, wanted, ledger)
                _write_jobs(args.json, doc, iter(doc["jobs"]), gpu_indexes(every.values()), limit)
                _say_left_out(ledger)
            else:  # the totals and shares from the lines the ledger keeps; the jobs shown read and written one by one
                with ledger.reading():
                    head, listed = jobreport.ledger_listing(ledger, gpus, config.wear, since, wanted)
                    head["card_or_code"] = _card_or_code(gpus, config.wear, wanted, ledger)
                    _write_jobs(args.json, head, listed, gpu_indexes(every.values()), limit)
                    _say_left_out(ledger)
        finally:
            ledger.close()
    except (LedgerError, sqlite3.Error) as exc:
        return _fail(str(exc), EXIT_FAILURE)
    return 0


def _card_or_code(gpus: dict[str, GpuWear], p: WearConfig, wanted: str | None,
                  ledger: Ledger) -> dict[str, list[dict[str, Any]]]:
    """Card or code (health.judgements), per listed GPU, for the XIDs the listed runs raised (issue 54), with the
    ledger's clean runs of each application: the jobs part holds no health rule, so the listing's caller gives it."""
    from gpuwear.health.judgements import card_or_code
    from gpuwear.jobs.lines import key

    def clean(names: list[str], since: float) -> dict[str, dict[str, int]]:
        return ledger.clean_runs(names, since, key(p))

    return {uuid: judged for uuid, judged in card_or_code(gpus, p, clean).items() if wanted is None or uuid == wanted}


def _say_left_out(ledger: Ledger) -> None:
    left_out = ledger.left_out_note()
    if left_out:
        _say(left_out)


def _write_jobs(as_json: bool, head: dict[str, Any], jobs: Iterator[dict[str, Any]], index_of: dict[str, int],
                limit: int | None) -> None:
    """A listing written as its jobs are read (``jobs --all`` on a busy box's months: 45,000, never all in memory)."""
    from gpuwear.jobs import report as jobreport

    if as_json:
        for chunk in jobreport.json_chunks(head, jobs, limit):
            sys.stdout.write(chunk)
        sys.stdout.write("\n")
    else:
        for line in jobreport.text_lines(head, jobs, index_of, limit):
            _show(line)


def _doctor(args: argparse.Namespace) -> int:
    from gpuwear.backends.nvml import NvmlBackend
    from gpuwear.clock import SystemClock
    from gpuwear.doctor import Doctor, render
    from gpuwear.sim.fakenvml import FakeNvmlLibrary
    from gpuwear.sim.simulated import ScenarioError, load_scenario

    config = _ledger_config(args)
    if args.simulate:
        try:
            backend = NvmlBackend(FakeNvmlLibrary(load_scenario(args.simulate), SystemClock()))
        except ScenarioError as exc:
            return _fail(str(exc), EXIT_USAGE)
        print("SIMULATED GPUs: not real hardware")
    else:
        backend = NvmlBackend()
    simulated = args.simulated or (Path(args.simulate).stem if args.simulate else None)
    findings = Doctor(config, backend, ledger_path(config, simulated),
                      proc=None if args.simulate else Path("/proc")).run()
    return 0 if render(findings, _show) else EXIT_FAILURE


def _ledger_export(args: argparse.Namespace, config: Config) -> dict[str, Any] | int:
    """The export of the GPU ``args.uuid`` names in the ledger ``args`` names, or the exit status of a refusal,
    said (LedgerError and sqlite3.Error raised). What the ledger left out is said, as by every reader."""
    ledger = _open_read_only(ledger_path(config, args.simulated), args.simulated)
    try:
        try:
            uuid = select_gpu(args.uuid, ledger.load_all(config.wear.cycles.hysteresis_celsius))
        except ValueError as exc:
            return _no_gpu(str(exc).replace("--gpu ", ""), ledger)
        doc = ledger.export(uuid, simulated=args.simulated is not None, host=socket.gethostname())
        left_out = ledger.left_out_note()
    finally:
        ledger.close()
    if left_out:  # an event that fails its checksum is not exported
        _say(left_out)
    return doc


def _export(args: argparse.Namespace) -> int:

    config = _ledger_config(args)
    try:
        doc = _ledger_export(args, config)
    except (LedgerError, sqlite3.Error) as exc:
        return _fail(str(exc), EXIT_FAILURE)
    if isinstance(doc, int):
        return doc
    uuid = doc["uuid"]
    text = json.dumps(doc, indent=1)
    if args.output:
        replaced = Path(args.output).exists()
        try:
            write_export(Path(args.output), text + "\n", config.resolved_state_dir())
        except (ExportRefusedError, OSError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return _fail(f"export --output {printable(args.output)}: {printable(why)}; nothing written", EXIT_FAILURE)
        print(f"wrote GPU {uuid}'s history to {printable(args.output)}" + (", replacing the file there" if replaced
                                                                              else ""))
    else:
        print(text)
    return 0


def _passport(args: argparse.Namespace) -> int:
    from gpuwear import page, passport
    from gpuwear.wear.schema import SchemaError

    config = _ledger_config(args)
    if (args.uuid is None) == (args.from_file is None):
        return _fail("passport: name one GPU of this ledger, or an export with --from FILE", EXIT_USAGE)
    where = f"--from {printable(args.from_file)}" if args.from_file is not None else "passport"
    try:
        if args.from_file is not None:
            source = args.from_file
            if (size := Path(source).stat().st_size) > MAX_EXPORT_BYTES:
                return _fail(f"--from {printable(source)}: {size} bytes: larger than any export gpuwear writes",
                             EXIT_FAILURE)
            export = json.loads(Path(source).read_text(encoding="utf-8"))
        else:
            source = str(ledger_path(config, args.simulated))
            if isinstance(export := _ledger_export(args, config), int):
                return export
        doc = passport.document(export, config.wear, source)
    except RecursionError:
        return _fail(f"{where}: nested too deeply to be an export", EXIT_FAILURE)
    except SchemaError as exc:
        return _fail(f"{where}: refused: {printable(str(exc))}", EXIT_FAILURE)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return _fail(f"{where}: {printable(why)}", EXIT_FAILURE)
    except (LedgerError, sqlite3.Error) as exc:
        return _fail(str(exc), EXIT_FAILURE)
    if args.html is not None:
        try:
            Path(args.html).write_text(page.render(doc, passport=passport.heading_and_lines(doc)), encoding="utf-8")
        except OSError as exc:
            return _fail(f"--html {printable(args.html)}: {exc.strerror or exc}", EXIT_FAILURE)
        print(f"wrote {printable(args.html)}: open it in a browser")
    elif args.json:
        print(json.dumps(doc, indent=2))
    else:
        _show(passport.text(doc), end="")
    return 0


class ExportRefusedError(ValueError):
    """``export --output`` names a file an export must not replace."""


def write_export(path: Path, text: str, state_dir: Path) -> None:
    """Write an export document to a file of its own, atomically (a temporary file beside it, fsync'd, renamed over
    it): never into the state directory (the ledger itself included), never through a symbolic link, and never over
    a file that is not an earlier gpuwear export. Raises ExportRefusedError, or OSError (no such folder, a directory, a
    full disk) with nothing left behind."""
    if path.is_symlink():
        raise ExportRefusedError("is a symbolic link (give the path of the file itself)")
    target = Path(os.path.realpath(path))
    state = Path(os.path.realpath(state_dir))
    if target == state or state in target.parents:
        raise ExportRefusedError(f"is inside the state directory {state} (where the ledger lives): write it elsewhere")
    if target.is_dir():
        raise ExportRefusedError("is a directory (give a file name)")
    if target.exists():
        if not target.is_file():  # a device, a FIFO: never read nor replaced
            raise ExportRefusedError("is not a regular file (leave out --output to print the export)")
        try:
            with target.open("rb") as f:
                head = f.read(200)
        except OSError as exc:
            raise ExportRefusedError(f"exists and cannot be read ({exc.strerror})") from None
        if b'"gpuwear-ledger-export"' not in head:
            raise ExportRefusedError("exists and is not a gpuwear export: refusing to replace it")
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


MAX_EXPORT_BYTES = 64 << 20


def _import_ledger(args: argparse.Namespace, ledger: Ledger) -> int:
    from gpuwear.imports.ledger import import_ledger_export
    from gpuwear.imports.parse import ImportFormatError

    failed = 0
    for name in args.files:
        try:
            size = Path(name).stat().st_size
            if size > MAX_EXPORT_BYTES:
                raise ImportFormatError(f"{size} bytes: larger than any export gpuwear writes "
                                        f"({MAX_EXPORT_BYTES >> 20} MiB at most)")
            doc = json.loads(Path(name).read_text(encoding="utf-8"))
            result = import_ledger_export(doc, f"ledger:{name}", ledger,
                                          allow_simulated=args.allow_simulated or args.simulated is not None)
        except RecursionError:
            print(f"gpuwear: {name}: not imported: nested too deeply to be an export", file=sys.stderr)
            failed += 1
            continue
        except (OSError, UnicodeDecodeError, ValueError, ImportFormatError, sqlite3.Error) as exc:
            print(f"gpuwear: {name}: not imported: {exc}", file=sys.stderr)
            failed += 1
            continue
        _show(f"{name}: GPU {doc['uuid']}: {result['imported']} part(s) imported"
              + (f", {result['skipped']} skipped (already imported)" if result["skipped"] else ""))
    return EXIT_FAILURE if failed else 0


def _import(args: argparse.Namespace) -> int:

    config = _ledger_config(args)
    path = ledger_path(config, args.simulated)
    try:
        lock = StateLock.acquire(path.parent)
    except StateLockedError as exc:  # the daemon's next save would not hold the import: never write under it
        return _fail(f"{exc}; stop the daemon to import (`systemctl stop gpuwear`), then start it again: it "
                     "counts the imported history from its next start", EXIT_FAILURE)
    except (LedgerError, OSError) as exc:
        return _fail(f"cannot open the wear ledger: {exc}", EXIT_FAILURE)
    try:
        return _import_locked(args, config, path)
    finally:
        lock.release()


class _Progress:
    """Rows read, rate and time left of a long import, on one terminal line (stderr is a terminal)."""

    def __init__(self, path: Path) -> None:
        self.path, self.clock = path, time.monotonic
        self.start = self.shown = self.clock()
        self.total: int | None = None
        try:
            with path.open("rb") as f:  # counting lines costs about a second per GB: only when it will help
                if path.stat().st_size > 50 * 2**20:
                    self.total = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 22), b""))
        except OSError:
            pass

    def __call__(self, rows: int) -> None:
        now = self.clock()
        if now - self.shown < 1.0:
            return
        self.shown = now
        rate = rows / max(now - self.start, 1e-9)
        left = f", {(self.total - rows) / rate:.0f} s left" if self.total and self.total > rows else ""
        of = f" of {self.total:,}" if self.total else ""
        print(f"\r{self.path}: {rows:,}{of} rows, {rate:,.0f} rows/s{left}   ", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.shown != self.start:
            print(file=sys.stderr)


class _Said:
    """What an import says of its rows, on stderr: the first SAID_PER_KIND lines of each kind (the message without
    its line number), then one line with how many more there were. A log whose clock was set back an hour said
    "timestamp goes back in time" once for each of its 1,800 later rows."""

    SAID_PER_KIND = 5

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kinds: Counter[str] = Counter()

    def __call__(self, line: str) -> None:
        where, _, message = line.partition(": ")
        kind = message if where.startswith(f"{self.path}:") else line
        self.kinds[kind] += 1
        if self.kinds[kind] <= self.SAID_PER_KIND:
            print(f"gpuwear: {printable(line)}", file=sys.stderr)

    def summary(self) -> None:
        for kind, n in self.kinds.items():
            if n > self.SAID_PER_KIND:
                hint = " (was the log's clock set back?)" if "goes back in time" in kind else ""
                print(f"gpuwear: {printable(str(self.path))}: {n - self.SAID_PER_KIND} more row(s) like those above: "
                      f"{printable(kind)}{hint}", file=sys.stderr)


def _cards_under(gpu: str, files: list[str], ledger: Ledger, config: Config, columns: list[str] | None,
                 tz: datetime.tzinfo | None) -> str:
    """Which different cards the logs to import under one ``--gpu`` name, with the card the ledger knows by that
    UUID (the name column of each log's first CARD_ROWS rows); "" when they name one card or none."""
    from gpuwear.imports.backfill import different_cards
    from gpuwear.imports.parse import ImportedRow, ImportFormatError, read_telemetry_csv

    named: dict[str, str] = {}
    known = ledger.load_all(config.wear.cycles.hysteresis_celsius).get(gpu)
    if known is not None and known.name:
        named.setdefault(known.name, "the ledger")
    for name in files:
        try:
            rows = read_telemetry_csv(Path(name), columns=columns, tz=tz)
            for row in itertools.islice((r for r in rows if isinstance(r, ImportedRow)), CARD_ROWS):
                if row.name:
                    named.setdefault(row.name, name)
        except (ImportFormatError, OSError, UnicodeDecodeError):
            continue  # the import says what is wrong with the file
    cards = different_cards(named)
    return "; ".join(f"{card} in {named[card]}" for card in cards)


CARD_ROWS = 1000  # rows of each log whose card name is compared before an import under --gpu


def _imported_as_another(gpu: str, files: list[str], ledger: Ledger) -> str | None:
    """Why importing ``files`` as GPU ``gpu`` is refused: one of them was imported as another GPU already (by the
    name given then, or the same file), which would make one card's history two cards'; None otherwise."""
    for name in files:
        names = {name, str(Path(name).resolve())}
        others = sorted(ledger.imported_as(names) - {gpu})
        if others:
            return (f"--gpu {gpu}: {name} was imported as GPU {others[0]} already: one log is one card's history, "
                    f"never two; import it as {others[0]}, or `gpuwear forget {others[0]}` first")
    return None


def _import_locked(args: argparse.Namespace, config: Config, path: Path) -> int:
    import zoneinfo

    from gpuwear.imports.parse import ImportFormatError
    from gpuwear.imports.reader import import_file

    if args.format == "nvidia-smi" and args.max_gap is not None and not 0 < args.max_gap <= 86400:
        return _fail(f"--max-gap: expected seconds between 0 and 86400, got {args.max_gap:g}", EXIT_USAGE)
    if args.format == "ledger":
        try:
            ledger = Ledger.open(path)
        except (LedgerError, OSError, sqlite3.Error) as exc:
            return _fail(f"cannot open the wear ledger: {exc}", EXIT_FAILURE)
        try:
            return _import_ledger(args, ledger)
        finally:
            ledger.close()
    tz = None
    if args.timezone:
        try:
            tz = zoneinfo.ZoneInfo(args.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            return _fail(f"--timezone: unknown time zone {args.timezone!r}", EXIT_USAGE)
    columns = [c.strip() for c in args.columns.split(",")] if args.columns else None
    try:
        ledger = Ledger.open(path)
    except (LedgerError, OSError, sqlite3.Error) as exc:
        return _fail(f"cannot open the wear ledger: {exc}", EXIT_FAILURE)
    gpu = args.gpu
    if gpu is not None:  # a GPU the ledger knows (by index, UUID or its start), else the UUID of a card it does not
        try:
            gpu = select_gpu(gpu, ledger.load_all(config.wear.cycles.hysteresis_celsius))
        except NoSuchGpuError as exc:
            if not gpu.startswith("GPU-"):  # an index, or any text: a card the ledger does not know needs its UUID
                ledger.close()
                return _fail(f"{exc}; for a card the ledger does not know yet, give its UUID (nvidia-smi -L: "
                             "GPU-...)", EXIT_USAGE)
        except ValueError as exc:
            ledger.close()
            return _fail(str(exc), EXIT_USAGE)
    if gpu is not None and (cards := _cards_under(gpu, args.files, ledger, config, columns, tz)):
        ledger.close()
        return _fail(f"--gpu {gpu}: {cards}: logs of different cards are never merged; import each card's logs "
                     "with its own --gpu", EXIT_USAGE)
    if gpu is not None and (twice := _imported_as_another(gpu, args.files, ledger)):
        ledger.close()
        return _fail(twice, EXIT_USAGE)
    zone = f"{args.timezone} (--timezone)" if args.timezone else \
        f"this machine's zone, {datetime.datetime.now().astimezone().tzname()} (--timezone names another)"
    failed = 0
    try:
        for name in args.files:
            path = Path(name)
            progress = _Progress(path) if sys.stderr.isatty() else None
            said = _Said(path)
            try:
                result = import_file(path, ledger, config.wear, gpu=gpu, columns=columns, tz=tz,
                                     max_gap=args.max_gap, say=said, progress=progress)
            except (ImportFormatError, OSError) as exc:
                print(f"gpuwear: {path}: not imported: {exc}", file=sys.stderr)
                failed += 1
                continue
            except sqlite3.Error as exc:
                print(f"gpuwear: {path}: not imported: the ledger cannot be written ({exc})", file=sys.stderr)
                failed += 1
                continue
            finally:
                if progress is not None:
                    progress.done()
                said.summary()
            _show(f"{path}: timestamps without a UTC offset read in {zone}")
            for uuid, rows in result.imported.items():
                skipped = result.skipped.get(uuid, 0)
                _, gap = result.cadence[uuid]
                median = result.median_interval.get(uuid)
                every = f"a row every {median:.3g} s (median), " if median is not None else ""
                _show(f"{path}: GPU {uuid}: {rows} row(s) imported"
                      + (f", {skipped} skipped (already imported)" if skipped else "")
                      + f" ({every}pauses over {gap:g} s not counted as observed)")
                excluded = result.excluded.get(uuid)
                if excluded:
                    _show(f"{path}: GPU {uuid}: not believed: "
                          + ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(excluded.items()))
                          + " (docs/wear-model.md)")
            if result.problems or result.dropped:
                print(f"{path}: {result.problems} bad row(s) skipped, {result.dropped} out-of-range reading(s) "
                      "dropped")
            if result.reader.startswith("rows: ") and result.reader != "rows: rows only":
                _show(f"{path}: read row by row, more slowly ({result.reader[6:]}); the figures are the same")
    finally:
        ledger.close()
    return EXIT_FAILURE if failed else 0


def _forget(args: argparse.Namespace) -> int:
    config = _ledger_config(args)
    path = ledger_path(config, args.simulated)
    if not path.exists():
        return _fail(f"no ledger at {path}", EXIT_FAILURE)
    try:
        lock = StateLock.acquire(path.parent)
    except StateLockedError as exc:
        return _fail(f"{exc}; stop the daemon first (`systemctl stop gpuwear`): it would save the GPU again",
                     EXIT_FAILURE)
    except (LedgerError, OSError) as exc:
        return _fail(f"cannot open the wear ledger: {exc}", EXIT_FAILURE)
    try:
        ledger = Ledger.open(path)
        try:
            wears = ledger.load_all(config.wear.cycles.hysteresis_celsius)
            try:
                uuid = select_gpu(args.gpu, wears)
            except ValueError as exc:
                return _fail(str(exc).replace("--gpu ", "") + f" in {path}", EXIT_USAGE)
            w = wears[uuid]
            what = f"GPU {uuid} ({w.name or 'unknown name'}, {w.observed_seconds / 3600:.1f} h observed)"
            if not args.yes:
                if not sys.stdin.isatty():
                    return _fail(f"forgetting {what} cannot be undone: pass --yes to confirm (no terminal to ask)",
                                 EXIT_USAGE)
                answer = input(f"Forget {what}: its history, imports, events and job shares? It cannot be undone. "
                               "[y/N] ")
                if answer.strip().lower() not in ("y", "yes"):
                    print("nothing forgotten")
                    return 0
            removed = ledger.forget(uuid)
        finally:
            ledger.close()
    except (LedgerError, sqlite3.Error, OSError) as exc:
        return _fail(f"cannot forget: {exc}", EXIT_FAILURE)
    finally:
        lock.release()
    print(f"forgot {what}: " + ", ".join(f"{n} {kind}" for kind, n in removed.items()))
    return 0


def _secret(path: str | None, flag: str) -> str | None:
    """A token or password from a file (its first line), or None; OSError names the flag."""
    if path is None:
        return None
    try:
        return Path(path).read_text().splitlines()[0].strip() if Path(path).stat().st_size else ""
    except (OSError, UnicodeDecodeError, IndexError) as exc:
        raise OSError(f"{flag} {path}: {getattr(exc, 'strerror', None) or exc}") from None


FLEET_CANNOT_SEE = ["cards never scraped into this store",
                    "a card's history before gpuwear first read it (what it carried then is in its passport: "
                    "`gpuwear passport GPU` on its node)",
                    "daemons older than the lifetime series (no gpuwear_lifetime_observed_seconds_total)",
                    "incidents of a span the store no longer holds",
                    "XIDs counted by daemons before 2026-12-07 (their XID counts began at each start, not with the "
                    "card's life)"]


def _fleet(args: argparse.Namespace) -> int:
    from gpuwear.fleet.answer import answer, card_lines, words
    from gpuwear.fleet.client import FleetError, Store, figures
    from gpuwear.jobs.report import parse_duration

    try:
        span = parse_duration(args.span)
    except ValueError as exc:
        return _fail(f"--span: {exc}", EXIT_USAGE)
    if (args.basic_user is None) != (args.basic_password_file is None):
        return _fail("--basic-user and --basic-password-file go together", EXIT_USAGE)
    try:
        token = _secret(args.bearer_token_file, "--bearer-token-file")
        password = _secret(args.basic_password_file, "--basic-password-file")
        store = Store(args.prometheus, token, (args.basic_user, password or "") if args.basic_user else None,
                      args.ca_file, args.tenant)
        got = figures(store, span)
    except (OSError, FleetError) as exc:
        return _fail(str(exc), 1)
    doc = answer(got.cards)
    start = got.at - got.span_seconds
    short = got.earliest is not None and got.earliest > start + 2 * 3600
    begins = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(got.earliest or 0))
    retention = (None if not short else f"the store's data begins {begins}: the {args.span} asked reach before it "
                 "(its retention?); a card it holds from then is counted from its first sight, by its ledger's "
                 "lifetime figures (exposure and incidents alike)")
    result = {"schema_version": 1, "store": args.prometheus, "source": got.source, "span_seconds": got.span_seconds,
              "at": got.at, "earliest": got.earliest, "retention_short": retention,
              "cards": [vars(c) for c in got.cards], **doc, "cannot_see": FLEET_CANNOT_SEE,
              "cost": {"queries": store.queries, "bytes": store.bytes}}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if args.html is not None:
        from gpuwear.fleet.html import render

        try:
            Path(args.html).write_text(render(result, args.span), encoding="utf-8")
        except OSError as exc:
            return _fail(f"--html {printable(args.html)}: {exc.strerror or exc}", EXIT_FAILURE)
        print(f"wrote {printable(args.html)}: open it in a browser")
        return 0
    lines = [f"{len(got.cards)} card(s) in {args.prometheus}, over the last {args.span} (from its {got.source}; "
             "a card first held within it: from its first sight)"]
    if retention:
        lines.append(retention)
    if not got.cards:
        lines.append("no gpuwear card in the span: is the store scraping gpuwear (job gpuwear), and for this long?")
    else:
        lines += words(doc)
        lines.append("Every card (the verdict's reasons while in the span, by code: `gpuwear report` on its node "
                     "says each):")
        lines += card_lines(got.cards)
    lines.append("It cannot see: " + "; ".join(FLEET_CANNOT_SEE) + ".")
    lines.append(f"({store.queries} queries, {store.bytes} bytes read)")
    _show("\n".join(lines))
    return 0


COMMANDS = {"run": _run, "report": _report, "jobs": _jobs, "import": _import, "export": _export, "passport": _passport,
            "forget": _forget, "doctor": _doctor, "check-config": _check_config, "fleet": _fleet}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:  # any command's config file: every problem, one line each
        return _config_problems(args.file if args.command == "check-config" else args.config, exc)
    except (LedgerError, sqlite3.Error) as exc:  # a ledger damaged in a way the command did not expect: one line
        print(f"gpuwear: ledger: {printable(str(exc))[:500]}", file=sys.stderr)
        return 1
    except UnicodeDecodeError as exc:  # SQLite's message about a damaged page, with the page's bytes in it
        print(f"gpuwear: bytes that are not UTF-8 text ({exc.reason}): a damaged ledger? the daemon recovers one "
              "at its next start", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `gpuwear report | head`: the reader left (whatever was to be saved is saved)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that exit's flush does not fail again
        return EXIT_SIGPIPE

