"""`gpuwear fleet`: the fleet's answer, read from the Prometheus-compatible store the fleet already runs.

:mod:`gpuwear.fleet.client` asks a Prometheus HTTP API (Prometheus, Thanos Query, Mimir, VictoriaMetrics) for each
card's figures over a span (the recording rules of deploy/prometheus/gpuwear-fleet-rules.yml where they exist, the
raw series where not); :mod:`gpuwear.fleet.answer` turns them into the answer (pure: no I/O): incident rates per
GPU-year by product and wear bucket with exact Poisson intervals, the cards that stand out against their product's
peers by a named test, and what it cannot see. Association, never cause.
"""
