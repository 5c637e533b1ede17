"""The prometheus_client custom collector: copies the latest snapshot into metric families.

No NVML call and no lock wait happens here: the snapshot is an immutable object published
by the sampler, read with one reference load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwear.metrics import DAEMON_METRICS, GPU_LABELS, GPU_METRICS, DaemonInfo
from gpuwear.sampler import Snapshot


def _family(name: str, kind: str, unit: str, help: str,
            labels: list[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, help, labels=labels, unit=unit)
    return GaugeMetricFamily(name, help, labels=labels, unit=unit)


class GpuwearCollector(Collector):
    """Exposes the snapshot returned by ``snapshot()`` at each scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot], info: DaemonInfo) -> None:
        self._snapshot = snapshot
        self._info = info

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        for d in DAEMON_METRICS:
            family = _family(d.name, d.kind, d.unit, d.help, list(d.labels))
            for labels, value in d.values(snap, self._info):
                family.add_metric(list(labels), value)
            yield family
        for m in GPU_METRICS:
            family = _family(m.name, m.kind, m.unit, m.help, [*GPU_LABELS, *m.labels])
            for status in snap.gpus:
                base = [str(status.identity.index), status.identity.uuid]
                for labels, value in m.values(status):
                    family.add_metric([*base, *labels], value)
            yield family
