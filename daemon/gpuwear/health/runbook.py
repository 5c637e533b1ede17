"""The rule table (health.rules.TABLE) in words: the runbook's table of reason codes in docs/alerts.md is this
text, checked by tests/test_health.py (``--update-golden`` writes it)."""

from __future__ import annotations

from gpuwear.health.rules import TABLE

BEGIN = "<!-- health rules: made from gpuwear.health.rules.TABLE; tests/test_health.py checks it -->"
END = "<!-- end of health rules -->"


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


def replaced(document: str) -> str:
    """``document`` with its table (between BEGIN and END) made anew; ValueError when it has none."""
    start, end = document.index(BEGIN), document.index(END) + len(END)
    return document[:start] + markdown() + document[end:]
