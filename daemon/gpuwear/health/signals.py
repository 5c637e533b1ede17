"""The health signals the rules read that are more than one reading: error rates per loaded hour (the GPU's own and
its peers'), its incidents, its slow NVML reads. Pure functions of a GPU's record (GpuWear); no clock, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuwear.config import WearConfig
from gpuwear.kernlog import bus_key
from gpuwear.wear.accumulate import GpuWear

ERROR_WORDS = {"ecc_corrected": "corrected ECC errors", "pcie_replays": "PCIe replays",
               "nvlink_crc": "NVLink CRC errors", "nvlink_replay": "NVLink replays",
               "remapped_rows_correctable": "memory rows remapped for correctable errors"}


def per_hour(rate: float) -> str:
    """A rate per hour in few digits: 12, 12.5 k, 1.2 M."""
    return f"{rate / 1e6:.1f} M" if rate >= 1e6 else f"{rate / 1e3:.1f} k" if rate >= 1e4 else f"{rate:.0f}"


def slow_reads_text(slow_reads: dict[str, dict[str, int]]) -> str:
    """The GPU's slow NVML reads (GpuWear.slow_reads) in words: "reads of 0.1 s or more: 12 under load (3 of
    1 s or more), 0 idle"; "" when there were none."""
    if not any(slow_reads.values()):
        return ""

    def side(load: str) -> str:
        bins = slow_reads.get(load, {})
        slower = sum(n for key, n in bins.items() if key != "0.1")
        return f"{sum(bins.values())} {'under load' if load == 'loaded' else 'idle'}" + (
            f" ({slower} of 1 s or more)" if slower else "")

    return f"reads of 0.1 s or more: {side('loaded')}, {side('idle')}"


def repeated_incidents(w: GpuWear, count: int, window: float) -> tuple[float, float, list[str]] | None:
    """The most recent run of at least ``count`` incidents within ``window`` seconds among the GPU's kept
    incidents: (first wall, last wall, what each was), or None."""
    kept = w.incident_list()
    times = [t for t, _ in kept]
    best = None
    start = 0
    for end, t in enumerate(times):
        while t - times[start] > window:
            start += 1
        if end - start + 1 >= count:
            best = (start, end)
    if best is None:
        return None
    start, end = best  # every incident within the window that ends at the newest qualifying one
    return times[start], times[end], [what for _, what in kept[start:end + 1]]


def incident_summary(w: GpuWear) -> dict[str, Any]:
    """The GPU's kept incidents: how many, the first and last (wall), and the mean time between them (s; None
    below two)."""
    times = [t for t, _ in w.incident_list()]
    return {"kept": len(times), "first": times[0] if times else None, "last": times[-1] if times else None,
            "mean_seconds_between": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None}


def recent_rates(w: GpuWear, p: WearConfig) -> dict[str, tuple[float | None, float | None]]:
    """Each error counter's rate per loaded hour over the GPU's last two UTC days (RECENT_ERROR_DAYS, to the day of
    its last sight) and over the wear.health.bleeding_baseline_days before them: the window every GPU is judged on,
    and its own past. None where that window was read under load for wear.health.bleeding_min_loaded_hours or
    less."""
    return w.own_error_rates(p.health.bleeding_baseline_days, p.health.bleeding_min_loaded_hours * 3600.0)


LINKS = "nvlink_links_active"  # peer_rates' entry for the peers' NVLink links active at their latest reading


def _mine(w: GpuWear, p: WearConfig) -> dict[str, tuple[float | None, float | None]]:
    """One GPU's figures its peers are judged against: its recent error rates, and its links active (LINKS)."""
    mine = recent_rates(w, p)
    if (links := w.health.get(LINKS)) is not None:
        mine[LINKS] = (float(links), None)
    return mine


def peer_rates(wears: Mapping[str, GpuWear], p: WearConfig) -> dict[str, dict[str, list[float]]]:
    """:func:`peer_and_own_rates`' peers."""
    return peer_and_own_rates(wears, p)[0]


def peer_and_own_rates(wears: Mapping[str, GpuWear], p: WearConfig) -> tuple[
        dict[str, dict[str, list[float]]], dict[str, dict[str, tuple[float | None, float | None]]]]:
    """For each GPU (by UUID), the loaded-hour rates over their last two UTC days (recent_rates) of each error
    counter of the other GPUs of the same product (card name) among ``wears``: what the bleeding rule compares the
    GPU's own same window with; and under LINKS, their NVLink links active at their latest reading, what the
    nvlink_down rule compares the GPU's with. Each product's figures are gathered once (the views are made on the
    scrape path: a pass over every pair of GPUs cost 1.7 ms at 64 GPUs). With them, each GPU's own recent_rates, for
    its verdict (computed once a view)."""
    rates = {uuid: (w.name.strip().lower(), _mine(w, p)) for uuid, w in wears.items()}
    groups: dict[tuple[str, str], list[float]] = {}
    for name, theirs in rates.values():
        for counter, (lately, _) in theirs.items():
            if name and lately is not None:
                groups.setdefault((name, counter), []).append(lately)
    out: dict[str, dict[str, list[float]]] = {}
    for uuid, (name, mine) in rates.items():
        peers: dict[str, list[float]] = {}
        for counter in mine:
            others = list(groups.get((name, counter), ()))
            own = mine[counter][0]
            if own is not None and others:
                others.remove(own)  # one GPU's own rate, whatever its peers' are
            if others:
                peers[counter] = others
        out[uuid] = peers
    return out, {uuid: {k: v for k, v in mine.items() if k != LINKS} for uuid, (_, mine) in rates.items()}


def past_cards(cards: Iterable[tuple[str, str | None, float | None, float | None]]) -> dict[str, str]:
    """A host's past cards, from its cards' (UUID, PCI bus id, first seen, last seen; Unix s): by UUID, the card
    first seen in its slot (PCI address) after it was last seen there, the latest such (the daemon's missing GPUs,
    the report's)."""
    by_slot: dict[str, list[tuple[str, float | None, float | None]]] = {}
    for uuid, bus, first, last in cards:
        if bus:
            by_slot.setdefault(bus_key(bus), []).append((uuid, first, last))
    out: dict[str, str] = {}
    for slot in by_slot.values():
        for uuid, _, last in slot:
            after = [(first, other) for other, first, _ in slot
                     if other != uuid and first is not None and last is not None and first >= last]
            if after:
                out[uuid] = max(after)[1]
    return out
