"""A GPU-free world for tests and ``gpuwear run --simulate``: the fake NVML *library* (:mod:`fakenvml`, which the
real pynvml binding loads in place of libnvidia-ml.so.1), the driver releases it answers as (:mod:`drivers`, from
the C functions each branch exports: :mod:`nvml_symbols`), the simulated GPUs behind it (:mod:`simulated`) and
their scenarios (``scenarios/``). The daemon's real path (:mod:`gpuwear.backends.nvml`) never imports it."""
