"""Read py-spy's raw (collapsed-stack) output: where the CPU time went.

``py-spy record -f raw`` writes one line per distinct stack, ``frame;frame;...;leaf COUNT``,
each frame ``function (file:line)``. Without ``--idle`` py-spy samples only threads that are
running, so sample shares approximate CPU-time shares.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

FAKE_FILES = ("gpuwear/sim/fakenvml.py", "gpuwear/sim/simulated.py")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _split(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip(), ""
    return m.group("func"), m.group("file")


def _short(path: str) -> str:
    for marker in ("site-packages/", "daemon/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "lib/python3":
                path = path.split("/", 1)[-1]
    return path


def owner(path: str, func: str = "") -> str:
    """The component a source file (and function) belongs to."""
    p = path.replace("\\", "/")
    if (p.endswith("fakenvml.py") and func == "main") or p.endswith("bench/launch.py") or p == "launch.py":
        return "launcher"
    if any(f in p for f in FAKE_FILES):
        return "fake NVML + simulation"
    if p.endswith("pynvml.py"):
        return "pynvml binding"
    if "gpuwear/" in p:
        return "gpuwear"
    if "nvitop" in p:
        return "nvitop"
    for lib in ("prometheus_client", "psutil", "yaml", "sqlite3", "cachetools"):
        if lib in p:
            return lib
    if "bare_nvml" in p:
        return "bare script"
    return "stdlib/other"


@dataclass
class Profile:
    total: int = 0
    by_component: Counter[str] = field(default_factory=Counter)  # by the stack's owner (fake wins)
    self_time: Counter[str] = field(default_factory=Counter)  # leaf function
    inclusive: Counter[str] = field(default_factory=Counter)  # any frame (once per stack)
    inclusive_own: Counter[str] = field(default_factory=Counter)  # the same, stacks through the fake left out
    self_own: Counter[str] = field(default_factory=Counter)

    @property
    def fake_share(self) -> float:
        return self.by_component["fake NVML + simulation"] / self.total if self.total else 0.0

    def top(self, counter: Counter[str], n: int, prefix: str = "") -> list[tuple[str, float]]:
        return [(k, v / self.total) for k, v in counter.most_common() if k.startswith(prefix)][:n] if self.total else []


def read(path: Path) -> Profile:
    prof = Profile()
    if not path.exists():
        return prof
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_split(f) for f in stack.split(";")]
        prof.total += n
        # the launcher's main() (python -m gpuwear.sim.fakenvml PROGRAM) is not the fake library
        fake = any(any(x in f for x in FAKE_FILES) and not (fn == "main" and f.endswith("fakenvml.py"))
                   for fn, f in frames)
        # the component: the fake when the stack passes through it, else the deepest frame that is
        # not the standard library (a thread pool's wait inside gpuwear's tick is gpuwear's)
        owners = [owner(f, fn) for fn, f in frames]
        component = "fake NVML + simulation" if fake else next(
            (o for o in reversed(owners) if o not in ("stdlib/other", "launcher")), "stdlib/other")
        prof.by_component[component] += n
        func, file = frames[-1]
        leaf = f"{owner(file, func)}: {func} ({_short(file)})"
        prof.self_time[leaf] += n
        if not fake:
            prof.self_own[leaf] += n
        seen = set()
        for func, file in frames:
            key = f"{owner(file, func)}: {func} ({_short(file)})"
            if key not in seen:
                seen.add(key)
                prof.inclusive[key] += n
                if not fake:
                    prof.inclusive_own[key] += n
    return prof


def format_top(prof: Profile, n: int = 12, prefix: str = "", own: bool = False) -> list[str]:
    """The top functions, as % of all samples; ``own``: only stacks that do not pass through the fake."""
    lines = []
    pairs = ((("self (leaf) time", prof.self_own), ("inclusive time", prof.inclusive_own)) if own else
             (("self (leaf) time", prof.self_time), ("inclusive time", prof.inclusive)))
    for title, counter in pairs:
        lines.append(f"  {title}:")
        for key, share in prof.top(counter, n, prefix):
            lines.append(f"    {share * 100:5.1f} %  {key}")
    return lines
