"""Each card's figures over a span, from a Prometheus-compatible HTTP API (/api/v1/query): Prometheus, Thanos Query,
Mimir (its tenant in X-Scope-OrgID), VictoriaMetrics. Basic or bearer auth, a CA file.

The recording rules of deploy/prometheus/gpuwear-fleet-rules.yml (one series per card and figure an hour) where
the store holds them; else the raw series gpuwear exports, said as such.
"""

from __future__ import annotations

import base64
import json
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from gpuwear.fleet.answer import Card

_BY = "job, instance, gpu, uuid"
_XIDS = 'gpuwear_xid_tier_events_total{{tier="act"}}'  # GpuwearXidCritical's, each card's lifetime count

# A card's figures over the span: its lifetime figures at their largest there less their value just before it; a
# card the store first holds within the span, from its first sight (its whole life in the ledger, exposure and
# incidents alike: the store did not see its start, the ledger did). Its incidents: its lifetime count of critical
# XIDs taken the same way, a level which neither a restart nor a crash's dip inflates.
_SINCE = ("(max_over_time({x}[{{span}}]) - (last_over_time({x}[{back}] offset {{span}})"
          " or 0 * max_over_time({x}[{{span}}])))")
RULES = {
    "product": "last_over_time(gpuwear:gpu_product[{span}])",
    "lifetime": "max_over_time(gpuwear:lifetime_observed_seconds[{span}])",
    "exposure": _SINCE.format(x="gpuwear:lifetime_observed_seconds", back="2h"),
    "aging": "max_over_time(gpuwear:thermal_aging_equivalent_seconds:central[{span}])",
    "aging_low": "max_over_time(gpuwear:thermal_aging_equivalent_seconds:low[{span}])",
    "aging_high": "max_over_time(gpuwear:thermal_aging_equivalent_seconds:high[{span}])",
    "reasons": "max by (uuid, code) (max_over_time(gpuwear:health_reason:max1h[{span}]))",
    "incidents": _SINCE.format(x="gpuwear:xid_critical_events:lifetime", back="2h"),
    "act_hours": "sum_over_time(gpuwear:health_act:max1h[{span}])",
    "earliest": "min_over_time(timestamp(gpuwear:lifetime_observed_seconds)[{span}:1h])",
}
RAW = {
    "product": "last_over_time(gpuwear_gpu_info[{span}])",
    "lifetime": "max_over_time(gpuwear_lifetime_observed_seconds_total[{span}])",
    "exposure": _SINCE.format(x="gpuwear_lifetime_observed_seconds_total", back="1h"),
    "aging": 'max_over_time(gpuwear_thermal_aging_equivalent_seconds{{sensor="gpu", band="central"}}[{span}])',
    "aging_low": 'max_over_time(gpuwear_thermal_aging_equivalent_seconds{{sensor="gpu", band="low"}}[{span}])',
    "aging_high": 'max_over_time(gpuwear_thermal_aging_equivalent_seconds{{sensor="gpu", band="high"}}[{span}])',
    "reasons": "max by (uuid, code) (max_over_time(gpuwear_health_reason[{span}]))",
    "incidents": f"max by ({_BY}) " + _SINCE.format(x=_XIDS, back="1h"),
    "earliest": "min_over_time(timestamp(gpuwear_lifetime_observed_seconds_total)[{span}:5m])",
}


class FleetError(Exception):
    """The store could not be asked or did not answer (one line: what and why)."""


