"""Each job's share of a MIG GPU, by the compute slices of the MIG devices its processes run on.

On a MIG GPU a job holds the slices of its MIG devices, not the card: one job on a 1g device of an otherwise idle
A100 holds 1/7 of it, not all of it; a 1g job beside a 4g job holds 1/7, not half. A device's slices are shared
equally by the jobs on it; the slices no job holds (no MIG device made there, or a device without processes) are
nobody's: the GPU's idle line takes them, so the lines still add up to the card. No NVML here: the slices come in
the sample (``GpuSample.mig_slices``); pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Set


def slice_shares(places: Mapping[str, Set[str]], slices: Mapping[str, int], total: int) -> dict[str, float] | None:
    """``places``: job key -> the MIG devices (UUIDs) its processes run on, for every job on the GPU; ``slices``:
    MIG device -> its compute slices; ``total``: the GPU's slices. Each job's share of the GPU (0 to 1; the rest is
    idle), or None where some job's place or some device's slices are not known, or they add up past the GPU: the
    jobs are then shared equally, as on a GPU without MIG (never a guess at who held what)."""
    if not places or total <= 0 or any(not devices or not devices <= slices.keys() for devices in places.values()):
        return None
    if sum(slices[d] for d in set().union(*places.values())) > total:
        return None
    holders: dict[str, int] = {}
    for devices in places.values():
        for device in devices:
            holders[device] = holders.get(device, 0) + 1
    return {key: sum(slices[d] / holders[d] for d in devices) / total for key, devices in places.items()}
