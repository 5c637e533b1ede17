"""gpuwear: GPU wear and health monitoring daemon."""

__version__ = "0.1.0"
