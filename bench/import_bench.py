"""The nvidia-smi CSV parser alone, and the floor under it.

    python bench/import_bench.py parse FILE   # iterate gpuwear.importer.read_telemetry_csv
    python bench/import_bench.py csv FILE     # iterate the stdlib csv.reader over the same file
    python bench/import_bench.py floats FILE  # csv.reader, and float() of the numeric columns (units cut off)

Prints one JSON object: rows, problems, wall and CPU seconds, rows per second.
"""

from __future__ import annotations

import csv
import datetime
import json
import sys
import time
from pathlib import Path

from gpuwear.importer import RowProblem, read_telemetry_csv


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def main() -> int:
    what, path = sys.argv[1], sys.argv[2]
    t0, c0 = time.perf_counter(), time.process_time()
    rows = problems = 0
    if what == "parse":
        for item in read_telemetry_csv(Path(path), tz=datetime.timezone.utc):
            rows += 1
            problems += isinstance(item, RowProblem)
    elif what == "csv":
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh, skipinitialspace=True)
            next(reader)
            for _ in reader:
                rows += 1
    elif what == "floats":  # the least any reader of these rows does in Python: split them and read the numbers
        with open(path, encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh, skipinitialspace=True)
            next(reader)
            numeric: list[int] | None = None  # the columns whose first cell is a number
            for cells in reader:
                rows += 1
                if numeric is None:
                    numeric = [i for i, cell in enumerate(cells) if _number(cell.partition(" ")[0])]
                for i in numeric:
                    try:
                        float(cells[i].partition(" ")[0])
                    except ValueError:
                        pass
    else:
        print(f"import_bench.py: unknown mode {what!r} (parse, csv or floats)", file=sys.stderr)
        return 2
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    json.dump({"mode": what, "rows": rows, "problems": problems, "wall": wall, "cpu": cpu,
               "rows_per_s": rows / wall if wall else None}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
