"""The simulation's one error, apart from the simulation: ``gpuwear run`` catches it on every path, and a daemon on
real GPUs never loads :mod:`gpuwear.sim.simulated` (about 2 MiB of resident memory)."""

from __future__ import annotations


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the problem."""