@dataclass
class Store:
    """A Prometheus-compatible HTTP API at ``url``."""

    url: str
    bearer_token: str | None = None
    basic: tuple[str, str] | None = None
    ca_file: str | None = None
    tenant: str | None = None  # Mimir's X-Scope-OrgID
    timeout: float = 60.0
    queries: int = 0
    bytes: int = 0
    _context: ssl.SSLContext | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise FleetError(f"--prometheus: expected an http:// or https:// URL, got {self.url[:80]!r}")
        if self.ca_file:
            try:
                self._context = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise FleetError(f"--ca-file {self.ca_file}: {exc}") from None

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        """An instant query's vector (/api/v1/query at ``at``)."""
        data = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"}).encode()
        request = urllib.request.Request(self.url.rstrip("/") + "/api/v1/query", data=data, method="POST")
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
        if self.bearer_token:
            request.add_header("Authorization", f"Bearer {self.bearer_token}")
        elif self.basic:
            pair = base64.b64encode(f"{self.basic[0]}:{self.basic[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {pair}")
        if self.tenant:
            request.add_header("X-Scope-OrgID", self.tenant)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise FleetError(f"{self.url} answered {exc.code} to {promql[:80]!r}: {detail}") from None
        except (OSError, ValueError) as exc:
            raise FleetError(f"{self.url}: {exc}") from None
        self.queries += 1
        self.bytes += len(body)
        try:
            doc = json.loads(body)
            if doc.get("status") != "success":
                raise FleetError(f"{self.url}: {doc.get('error', 'no success')} for {promql[:80]!r}")
            if doc["data"]["resultType"] != "vector":
                raise FleetError(f"{self.url}: a {doc['data']['resultType']} for {promql[:80]!r}, not a vector")
            return list(doc["data"]["result"])
        except (KeyError, TypeError, ValueError) as exc:
            raise FleetError(f"{self.url}: not a Prometheus API answer ({exc})") from None


@dataclass
class Figures:
    """What the store holds for the span: the cards, which series they came from, and when its data begins."""

    cards: list[Card]
    source: str  # "recording rules" or "raw series"
    earliest: float | None  # the oldest sample within the span (Unix s), None where none
    span_seconds: float
    at: float


def _value(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def figures(store: Store, span_seconds: float, at: float | None = None) -> Figures:
    """Each card's figures over the ``span_seconds`` before ``at`` (now), by UUID. A card seen on several instances
    (moved between nodes) is counted once, with the figures of the instance that holds the most of its life, its
    exposure and incidents from the same ledger (a card moved with its passport carries its history there: added up,
    it would count twice)."""
    at = time.time() if at is None else at
    span = f"{int(span_seconds)}s"
    rules = bool(store.query("count(gpuwear:lifetime_observed_seconds)", at))
    queries = RULES if rules else RAW
    got = {name: store.query(q.format(span=span), at) for name, q in queries.items()}
    seen: dict[tuple[str, str], dict[str, Any]] = {}  # (UUID, instance) -> that ledger's figures
    for sample in got["product"]:
        labels = sample["metric"]
        card = seen.setdefault((labels.get("uuid", "?"), labels.get("instance", "?")), {})
        card["product"] = labels.get("name") or "?"
        card["where"] = f"{labels.get('instance', '?')} GPU {labels.get('gpu', '?')}"
    reasons: dict[str, set[str]] = {}  # the verdict's reasons while in the span, by code
    for sample in got["reasons"]:
        reasons.setdefault(sample["metric"].get("uuid", "?"), set()).add(sample["metric"].get("code", "?"))
    for name in ("lifetime", "exposure", "aging", "aging_low", "aging_high", "incidents", "act_hours"):
        for sample in got.get(name, []):
            labels = sample["metric"]
            card = seen.setdefault((labels.get("uuid", "?"), labels.get("instance", "?")), {})
            card[name] = max(card.get(name, -math.inf), _value(sample))
    by_uuid: dict[str, dict[str, Any]] = {}
    for (uuid, _), c in seen.items():
        if "lifetime" in c and c["lifetime"] > by_uuid.get(uuid, {}).get("lifetime", -math.inf):
            by_uuid[uuid] = c
    cards = [Card(uuid, c.get("product", "?"), c.get("where", "?"), c.get("aging", 0.0) / 3600.0,
                  max(0.0, c.get("exposure", 0.0)), round(max(0.0, c.get("incidents", 0.0))),
                  c.get("act_hours") if rules else None, c.get("lifetime"),
                  (c["aging_low"] / 3600.0, c["aging_high"] / 3600.0) if "aging_low" in c and "aging_high" in c
                  else None, tuple(sorted(reasons.get(uuid, ()))))
             for uuid, c in sorted(by_uuid.items())]
    earliest = min((_value(s) for s in got["earliest"]), default=None)
    return Figures(cards, "recording rules" if rules else "raw series", earliest, span_seconds, at)
