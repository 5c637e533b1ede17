"""The prometheus_client custom collector: copies the published state into metric families.

No NVML call and no lock wait happens here: the sampler snapshot and the wear views are
immutable objects, each read with one reference load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwear.metrics import DAEMON_METRICS, GPU_LABELS, GPU_METRICS, WEAR_METRICS, Published


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
        pub = self._published()
        snap = pub.snapshot
        for d in DAEMON_METRICS:
            family = _family(d.name, d.kind, d.unit, d.help, list(d.labels))
            for labels, value in d.values(pub):
                family.add_metric(list(labels), value)
            yield family
        for m in GPU_METRICS:
            family = _family(m.name, m.kind, m.unit, m.help, [*GPU_LABELS, *m.labels])
            for status in snap.gpus:
                base = [str(status.identity.index), status.identity.uuid]
                for labels, value in m.values(status):
                    family.add_metric([*base, *labels], value)
            yield family
        for w in WEAR_METRICS:
            family = _family(w.name, w.kind, w.unit, w.help, [*GPU_LABELS, *w.labels])
            for status in snap.gpus:
                view = pub.wear.get(status.identity.uuid)
                if view is None:
                    continue
                base = [str(status.identity.index), status.identity.uuid]
                for labels, value in w.values(view):
                    family.add_metric([*base, *labels], value)
            yield family
