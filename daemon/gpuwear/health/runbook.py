"""The health part's tables in words: the runbook's table of reason codes (health.rules.TABLE) and its table of XID
codes (health.xids.CATALOG) in docs/alerts.md are this text, checked by tests/test_health.py (``--update-golden``
writes them)."""

from __future__ import annotations

from gpuwear.health.rules import TABLE
from gpuwear.health.xids import CATALOG, LINE_JUDGED

BEGIN = "<!-- health rules: made from gpuwear.health.rules.TABLE; tests/test_health.py checks it -->"
END = "<!-- end of health rules -->"
XID_BEGIN = "<!-- xid codes: made from gpuwear.health.xids.CATALOG; tests/test_health.py checks it -->"
XID_END = "<!-- end of xid codes -->"
_TIER_WORDS = {"act": "act (an incident)", "watch": "watch", "app": "watch (a day: the application's)",
               "none": "none of its own"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """The table, one row a rule, in the table's (and the verdict's) order."""
    rows = ["| code | severity | reads | window | threshold | what ends it | rule (whose, and where) |",
            "|---|---|---|---|---|---|---|"]
    for r in TABLE:
        alert = f" (alert {r.alert})" if r.alert else ""
        rows.append("| " + " | ".join(_cell(c) for c in (
            f"`{r.code}`", r.severity, r.signal, r.window, r.threshold, r.ends, r.source + alert)) + " |")
    return "\n".join([BEGIN, *rows, END])


def xid_markdown() -> str:
    """Every code of NVIDIA's catalog: its mnemonic and description, NVIDIA's resolution, the tier gpuwear's verdict
    and alerts give it, and why."""
    rows = ["| Xid | NVIDIA's description (mnemonic) | NVIDIA's resolution (immediate / investigatory) | gpuwear "
            "| why |", "|---|---|---|---|---|"]
    for x in CATALOG:
        by_line = ", by its line's registers on Hopper" if x.code == 74 else ", by NVIDIA's decode of its line"
        tier = _TIER_WORDS[x.tier] + (by_line if x.code in LINE_JUDGED else "")
        cells = (str(x.code), f"{x.meaning} ({x.mnemonic})", x.resolution, tier, x.why)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join([XID_BEGIN, *rows, XID_END])


def _between(document: str, begin: str, end: str, table: str) -> str:
    start, stop = document.index(begin), document.index(end) + len(end)
    return document[:start] + table + document[stop:]


def replaced(document: str) -> str:
    """``document`` with its tables (between BEGIN and END, XID_BEGIN and XID_END) made anew; ValueError when it
    lacks one."""
    return _between(_between(document, BEGIN, END, markdown()), XID_BEGIN, XID_END, xid_markdown())
