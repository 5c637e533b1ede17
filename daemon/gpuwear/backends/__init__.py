"""Where samples come from: :mod:`nvml`, the one module that imports pynvml (the NVML structs defined once, the
variants chosen by the symbols the loaded library exports). Tests and ``--simulate`` hand it the fake library of
:mod:`gpuwear.sim` in place of libnvidia-ml.so.1."""
