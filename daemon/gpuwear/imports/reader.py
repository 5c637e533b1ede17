"""`gpuwear import nvidia-smi`'s choice of reader: by columns (:mod:`gpuwear.imports.columnar`, with numpy and
pyarrow, the ``fast-import`` extra) where they are installed and can read the file exactly as the row path does, else
row by row (:mod:`gpuwear.imports.backfill`, the reference). Both give the same ledger, bit for bit
(tests/test_columnar.py). The columnar reader builds on the row path's stages; the row path knows nothing of it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

from gpuwear.config import WearConfig
from gpuwear.imports import backfill
from gpuwear.imports.backfill import FileResult
from gpuwear.ledger import Ledger

__all__ = ["EXTRA", "import_file"]

EXTRA = "fast-import"  # pyproject.toml's extra that installs numpy and pyarrow


def import_file(path: Path, ledger: Ledger, params: WearConfig, *, gpu: str | None = None,
                columns: list[str] | None = None, tz: datetime.tzinfo | None = None, max_gap: float | None = None,
                say: Callable[[str], None] = print, progress: Callable[[int], None] | None = None,
                rows_only: bool = False, latest: float | None = None) -> FileResult:
    """Import one file into ``ledger`` (one transaction). Raises ``ImportFormatError`` when the file as a whole
    cannot be used; a bad row is reported through ``say`` and skipped.

    The file is read by columns (:mod:`gpuwear.imports.columnar`, numpy and pyarrow: about twice as fast) unless
    ``rows_only``, they are not installed, or that path cannot reproduce the row path exactly for this file (it says
    why, having written and said nothing); then row by row (:func:`backfill.import_rows`), ``FileResult.reader``
    saying why. Both give the same ledger.
    """
    why = "rows only"
    if not rows_only:
        try:
            from gpuwear.imports import columnar
        except ImportError as exc:  # numpy or pyarrow not installed: the row path needs neither
            why = f"{exc.name or 'numpy or pyarrow'} is not installed: pip install 'gpuwear[{EXTRA}]' for the " \
                "columnar reader"
        else:
            try:
                return columnar.import_file(path, ledger, params, gpu=gpu, columns=columns, tz=tz, max_gap=max_gap,
                                            say=say, progress=progress, latest=latest)
            except columnar.ColumnarError as exc:
                why = str(exc)
    result = backfill.import_rows(path, ledger, params, gpu=gpu, columns=columns, tz=tz, max_gap=max_gap,
                                  say=say, progress=progress, latest=latest)
    result.reader = f"rows: {why}"
    return result
