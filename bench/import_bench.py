"""The nvidia-smi CSV parser alone, and the floor under it.

    python bench/import_bench.py parse FILE   # iterate gpuwear.imports.parse.read_telemetry_csv
    python bench/import_bench.py csv FILE     # iterate the stdlib csv.reader over the same file
    python bench/import_bench.py floats FILE  # csv.reader, and float() of the numeric columns (units cut off)
    python bench/import_bench.py rows FILE    # backfill.import_rows into a fresh ledger: the row path, whole
    python bench/import_bench.py columns FILE # reader.import_file (the columnar path), whole

Prints one JSON object: rows, problems, wall and CPU seconds, rows per second.
"""

from __future__ import annotations

import csv
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

from gpuwear.config import Config
from gpuwear.imports.backfill import import_rows
from gpuwear.imports.parse import RowProblem, read_telemetry_csv
from gpuwear.imports.reader import import_file
from gpuwear.ledger import Ledger


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
    elif what in ("rows", "columns"):
        with tempfile.TemporaryDirectory() as state:
            ledger = Ledger.open(Path(state) / "ledger.sqlite")
            run = import_rows if what == "rows" else import_file
            result = run(Path(path), ledger, Config().wear, tz=datetime.timezone.utc, say=lambda _: None)
            ledger.close()
        rows, problems = sum(result.imported.values()), result.problems
        if what == "columns" and result.reader != "columns":
            print(f"import_bench.py: the columnar path did not take the file ({result.reader})", file=sys.stderr)
            return 1
    else:
        print(f"import_bench.py: unknown mode {what!r} (parse, csv, floats, rows or columns)", file=sys.stderr)
        return 2
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    json.dump({"mode": what, "rows": rows, "problems": problems, "wall": wall, "cpu": cpu,
               "rows_per_s": rows / wall if wall else None}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
