"""The one validator of everything the ledger reads: a GPU's accumulators (``GpuWear.to_json()``), as stored in
SQLite or carried in an export file, and the export document around them.

Field by field: types, finite numbers, non-negative durations and counts, timestamps within a sane window, and
bounded sizes (keys per map, list lengths, string lengths). The first problem raises :class:`SchemaError` naming
where it is (``parts[1].temperature_seconds.gpu.85``) and what is wrong, so that one bad value refuses the whole
record or file. Plain code, no library: the accumulators' shape is small and fixed, and a schema library would be
a dependency of the daemon for one function.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Any

# Unix times outside [2000-01-01, 2100-01-01) are corrupt, not merely a wrong clock (which the daemon handles at
# sampling time, where it can tell); no clock is read here.
EARLIEST_WALL = 946_684_800.0
LATEST_WALL = 4_102_444_800.0
MAX_SECONDS = 1e11  # about 3,000 years of seconds: any duration above is corrupt
MAX_JOULES = 1e15
MAX_COUNT = 1e12
MAX_KEYS = 20_000  # per map: 1 °C bins, (range, peak) bins and days stay far below
MAX_TEXT = 256
MAX_PARTS = 1_000
MAX_EVENTS = 200_000
MAX_FANS = 16
MAX_INTERVALS = 100_000  # observed intervals of one GPU: one per start or gap
INCIDENTS_KEPT = 64  # a GPU's newest incidents kept in its record (GpuWear.incidents)
ERROR_DAYS_KEPT = 62  # the UTC days of error counts a GPU's record keeps (GpuWear.error_days)
# incidents this close after the one before are one episode (a fault reported by the XID, then by a counter read on
# the 30 s slow interval, or by the kernel log a few seconds apart): one reset, not two
INCIDENT_EPISODE_SECONDS = 600.0
# XIDs NVIDIA's NVSentinel calls sticky (a fault that keeps reporting until the GPU is reset: NVLink errors, fallen
# off the bus, uncontained ECC errors, 109, GSP timeouts): one after another within this long is one episode
STICKY_XIDS = frozenset({74, 79, 95, 109, 119})
STICKY_EPISODE_SECONDS = 3 * 3600.0
SENSORS = ("gpu", "memory")
KINDS = ("job", "idle", "unattributed")
READING_GROUPS = ("clock_event_reasons", "temperature_memory", "ecc", "fans", "power", "utilization")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_CYCLE = re.compile(r"-?\d{1,3}:-?\d{1,3}")
_INT = re.compile(r"-?\d{1,6}")


class SchemaError(ValueError):
    """A record or file that does not have the accumulators' shape: ``where`` and ``problem``."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where, self.problem = where, problem


def _join(where: str, key: str | int) -> str:
    return f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key


