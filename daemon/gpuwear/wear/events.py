"""What happened to a GPU, as the tracker records it and the ledger keeps it: here, below both, so that the scrape
path (metrics -> tracker) loads no ledger code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    """Something that happened to a GPU: a gap, a lost GPU, an XID, a memory-error change."""

    uuid: str
    wall: float
    kind: str
    detail: dict[str, Any]
