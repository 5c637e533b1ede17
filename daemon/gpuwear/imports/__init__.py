"""History brought into the ledger from outside: telemetry logs (``parse`` reads them, ``backfill`` integrates them
row by row, ``columnar`` by columns) and other boxes' exports (``ledger``)."""
