"""The prometheus_client custom collector: copies the published state into metric families.

No NVML call and no lock wait happens here: the sampler snapshot and the wear views are
immutable objects, each read with one reference load.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwear.metrics import DAEMON_METRICS, GPU_LABELS, GPU_METRICS, WEAR_METRICS, MetricDef, Published, T


def _family(name: str, kind: str, unit: str, help: str,
            labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, help, labels=labels, unit=unit)
    return GaugeMetricFamily(name, help, labels=labels, unit=unit)


class GpuwearCollector(Collector):
    """Exposes what ``published()`` returns at each scrape."""

    def __init__(self, published: Callable[[], Published]) -> None:
        self._published = published

    def collect(self) -> Iterator[Metric]:
        return self.collect_from(self._published())

    def collect_from(self, pub: Published) -> Iterator[Metric]:
        """The families of one published state."""
        for d in DAEMON_METRICS:
            family = _family(d.name, d.kind, d.unit, d.help, list(d.labels))
            for labels, value in d.values(pub):
                family.add_metric(list(labels), value)
            yield family
        statuses = [(s, [str(s.identity.index), s.identity.uuid]) for s in pub.snapshot.gpus]
        yield from _per_gpu(GPU_METRICS, statuses)
        yield from _per_gpu(WEAR_METRICS, [(pub.wear[s.identity.uuid], base) for s, base in statuses
                                           if s.identity.uuid in pub.wear])


def _per_gpu(defs: tuple[MetricDef[T], ...], sources: list[tuple[T, list[str]]]) -> Iterator[Metric]:
    """Families of per-GPU metrics: each source (a GPU's status or wear view) with its base labels."""
    for m in defs:
        family = _family(m.name, m.kind, m.unit, m.help, [*GPU_LABELS, *m.labels])
        for source, base in sources:
            for labels, value in m.values(source):
                family.add_metric([*base, *labels], value)
        yield family


class Exposition:
    """Renders /metrics, once per published state: scrapes between two ticks (several
    Prometheus servers, retries, a dashboard) get the same bytes without re-rendering."""

    def __init__(self, collector: GpuwearCollector, published: Callable[[], Published]) -> None:
        self._collector = collector
        self._published = published
        self._lock = threading.Lock()
        self._cache: tuple[tuple[object, ...], bytes] | None = None

    def render(self, encoder: Callable[[Any], bytes], content_type: str) -> bytes:
        pub = self._published()
        key = (id(pub.snapshot), id(pub.wear), pub.ledger, content_type)
        with self._lock:
            cached = self._cache
            if cached is not None and cached[0] == key:
                return cached[1]
            body = encoder(_Pinned(self._collector, pub))
            self._cache = (key, body)
            return body


class _Pinned:
    """A registry-like object (what the encoders call ``collect()`` on) for one state."""

    def __init__(self, collector: GpuwearCollector, pub: Published) -> None:
        self._collector, self._pub = collector, pub

    def collect(self) -> Iterator[Metric]:
        return self._collector.collect_from(self._pub)
