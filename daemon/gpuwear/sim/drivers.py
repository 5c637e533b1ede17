"""Driver profiles for the fake NVML library: what one real driver release's libnvidia-ml.so.1 is.

A profile is a release of a branch: the C functions its library exports (:mod:`nvml_symbols`, read from NVIDIA's
nvml.h of every release of the branch), the version strings it reports, the layout it fills for
``nvmlProcessInfo_t``, and the field ids it knows (``NVML_FI_MAX`` of its header: a larger id answers the per-field
``NVML_ERROR_INVALID_ARGUMENT``, as DCGM's ``DcgmTopology.cpp`` expects of a driver "too old for this field").

Each profile names its sources. Version strings: ``nvmlSystemGetDriverVersion`` is the release, e.g.
"535.54.03"; ``nvmlSystemGetNVMLVersion`` is the CUDA major version, the branch and the release
("12.535.54.03"); ``nvmlSystemGetCudaDriverVersion`` is ``1000 * major + 10 * minor`` of the CUDA version the
driver supports (nvml.h, ``NVML_CUDA_DRIVER_VERSION_MAJOR``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from gpuwear.sim import nvml_symbols


@dataclass(frozen=True)
class DriverProfile:
    """One driver release as NVML clients see it."""

    key: str  # the name scenarios and tests use
    branch: str  # nvml_symbols branch
    driver_version: str  # nvmlSystemGetDriverVersion
    cuda_version: tuple[int, int]  # the CUDA version the driver supports
    process_info_bytes: int  # sizeof(nvmlProcessInfo_t) that the _v3 process functions fill: 24, or 32 on 535.43-535.86
    source: str  # where the facts beyond nvml_symbols come from

    @property
    def nvml_version(self) -> str:
        return f"{self.cuda_version[0]}.{self.driver_version}"

    @property
    def cuda_driver_version(self) -> int:
        return 1000 * self.cuda_version[0] + 10 * self.cuda_version[1]

    @property
    def field_id_max(self) -> int:
        """One more than the largest field id this release knows (NVML_FI_MAX)."""
        return nvml_symbols.FIELD_ID_MAX[self.branch]

    @cached_property
    def symbols(self) -> frozenset[str]:
        """The C functions this release exports: its branch's, less those that arrived later in the branch."""
        release = _release(self.driver_version)
        return frozenset(name for name in nvml_symbols.exported(self.branch)
                         if _release(nvml_symbols.ADDED_MID_BRANCH.get(name, "0")) <= release)

    def exports(self, name: str) -> bool:
        return name in self.symbols

    def since(self, branch: str) -> bool:
        """Whether this release's branch is ``branch`` or newer (nvml_symbols.BRANCHES' order)."""
        return nvml_symbols.BRANCHES.index(self.branch) >= nvml_symbols.BRANCHES.index(branch)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


PROFILES: dict[str, DriverProfile] = {p.key: p for p in (
    DriverProfile("r470", "r470", "470.256.02", (11, 4), 24,
                  "R470, the last branch for Kepler; 470.256.02 is its last release (NVIDIA Unix driver archive). "
                  "No _v3 process functions, no nvmlDeviceGetNumFans / GetMemoryInfo_v2 (both R510)."),
    DriverProfile("r525", "r525", "525.147.05", (12, 0), 24,
                  "R525 production branch (CUDA 12.0); nvml.h 525.53 .. 525.85.05."),
    DriverProfile("r535.54", "r535", "535.54.03", (12, 2), 32,
                  "535.54.03: its nvml.h (nvidia-settings a4d50b2d) gives nvmlProcessInfo_t a usedGpuCcProtectedMemory "
                  "(32 bytes, no version bump; 535.43.02 and 535.86.05 too), which nvidia-ml-py 12.535.108+ "
                  "reads as 24 bytes. nvmlDeviceGetRunningProcessDetailList arrives with 535.104.05."),
    DriverProfile("r550", "r550", "550.144.03", (12, 4), 24,
                  "R550 (CUDA 12.4); NVML_FI_MAX 200: field 230 (GPU recovery action) unknown."),
    DriverProfile("r570", "r570", "570.195.03", (12, 8), 24,
                  "R570 (CUDA 12.8): nvmlDeviceGetTemperatureV, nvmlDeviceGetFanSpeedRPM (both since 565.57.01), "
                  "field 230 known."),
    DriverProfile("r580", "r580", "580.95.05", (13, 0), 24,
                  "R580, the first NVML 13 (CUDA 13.0): nvmlDeviceGetTemperature, GetViolationStatus and the "
                  "ClocksThrottleReasons names are DEPRECATED(13.0) in its nvml.h, still exported."),
    DriverProfile("r610", "r610", "610.43.02", (13, 3), 24,
                  "R610 (CUDA 13.3), the newest branch with a published nvml.h (nvidia-settings 5b341a9e)."),
)}
NEWEST = "r610"
