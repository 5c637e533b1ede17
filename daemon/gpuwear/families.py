"""The published state as prometheus_client metric families, for a registry of prometheus_client's own (an
embedding program's, the tests' comparison with its encoders) and the OTLP pusher.

The daemon's /metrics does not use them: :class:`gpuwear.collector.Encoder` writes the same text byte for byte
(tested) without loading prometheus_client, whose package brings ``http.server``, ``wsgiref``, ``urllib.request``
and ``email`` along (about 3.5 MiB of resident memory a daemon never used, bench/rss_imports.py). This module is
imported only where families are asked for (:attr:`gpuwear.service.Daemon.collector`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwear.metrics import GPU_LABELS, Published, catalog


def _family(name: str, kind: str, unit: str, help: str,
            labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, help, labels=labels, unit=unit)
    return GaugeMetricFamily(name, help, labels=labels, unit=unit)


class GpuwearCollector(Collector):
    """Exposes what ``published()`` returns at each scrape; ``detail``: ``metrics.detail``."""

    def __init__(self, published: Callable[[], Published], detail: bool = False) -> None:
        self._published = published
        self.detail = detail

    def collect(self) -> Iterator[Metric]:
        return self.collect_from(self._published())

    def collect_from(self, pub: Published) -> Iterator[Metric]:
        """The families of one published state, in the exposition's order (Catalog.in_order)."""
        statuses = [(s, [str(s.identity.index), s.identity.uuid]) for s in pub.snapshot.gpus]
        sources: dict[str, list[tuple[Any, list[str]]]] = {
            "daemon": [(pub, [])], "gpu": statuses,
            "wear": [(pub.wear[s.identity.uuid], base) for s, base in statuses if s.identity.uuid in pub.wear]}
        for source, m in catalog(self.detail).in_order():
            family = _family(m.name, m.kind, m.unit, m.help, [*(GPU_LABELS if source != "daemon" else ()), *m.labels])
            for item, base in sources[source]:
                for labels, value in m.values(item):
                    family.add_metric([*base, *labels], value)
            yield family