def number(value: Any, where: str, low: float = 0.0, high: float = MAX_SECONDS) -> float:
    """A finite number (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(where, f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise SchemaError(where, f"expected a finite number, got {value}")
    if not low <= value <= high:
        raise SchemaError(where, f"{value:g} is outside [{low:g}, {high:g}]")
    return float(value)


def integer(value: Any, where: str, low: int = 0, high: float = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SchemaError(where, f"expected a whole number, got {value!r}"[:120])
    number(value, where, low, high)
    return int(value)


def text(value: Any, where: str, optional: bool = False, limit: int = MAX_TEXT) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise SchemaError(where, f"expected text, got {type(value).__name__}")
    if len(value) > limit:
        raise SchemaError(where, f"text of {len(value)} characters (at most {limit})")
    return value


def wall(value: Any, where: str, optional: bool = True) -> float | None:
    """A Unix time in [2000, 2100)."""
    if value is None and optional:
        return None
    return number(value, where, EARLIEST_WALL, LATEST_WALL)


def mapping(value: Any, where: str, keys: Callable[[str], bool] | None = None,
            values: Callable[[Any, str], Any] | None = None, limit: int = MAX_KEYS) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SchemaError(where, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str) or (keys is not None and not keys(key)):
            # the key's own path, so that the one bad key can be taken out (ledger._salvage), not its whole map
            raise SchemaError(_join(where, key) if isinstance(key, str) else where, f"unexpected key {key!r}"[:120])
    if len(value) > limit:
        raise SchemaError(where, f"{len(value)} keys (at most {limit})")
    if values is not None:
        for key, item in value.items():
            values(item, _join(where, key))
    return value


def _seconds(value: Any, where: str) -> float:
    return number(value, where)


def _histogram(value: Any, where: str) -> dict[str, Any]:
    """Whole-°C (or whole-%) bin -> seconds."""
    return mapping(value, where, lambda k: bool(_INT.fullmatch(k)), _seconds)


def _per_sensor(bins: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    return lambda value, where: mapping(value, where, lambda k: k in SENSORS, bins)


def _cycles(value: Any, where: str) -> dict[str, Any]:
    return mapping(value, where, lambda k: bool(_CYCLE.fullmatch(k)),
                   lambda v, w: number(v, w, 0.0, MAX_COUNT))


def _rainflow(value: Any, where: str) -> None:
    mapping(value, where, lambda k: k in ("gate", "stack", "extreme", "direction"))
    stack = value.get("stack", [])
    if not isinstance(stack, list) or len(stack) > 10_000:
        raise SchemaError(_join(where, "stack"), "expected a list of at most 10000 temperatures")
    for i, t in enumerate(stack):
        number(t, _join(_join(where, "stack"), i), -100.0, 300.0)
    if value.get("extreme") is not None:
        number(value["extreme"], _join(where, "extreme"), -100.0, 300.0)
    integer(value.get("direction", 0), _join(where, "direction"), -1, 1)
    number(value.get("gate", 0.0), _join(where, "gate"), 0.0, 100.0)


def _fan(value: Any, where: str) -> None:
    mapping(value, where, lambda k: k in ("on_seconds", "revolutions", "rpm_seconds", "ratio_seconds"), _seconds)


def _thermal_day(value: Any, where: str) -> None:
    if not isinstance(value, list) or len(value) != 3:
        raise SchemaError(where, "expected [seconds, sum of r, sum of r squared]")
    number(value[0], _join(where, 0))
    number(value[1], _join(where, 1), -MAX_SECONDS, MAX_SECONDS)
    number(value[2], _join(where, 2), 0.0, MAX_SECONDS)


def _health_value(value: Any, where: str) -> None:
    if not isinstance(value, bool):
        integer(value, where)


_FIRMWARE_KEYS = ("vbios", "inforom_image", "inforom_checksum", "inforom_valid")  # sample.FIRMWARE


def _firmware_value(value: Any, where: str) -> None:
    """A firmware reading: a version (text), a checksum (a whole number below 2**32) or a validity (a boolean)."""
    if isinstance(value, str):
        text(value, where, limit=64)
    elif not isinstance(value, bool):
        integer(value, where, 0, 2**32 - 1)


def _firmware_read(value: Any, where: str) -> None:
    mapping(value, where, lambda k: k in _FIRMWARE_KEYS or k in ("at", "driver"))  # driver: first sight's
    for key, item in value.items():
        if key == "at":
            wall(item, _join(where, key), optional=False)
        elif key == "driver":
            text(item, _join(where, key), limit=64)
        else:
            _firmware_value(item, _join(where, key))


def _firmware_change(value: Any, where: str) -> None:
    if not isinstance(value, list) or len(value) != 3:
        raise SchemaError(where, "expected [from, to, wall time]")
    _firmware_value(value[0], _join(where, 0))
    _firmware_value(value[1], _join(where, 1))
    wall(value[2], _join(where, 2), optional=False)


def _firmware(value: Any, where: str) -> None:
    """GpuWear.firmware: "first" and "now" readings, and the latest "changed" of each field."""
    mapping(value, where, lambda k: k in ("first", "now", "changed"))
    for key in ("first", "now"):
        if key in value:
            _firmware_read(value[key], _join(where, key))
    if "changed" in value:
        mapping(value["changed"], _join(where, "changed"), lambda k: k in _FIRMWARE_KEYS, _firmware_change)


def _kind(value: Any, where: str) -> None:
    mapping(value, where, lambda k: k in ("seconds", "energy_joules", "temperature_seconds"))
    number(value.get("seconds", 0.0), _join(where, "seconds"))
    number(value.get("energy_joules", 0.0), _join(where, "energy_joules"), 0.0, MAX_JOULES)
    _histogram(value.get("temperature_seconds", {}), _join(where, "temperature_seconds"))


_SECONDS_FIELDS = ("observed_seconds", "down_seconds", "gap_seconds", "energy_counter_seconds",
                   "energy_integrated_seconds", "power_limit_seconds", "power_seconds", "start_gap",
                   "skipped_seconds")
_MAPS: dict[str, Callable[[Any, str], Any]] = {
    "utilization_seconds": _histogram,
    "temperature_seconds": _per_sensor(_histogram),
    "cycles": _per_sensor(_cycles),
    "rainflow": lambda v, w: mapping(v, w, lambda k: k in SENSORS, _rainflow),
    "throttle_seconds": lambda v, w: mapping(v, w, lambda k: len(k) <= 64, _seconds),
    "violation_seconds": lambda v, w: mapping(v, w, lambda k: k in ("power", "thermal"), _seconds),
    "thermal_resistance": lambda v, w: mapping(v, w, lambda k: bool(_DAY.fullmatch(k)), _thermal_day),
    "thresholds": lambda v, w: mapping(v, w, lambda k: len(k) <= 64, lambda x, p: number(x, p, -100.0, 1e5)),
    "health": lambda v, w: mapping(v, w, lambda k: len(k) <= 64, _health_value),
    "firmware": _firmware,
    "xids": lambda v, w: mapping(v, w, lambda k: bool(_INT.fullmatch(k)), lambda x, p: integer(x, p)),
    "seen": lambda v, w: mapping(v, w, lambda k: k in READING_GROUPS, lambda x, p: integer(x, p)),
    "last_event": lambda v, w: mapping(v, w, lambda k: len(k) <= 64, lambda x, p: wall(x, p, optional=False)),
    "kinds": lambda v, w: mapping(v, w, lambda k: k in KINDS, _kind),
    "incidents": lambda v, w: mapping(v, w, _is_wall_key, lambda x, p: text(x, p, limit=64), limit=INCIDENTS_KEPT),
    "error_counts": lambda v, w: mapping(v, w, lambda k: len(k) <= 32, _error_counts, limit=16),
    "slow_reads": lambda v, w: mapping(v, w, lambda k: k in ("loaded", "idle"), lambda x, p: mapping(
        x, p, lambda k: k in ("0.1", "1", "10"), lambda n, q: integer(n, q))),
    "error_days": lambda v, w: mapping(v, w, lambda k: bool(_DAY.fullmatch(k)), _error_day, limit=ERROR_DAYS_KEPT),
    "health_days": lambda v, w: mapping(v, w, lambda k: bool(_DAY.fullmatch(k)), _health_day, limit=ERROR_DAYS_KEPT),
    "covered": lambda v, w: mapping(v, w, _is_wall_key, lambda x, p: wall(x, p, optional=False),
                                    limit=MAX_INTERVALS),
}
_KNOWN = {"schema", "uuid", "name", "serial", "pci_bus_id", "index", "first_seen", "last_seen", "gaps", "lost_events",
          "energy_joules", "fans", "thermal", "gate_celsius", *_SECONDS_FIELDS, *_MAPS}


# the idle baseline's figures; and the state of its runs that the first releases (797f9a4) kept in the record, read
# and dropped since (GpuWear.from_json ignores them)
_THERMAL_KEYS = ("idle_celsius", "idle_watts", "idle_run", "load_run", "last_celsius")


def check_wear(doc: Any, where: str = "", schema: int = 1) -> Any:
    """Validate one GPU's accumulators; returns ``doc`` unchanged, raises :class:`SchemaError`."""
    mapping(doc, where, lambda k: k in _KNOWN, limit=len(_KNOWN))
    if doc.get("schema") != schema:
        raise SchemaError(_join(where, "schema"), f"unknown accumulator schema {doc.get('schema')!r} "
                                                  f"(this gpuwear reads {schema})")
    text(doc.get("uuid"), _join(where, "uuid"), limit=128)
    if not doc["uuid"]:
        raise SchemaError(_join(where, "uuid"), "empty")
    text(doc.get("name", ""), _join(where, "name"))
    text(doc.get("serial"), _join(where, "serial"), optional=True)
    text(doc.get("pci_bus_id"), _join(where, "pci_bus_id"), optional=True, limit=64)
    if doc.get("index") is not None:
        integer(doc["index"], _join(where, "index"), high=4095)
    first = wall(doc.get("first_seen"), _join(where, "first_seen"))
    last = wall(doc.get("last_seen"), _join(where, "last_seen"))
    if first is not None and last is not None and first > last:
        raise SchemaError(_join(where, "first_seen"), "after last_seen")
    for key in _SECONDS_FIELDS:
        number(doc.get(key, 0.0), _join(where, key))
    number(doc.get("energy_joules", 0.0), _join(where, "energy_joules"), 0.0, MAX_JOULES)
    integer(doc.get("gaps", 0), _join(where, "gaps"))
    integer(doc.get("lost_events", 0), _join(where, "lost_events"))
    for key, check in _MAPS.items():
        check(doc.get(key, {}), _join(where, key))
    fans = doc.get("fans", [])
    if not isinstance(fans, list) or len(fans) > MAX_FANS:
        raise SchemaError(_join(where, "fans"), f"expected a list of at most {MAX_FANS} fans")
    for i, fan in enumerate(fans):
        _fan(fan, _join(_join(where, "fans"), i))
    thermal = mapping(doc.get("thermal", {}), _join(where, "thermal"), lambda k: k in _THERMAL_KEYS)
    for key in _THERMAL_KEYS:
        if thermal.get(key) is not None:
            number(thermal[key], _join(_join(where, "thermal"), key), *((0.0, 1e10) if key.endswith("_run") else
                                                                         (-100.0, 1e5)))
    number(doc.get("gate_celsius", 2.0), _join(where, "gate_celsius"), 0.0, 100.0)
    for start, end in doc.get("covered", {}).items():  # observed intervals: ordered, inside the record's span
        if end < float(start) or (first is not None and float(start) < first - 1.0) \
                or (last is not None and end > last + 1.0):
            raise SchemaError(_join(_join(where, "covered"), start), "an interval outside the record's span")
    return doc


