"""What the ledger says when it cannot be used (:class:`LedgerError` and its kinds: refused, too new, damaged, held
by another process), and how text read from a file is made safe to show (:func:`printable`, :func:`_text`).
"""

from __future__ import annotations


class LedgerError(RuntimeError):
    """The ledger cannot be used; the message names the file and the reason."""


class LedgerRefusedError(LedgerError):
    """The file cannot be used as this gpuwear's ledger for a reason that is not damage (a newer schema, a schema
    version that is not one, an error of ours): refused, kept byte for byte, never recovered nor moved aside."""


class LedgerTooNewError(LedgerRefusedError):
    """The ledger was written by a newer gpuwear: refused, never moved aside (a downgrade must not discard it)."""


class LedgerDamagedError(LedgerError):
    """SQLite's integrity check found damage in the file: what can be read is recovered (:func:`recover`)."""


class StateLockedError(LedgerError):
    """Another process (a running daemon) holds the state directory."""


def _text(raw: bytes) -> str:
    """TEXT as str: bytes damaged on disk that are not UTF-8 become U+FFFD (and then fail validation), never a
    UnicodeDecodeError out of a query."""
    return raw.decode("utf-8", "replace")


def printable(text: str) -> str:
    """Text from outside (a file's bytes, SQLite's messages about them) made safe for a terminal or a log line:
    control and format characters (ESC, BEL, C1, bidi overrides) shown as escapes."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
