"""Run a benchmarked program exactly as its own entry point would, and let the benchmark read
``FakeNvmlLibrary.calls`` from outside.

    python bench/launch.py gpuwear ARGS...     == python -m gpuwear ARGS...
    python bench/launch.py fakenvml ARGS...    == python -m gpuwear.sim.fakenvml ARGS...

The only addition: every ``FakeNvmlLibrary`` created in the process is remembered, and on
SIGUSR1 the sum of their ``calls`` counters is appended, as one JSON line with the monotonic
time, to the file named by ``$BENCH_CALLS_FILE``. Nothing runs until the signal arrives.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import Counter
from types import FrameType
from typing import Any

from gpuwear.sim import fakenvml

_libraries: list[fakenvml.FakeNvmlLibrary] = []
_original_init = fakenvml.FakeNvmlLibrary.__init__


def _init(self: fakenvml.FakeNvmlLibrary, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    _libraries.append(self)


def _dump(signum: int, frame: FrameType | None) -> None:
    calls: Counter[str] = Counter()
    for library in _libraries:
        calls.update(dict(library.calls))
    path = os.environ.get("BENCH_CALLS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"t": time.monotonic(), "calls": dict(calls)}) + "\n")


def main() -> int:
    fakenvml.FakeNvmlLibrary.__init__ = _init  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, _dump)
    what, args = sys.argv[1], sys.argv[2:]
    if what == "gpuwear":
        from gpuwear.cli import main as gpuwear_main

        sys.argv = ["gpuwear", *args]
        return gpuwear_main(args)
    if what == "fakenvml":
        sys.argv = ["fakenvml", *args]
        return fakenvml.main(args)
    print(f"launch.py: unknown program {what!r} (gpuwear or fakenvml)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