def check_import(uuid: Any, first: Any, last: Any, rows: Any, wear: Any, schema: int = 1) -> None:
    """Validate one stored import (a log's history of one GPU): its GPU, span, row count and accumulators."""
    text(uuid, "uuid", limit=128)
    start = wall(first, "first", optional=False)
    end = wall(last, "last", optional=False)
    if start is not None and end is not None and start > end:
        raise SchemaError("first", "after last")
    integer(rows, "rows")
    check_wear(wear, "wear", schema)


def check_event(doc: Any, where: str) -> Any:
    mapping(doc, where, lambda k: k in ("wall", "kind", "detail"), limit=3)
    wall(doc.get("wall"), _join(where, "wall"), optional=False)
    text(doc.get("kind"), _join(where, "kind"), limit=64)
    detail = mapping(doc.get("detail", {}), _join(where, "detail"), limit=64)
    for key, value in detail.items():
        if not (value is None or isinstance(value, (bool, str)) or (isinstance(value, (int, float))
                and math.isfinite(value))):
            raise SchemaError(_join(_join(where, "detail"), key), "expected a number, text or flag")
    return doc


def checksum(doc: dict[str, Any]) -> str:
    """The integrity checksum of an export document (version 2 on): SHA-256 of its canonical JSON (keys sorted, no
    spaces), the checksum itself left out. It detects damage, not forgery: anyone can compute it again."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def check_export(doc: Any, export_version: int, schema: int = 1) -> dict[str, Any]:
    """Validate a ``gpuwear export`` document: its version first (a newer one says so before any key it adds), its
    checksum (version 2 on), its parts (each a GPU's accumulators, none a duplicate of another) and events. Raises
    :class:`SchemaError` at the first problem."""
    if not isinstance(doc, dict) or doc.get("format") != "gpuwear-ledger-export":
        raise SchemaError("", "not a gpuwear ledger export (gpuwear export UUID)")
    version = integer(doc.get("version"), "version", 1, 10**6)
    if version > export_version:
        raise SchemaError("version", f"written by a newer gpuwear (export version {version}; this one reads "
                                     f"{export_version}): upgrade gpuwear to import it")
    keys = ("format", "version", "uuid", "parts", "events", "simulated") + \
        (("exported_at", "checksum") if version >= 2 else ()) + (("host",) if version >= 3 else ())
    mapping(doc, "", lambda k: k in keys, limit=len(keys))
    if "simulated" in doc and doc["simulated"] is not True:
        raise SchemaError("simulated", "present only as true (the history of simulated GPUs)")
    if version >= 2:
        wall(doc.get("exported_at"), "exported_at", optional=False)
        if not isinstance(doc.get("checksum"), str) or doc["checksum"] != checksum(doc):
            raise SchemaError("checksum", "missing or not the file's own: the file was changed or damaged after "
                                          "export")
    if version >= 3:
        text(doc.get("host"), "host", limit=255)
    uuid = text(doc.get("uuid"), "uuid", limit=128)
    parts = doc.get("parts")
    if not isinstance(parts, list) or not parts or len(parts) > MAX_PARTS:
        raise SchemaError("parts", f"expected a list of 1 to {MAX_PARTS} parts")
    seen: dict[str, int] = {}
    for i, part in enumerate(parts):
        check_wear(part, f"parts[{i}]", schema)
        if part["uuid"] != uuid:
            raise SchemaError(f"parts[{i}].uuid", f"{part['uuid']!r} is not the export's GPU {uuid!r}")
        key = repr(sorted(part.items()))
        if key in seen:
            raise SchemaError(f"parts[{i}]", f"the same part as parts[{seen[key]}]")
        seen[key] = i
    events = doc.get("events", [])
    if not isinstance(events, list) or len(events) > MAX_EVENTS:
        raise SchemaError("events", f"expected a list of at most {MAX_EVENTS} events")
    for i, event in enumerate(events):
        check_event(event, f"events[{i}]")
    return doc


def _error_day(value: Any, where: str) -> None:
    """One UTC day of error_days: counter -> [loaded s, loaded events], each a number of 0 or more."""
    mapping(value, where, lambda k: len(k) <= 32, _error_day_counts, limit=16)


def _error_day_counts(value: Any, where: str) -> None:
    if not isinstance(value, list) or len(value) != 2:
        raise SchemaError(where, "expected [loaded seconds, loaded events]")
    for i, x in enumerate(value):
        number(x, _join(where, i), 0.0, 1e18)


HEALTH_DAY_KEYS = ("busy", "throttled")


def _health_day(value: Any, where: str) -> None:
    """One UTC day of health_days: busy and thermally throttled seconds, stalls [under load, idle], and the die's
    seconds by whole °C near and above its slowdown temperature ("hot")."""
    mapping(value, where, lambda k: k in (*HEALTH_DAY_KEYS, "stalls", "hot"), limit=4)
    for key in HEALTH_DAY_KEYS:
        if key in value:
            number(value[key], _join(where, key))
    if "stalls" in value:
        stalls = value["stalls"]
        if not isinstance(stalls, list) or len(stalls) != 2:
            raise SchemaError(_join(where, "stalls"), "expected [under load, idle]")
        for i, n in enumerate(stalls):
            integer(n, _join(_join(where, "stalls"), i))
    if "hot" in value:
        _histogram(value["hot"], _join(where, "hot"))


def _error_counts(value: Any, where: str) -> None:
    """[loaded s, loaded events, idle s, idle events], each a number of 0 or more."""
    if not isinstance(value, list) or len(value) != 4:
        raise SchemaError(where, "expected [loaded seconds, loaded events, idle seconds, idle events]")
    for i, x in enumerate(value):
        number(x, _join(where, i), 0.0, 1e18)


def _is_wall_key(key: str) -> bool:
    try:
        return EARLIEST_WALL <= float(key) < LATEST_WALL
    except ValueError:
        return False


def _job_gpu(value: Any, where: str) -> None:
    mapping(value, where, lambda k: k in ("uuid", "start", "end", "wear", "max_celsius", "events"), limit=6)
    text(value.get("uuid"), _join(where, "uuid"), limit=128)
    wall(value.get("start"), _join(where, "start"), optional=False)
    wall(value.get("end"), _join(where, "end"))
    check_wear(value.get("wear"), _join(where, "wear"))
    mapping(value.get("max_celsius", {}), _join(where, "max_celsius"), lambda k: k in SENSORS,
            lambda x, p: number(x, p, -100.0, 300.0))
    mapping(value.get("events", {}), _join(where, "events"), lambda k: len(k) <= 64, lambda x, p: integer(x, p))


def check_job(doc: Any, where: str = "") -> Any:
    """Validate a job record (``JobRecord.to_json()``): its identity, times and each GPU's accumulators."""
    mapping(doc, where, lambda k: k in ("record", "kind", "id", "user", "name", "start", "last_seen", "end",
                                        "gpus"), limit=9)
    for key in ("record", "kind", "id"):
        text(doc.get(key), _join(where, key), limit=512)
    for key in ("user", "name"):
        text(doc.get(key), _join(where, key), optional=True, limit=512)
    start = wall(doc.get("start"), _join(where, "start"), optional=False)
    wall(doc.get("last_seen"), _join(where, "last_seen"), optional=False)
    end = wall(doc.get("end"), _join(where, "end"))
    if start is not None and end is not None and end < start:
        raise SchemaError(_join(where, "end"), "before start")
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > 64:
        raise SchemaError(_join(where, "gpus"), "expected a list of at most 64 GPUs")
    for i, gpu in enumerate(gpus):
        _job_gpu(gpu, _join(_join(where, "gpus"), i))
    return doc
