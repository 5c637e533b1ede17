"""`gpuwear import nvidia-smi`: backfill the ledger from telemetry CSV logs.

Each file's rows are accumulated per GPU in an accumulator of their own and stored as an
import (a separate table): the live history is never rewritten, and reports merge both.
A GPU is the UUID in the log; else the ledger GPU last seen at the log's PCI bus id; else
(index only) an "imported:" key made of the GPU name and index, or the UUID given with
``--gpu``. Rows inside a time interval the ledger already observed for that GPU, live or
imported (``Ledger.covered``), are skipped, so importing a file twice, an overlapping longer
log, or a log of time the daemon itself sampled never counts twice; a log of a gap is taken.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.importer import ImportedRow, ImportFormatError, RowProblem, read_telemetry_csv
from gpuwear.ledger import EXPORT_VERSION, Ledger
from gpuwear.sample import GpuSample, validated
from gpuwear.wear.accumulate import SCHEMA as WEAR_SCHEMA
from gpuwear.wear.accumulate import GpuWear
from gpuwear.wear.schema import SchemaError, check_export


@dataclass
class _Gpu:
    uuid: str
    wear: GpuWear
    spans: list[tuple[float, float]]
    first: float | None = None
    last: float | None = None
    rows: int = 0
    skipped: int = 0
    dropped: int = 0
    previous: float | None = None


@dataclass
class FileResult:
    """What one file gave: per GPU UUID, rows imported and rows skipped as already imported."""

    path: Path
    imported: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    problems: int = 0
    dropped: int = 0


def _resolve(row: ImportedRow, known: dict[str, GpuWear], gpu: str | None) -> str:
    if gpu is not None:
        return gpu
    uuid = row.identity.get("uuid")
    if uuid:
        return str(uuid)
    bus = row.identity.get("pci_bus_id")
    if bus:
        for w in known.values():
            if w.pci_bus_id and w.pci_bus_id.lower() == str(bus).lower():
                return w.uuid
        return f"imported:{bus}"
    return f"imported:{row.name or 'GPU'}:{row.identity.get('index', 0)}"


def import_file(path: Path, ledger: Ledger, params: WearConfig, *, gpu: str | None = None,
                columns: list[str] | None = None, tz: datetime.tzinfo | None = None,
                say: Callable[[str], None] = print) -> FileResult:
    """Import one file into ``ledger`` (one transaction). Raises ``ImportFormatError`` when
    the file as a whole cannot be used; a bad row is reported through ``say`` and skipped."""
    gate = params.cycles.hysteresis_celsius
    known = ledger.load(gate)
    gpus: dict[str, _Gpu] = {}
    result = FileResult(path)
    resolved: dict[tuple[str, str | None], str] = {}  # (row's GPU key, name) -> ledger UUID: the same few each row
    for item in read_telemetry_csv(path, columns=columns, tz=tz):
        if isinstance(item, RowProblem):
            result.problems += 1
            say(f"{path}:{item.line}: {item.message}; row skipped")
            continue
        uuid = resolved.get((item.gpu, item.name))
        if uuid is None:
            uuid = resolved[item.gpu, item.name] = _resolve(item, known, gpu)
        g = gpus.get(uuid)
        if g is None:
            g = gpus[uuid] = _Gpu(uuid, GpuWear(uuid, gate_celsius=gate), ledger.covered(uuid))
        if g.spans and any(a <= item.timestamp <= b for a, b in g.spans):
            g.skipped += 1
            g.previous = None  # the next row after covered time starts afresh: no interval across it
            continue
        values, dropped = validated(item.values)
        g.dropped += len(dropped)
        sample = GpuSample.of(item.timestamp, item.timestamp, values)
        dt = 0.0 if g.previous is None else item.timestamp - g.previous
        if dt < 0:
            result.problems += 1
            say(f"{path}:{item.line}: timestamp goes back in time for GPU {uuid}; row skipped")
            continue
        if dt > params.max_gap_seconds:
            g.wear.gap(dt)
            dt = 0.0
        g.wear.add(sample, dt)
        g.wear.name = g.wear.name or (item.name or "")
        g.previous = item.timestamp
        g.first = item.timestamp if g.first is None else g.first
        g.last = item.timestamp
        g.rows += 1
    imports = []
    for g in gpus.values():
        if g.first is not None and g.last is not None:
            imports.append((g.uuid, str(path), g.first, g.last, g.rows, g.wear.to_json()))
    ledger.save([], [], imports)
    for g in gpus.values():
        result.imported[g.uuid] = g.rows
        result.skipped[g.uuid] = g.skipped
        result.dropped += g.dropped
    return result


def import_ledger_export(doc: Any, source: str, ledger: Ledger) -> dict[str, int]:
    """Import a `gpuwear export` document, validated whole first (:func:`check_export`: one bad value refuses the
    file, nothing is written). Each part of the card's history becomes an import unless its time span overlaps
    history this ledger already holds for the card (its live span, earlier imports, or an earlier part of this
    file): accumulators cannot be split in time, so an overlapping part is skipped whole and never counted twice.
    Returns parts imported and skipped."""
    try:
        check_export(doc, EXPORT_VERSION, WEAR_SCHEMA)
    except SchemaError as exc:
        raise ImportFormatError(str(exc)) from None
    uuid = str(doc["uuid"])
    covered = ledger.covered(uuid)
    imports = []
    skipped = 0
    for part in doc["parts"]:
        first, last = part.get("first_seen"), part.get("last_seen")
        if first is None or last is None:
            continue
        # the part's whole span, not the intervals it says it observed: a file cannot talk its way past what the
        # ledger holds, and a part cannot be split in time anyway
        if any(a <= last and first <= b for a, b in covered):
            skipped += 1
            continue
        covered.append((first, last))
        imports.append((uuid, source, first, last, 0, part))
    ledger.save([], [], imports)
    return {"imported": len(imports), "skipped": skipped}
