"""The durable wear ledger: SQLite (stdlib) in the state directory, keyed by GPU UUID.

What each part promises:

- :mod:`.store` (:class:`Ledger`): every save is one transaction (WAL journal, ``synchronous=FULL``): a crash at any
  instant leaves the previous save or the new one, never a mix; nothing after its commit fails a save, so a save
  made again never writes a record twice. Readers open the file read-only while the daemon writes, and a row that
  fails its check costs that row only (:attr:`Ledger.left_out`).
- :mod:`.schema`: one number names one schema; migrations are driven by what the file holds and safe to run twice.
- :mod:`.records`: every record is validated before it is written (:mod:`gpuwear.wear.schema`); events and job
  records carry a CRC-32 of what was written, which proves them whole when they are read.
- :mod:`.integrity`: the daemon's open checks every record (checksums where there are some): one that fails costs
  only itself (set aside in the ``set_aside`` table, the rest of the history kept).
- :mod:`.recovery`: only damage SQLite reports leads to recovery: what can still be read goes into a new ledger, the
  damaged file kept beside it byte for byte; a kill at any instant leaves the damaged ledger or the new one. Any
  other trouble, and a ledger of a newer gpuwear (:class:`LedgerTooNewError`), is refused and never rewritten.
- :mod:`.lock`: the state directory is the daemon's alone: :class:`StateLock` holds it for the daemon's life, it is
  created 0700 and the ledger 0600, and symbolic links are not followed.
- :mod:`.retention`: what ages out (job records, events), and the pages it frees given back to the file system.
- :mod:`.export`: one GPU's history as a document another box imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwear.ledger.damage import damaged, environment_error, finish_recovery
    from gpuwear.ledger.errors import (
        LedgerDamagedError,
        LedgerError,
        LedgerRefusedError,
        LedgerTooNewError,
        StateLockedError,
        printable,
    )
    from gpuwear.ledger.export import EXPORT_VERSION
    from gpuwear.ledger.lock import PID_FILE, StateLock, private_folder
    from gpuwear.ledger.records import Event
    from gpuwear.ledger.recovery import recover
    from gpuwear.ledger.schema import FILENAME, SCHEMA_VERSION, ledger_path
    from gpuwear.ledger.store import COMPACT_AFTER, Ledger

# Each name's module, loaded when the name is first asked for (PEP 562): the scrape path imports ledger.records'
# Event (through the tracker) and must not load the store, recovery, export and the rest with it; a daemon loads
# them when it opens its ledger, a command when it reads one.
_WHERE = {
    **dict.fromkeys(("LedgerDamagedError", "LedgerError", "LedgerRefusedError", "LedgerTooNewError",
                     "StateLockedError", "printable"), "errors"),
    "EXPORT_VERSION": "export",
    **dict.fromkeys(("PID_FILE", "StateLock", "private_folder"), "lock"),
    "Event": "records",
    **dict.fromkeys(("damaged", "environment_error", "finish_recovery"), "damage"),
    "recover": "recovery",
    **dict.fromkeys(("FILENAME", "SCHEMA_VERSION", "ledger_path"), "schema"),
    **dict.fromkeys(("COMPACT_AFTER", "Ledger"), "store"),
}

__all__ = ["COMPACT_AFTER", "EXPORT_VERSION", "FILENAME", "PID_FILE", "SCHEMA_VERSION", "Event", "Ledger",
           "LedgerDamagedError", "LedgerError", "LedgerRefusedError", "LedgerTooNewError", "StateLock",
           "StateLockedError", "damaged", "environment_error", "finish_recovery", "ledger_path", "printable",
           "private_folder", "recover"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # asked once
    return value
