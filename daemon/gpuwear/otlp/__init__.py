"""OTLP push (opt-in, ``otlp`` in config): the state /metrics serves, named by OpenTelemetry's hardware conventions.

:mod:`gpuwear.otlp.names` says what each /metrics family becomes (pure data, no SDK); :mod:`gpuwear.otlp.push` builds
and sends each push through the OpenTelemetry SDK (``pip install 'gpuwear[otlp]'``), and is imported only when OTLP is
on: with it off, nothing of the SDK is loaded.
"""
