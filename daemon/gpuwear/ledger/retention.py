"""What ages out of the ledger, and the room it leaves. Each GPU's own record keeps its lifetime figures whatever
ages out: job records that ended before their retention and events before theirs go (:func:`prune`, inside a save's
transaction), and once enough pages are free they are given back to the file system (:func:`give_back_pages`, an
incremental vacuum in a transaction of its own, after the save committed).
"""

from __future__ import annotations

import sqlite3

VACUUM_FREE_PAGES = 1024  # free pages (1 MiB) after which a save gives them back to the file system


def prune(db: sqlite3.Connection, jobs_before: float | None, events_before: float | None) -> None:
    """Remove the job records that ended before ``jobs_before`` and the events before ``events_before`` (Unix
    seconds; None keeps them all), in the caller's transaction."""
    if jobs_before is not None:
        db.execute("DELETE FROM job_lines WHERE record IN (SELECT record FROM jobs WHERE end IS NOT NULL AND end < ?)",
                   (jobs_before,))
        db.execute("DELETE FROM jobs WHERE end IS NOT NULL AND end < ?", (jobs_before,))
    if events_before is not None:
        db.execute("DELETE FROM events WHERE wall < ?", (events_before,))


def give_back_pages(db: sqlite3.Connection) -> None:
    """Give the free pages back to the file system once VACUUM_FREE_PAGES are free (a ledger of ``auto_vacuum =
    INCREMENTAL`` only): the file shrinks after pruning, and the pages a save frees meanwhile are reused. Raises
    sqlite3.Error (a full disk) with the pages still free."""
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    if free >= VACUUM_FREE_PAGES and db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
        # executescript steps it to the end (sqlite3_exec); execute() would free one page
        db.executescript(f"PRAGMA incremental_vacuum({int(free)});")
