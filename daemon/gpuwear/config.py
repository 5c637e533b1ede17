"""Configuration: a YAML file whose every key has a default; unknown keys are errors.

``load_config`` collects every problem (key path and reason) before failing, so a user
fixes a file in one go. ``config.yaml`` at the repository root documents every key.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from gpuwear.yamlsafe import YamlError, load_yaml, short_repr

MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    """An unusable configuration; ``problems`` lists each as 'key.path: reason'."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _number(lo: float, hi: float) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"expected a number, got {short_repr(v)}"
        if not lo <= v <= hi:
            return f"must be between {lo:g} and {hi:g}, got {short_repr(v)}"
        return None

    return check


def _integer(lo: int, hi: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int):
            return f"expected an integer, got {short_repr(v)}"
        if not lo <= v <= hi:
            return f"must be between {lo} and {hi}, got {short_repr(v)}"
        return None

    return check


def _choice(*options: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in options else f"expected one of {', '.join(options)}, got {short_repr(v)}"

    return check


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"expected true or false, got {short_repr(v)}"


def _string(v: Any) -> str | None:
    return None if isinstance(v, str) else f"expected a string, got {short_repr(v)}"


def parse_listen(value: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:PORT') to (host, port); ':PORT' is every interface (host ''), as Go
    exporters read it. ValueError names the problem."""
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ValueError(f"expected HOST:PORT or :PORT, got {short_repr(value)}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"port must be 1-65535, got {short_repr(port_text)}")
    return host, int(port_text)


def _listen(v: Any) -> str | None:
    if not isinstance(v, str):
        return f"expected HOST:PORT, got {short_repr(v)}"
    try:
        parse_listen(v)
    except ValueError as exc:
        return str(exc)
    return None


def _key_text(key: Any) -> str:
    """A mapping key as it goes into a message: itself when a short printable string, else abbreviated."""
    return key if isinstance(key, str) and key.isprintable() and len(key) <= 60 else short_repr(key)


def _key(default: Any, check: Callable[[Any], str | None]) -> Any:
    return field(default=default, metadata={"check": check})


@dataclass(frozen=True)
class SamplingConfig:
    interval_seconds: float = _key(1.0, _number(0.01, 3600))
    slow_interval_seconds: float = _key(30.0, _number(0.01, 86400))
    event_wait_milliseconds: int = _key(5000, _integer(10, 10000))
    nvml_deadline_seconds: float = _key(5.0, _number(0, 600))
    driver_wait_seconds: float = _key(0.0, _number(0, 86400))


@dataclass(frozen=True)
class SimulationConfig:
    scenario: str = _key("demo", _string)
    speed: float = _key(1.0, _number(0.001, 100000))


@dataclass(frozen=True)
class BandConfig:
    """One model parameter as a low / central / high set (each 0 or more)."""

    low: float = _key(0.0, _number(0, 1e12))
    central: float = _key(0.0, _number(0, 1e12))
    high: float = _key(0.0, _number(0, 1e12))

    def items(self) -> list[tuple[str, float]]:
        return [("low", self.low), ("central", self.central), ("high", self.high)]


def _band(low: float, central: float, high: float) -> Any:
    return field(default_factory=lambda: BandConfig(low, central, high))


@dataclass(frozen=True)
class ArrheniusConfig:
    reference_celsius: float = _key(60.0, _number(-40, 150))
    activation_energy_ev: BandConfig = _band(0.3, 0.7, 1.0)


@dataclass(frozen=True)
class CyclesConfig:
    hysteresis_celsius: float = _key(2.0, _number(0, 50))
    reference_range_celsius: float = _key(40.0, _number(1, 200))
    reference_peak_celsius: float = _key(80.0, _number(-40, 150))
    exponent: BandConfig = _band(2.65, 2.35, 1.9)
    peak_term_kelvin: BandConfig = _band(2185.0, 0.0, 1414.0)


@dataclass(frozen=True)
class FanConfig:
    rated_rpm: float = _key(3000.0, _number(1, 100000))
    l10_hours: BandConfig = _band(30000.0, 50000.0, 70000.0)


RULE_MODES = ("on", "log", "off")


def _rule_modes(v: Any) -> str | None:
    """wear.health.rules: a health rule's code (health.rules.TABLE; the face refuses a code no rule has) -> on, log
    (on trial: said as "would have said", never in the verdict or an alert) or off."""
    if not isinstance(v, dict):
        return f"expected a mapping of rule codes to on, log or off, got {short_repr(v)}"
    for code, mode in v.items():
        if not isinstance(code, str) or not code.isidentifier() or len(code) > 64:
            return f"expected rule codes (as in the runbook's table), got {short_repr(code)}"
        if isinstance(mode, bool):
            return f'{code}: expected on, log or off, got {str(mode).lower()} (write "on" or "off" in quotes)'
        if mode not in RULE_MODES:
            return f"{code}: expected on, log or off, got {short_repr(mode)}"
    return None


@dataclass(frozen=True)
class HealthConfig:
    slowdown_watch_seconds: float = _key(600.0, _number(0, 1e9))
    thermal_throttle_watch_ratio: float = _key(0.05, _number(0, 1))
    resistance_rise_watch_ratio: float = _key(0.15, _number(0.01, 10))
    repeat_incidents: int = _key(5, _integer(2, 1000))
    repeat_window_days: float = _key(7.0, _number(0.01, 3650))
    bleeding_peer_ratio: float = _key(10.0, _number(1, 1e6))
    bleeding_floor_per_loaded_hour: float = _key(1000.0, _number(0, 1e15))
    bleeding_min_loaded_hours: float = _key(1.0, _number(0.01, 1e5))
    bleeding_baseline_days: int = _key(30, _integer(2, 60))
    bleeding_alone_per_loaded_hour: float = _key(10000.0, _number(0, 1e15))
    stall_watch_count: int = _key(3, _integer(1, 1_000_000))
    incident_act_days: float = _key(7.0, _number(0.01, 3650))
    incident_watch_days: float = _key(30.0, _number(0.01, 3650))
    xid_watch_days: float = _key(7.0, _number(0.01, 3650))
    xid_app_days: float = _key(1.0, _number(0.01, 3650))
    xid_card_days: float = _key(14.0, _number(0.01, 3650))
    xid_card_applications: int = _key(2, _integer(2, 1000))
    xid_known_good_runs: int = _key(3, _integer(1, 100000))
    growth_watch_days: float = _key(7.0, _number(0.01, 3650))
    window_days: int = _key(7, _integer(1, 60))
    # code -> mode, as sorted pairs: the parameters are hashed (they key the models' caches)
    rules: tuple[tuple[str, str], ...] = field(default=(), metadata={"check": _rule_modes,
                                                                     "convert": lambda v: tuple(sorted(v.items()))})
    margin_celsius: float = _key(5.0, _number(0.5, 50))
    margin_watch_ratio: float = _key(0.25, _number(0.01, 1))


@dataclass(frozen=True)
class WearConfig:
    persist_interval_seconds: float = _key(60.0, _number(0.01, 86400))
    event_retention_days: float = _key(365.0, _number(0, 36500))
    max_gap_seconds: float = _key(30.0, _number(0.01, 86400))
    busy_utilization_ratio: float = _key(0.1, _number(0, 1))
    arrhenius: ArrheniusConfig = field(default_factory=ArrheniusConfig)
    cycles: CyclesConfig = field(default_factory=CyclesConfig)
    fan: FanConfig = field(default_factory=FanConfig)
    health: HealthConfig = field(default_factory=HealthConfig)


@dataclass(frozen=True)
class JobsConfig:
    end_grace_seconds: float = _key(60.0, _number(0, 86400))
    record_users: bool = _key(False, _boolean)
    user_in_metrics: bool = _key(False, _boolean)
    retention_days: float = _key(90.0, _number(0, 36500))


def _socket_path(v: Any) -> str | None:
    """A unix socket's path: absolute and within the kernel's 107 bytes, or empty (none)."""
    if not isinstance(v, str):
        return f"expected a path, got {short_repr(v)}"
    if v and not v.startswith("/"):
        return f"expected an absolute path (or \"\" for none), got {short_repr(v)}"
    if len(os.fsencode(v)) > 107:
        return f"a unix socket path is at most 107 bytes, got {len(os.fsencode(v))}"
    return None


@dataclass(frozen=True)
class KubernetesConfig:
    pod_resources_socket: str = _key("/var/lib/kubelet/pod-resources/kubelet.sock", _socket_path)
    pod_resources_refresh_seconds: float = _key(10.0, _number(1, 3600))


@dataclass(frozen=True)
class MetricsConfig:
    detail: bool = _key(False, _boolean)


def _otlp_enabled(v: Any) -> str | None:
    """otlp.enabled: auto (OTEL_METRICS_EXPORTER decides), true or false."""
    if v in ("auto", True, False):
        return None
    return f"expected auto, true or false, got {short_repr(v)}"


def _otlp_endpoint(v: Any) -> str | None:
    """otlp.endpoint: "" (the OTEL_EXPORTER_OTLP_* variables', else the SDK's default) or an http(s) URL."""
    if not isinstance(v, str):
        return f"expected an http:// or https:// URL, or \"\", got {short_repr(v)}"
    if v and (not v.startswith(("http://", "https://")) or not v.isprintable() or " " in v):
        return f"expected an http:// or https:// URL, or \"\", got {short_repr(v)}"
    return None


def otlp_headers(text: str) -> dict[str, str]:
    """``key=value,key2=value2`` (the format of OTEL_EXPORTER_OTLP_HEADERS) as a mapping; ValueError naming a bad
    pair."""
    out: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not pair.isprintable():
            raise ValueError(f"expected key=value pairs separated by commas, got {short_repr(pair)}")
        out[key.strip()] = value.strip()
    return out


def _otlp_headers(v: Any) -> str | None:
    if not isinstance(v, str):
        return f"expected key=value pairs separated by commas, got {short_repr(v)}"
    try:
        otlp_headers(v)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class OtlpConfig:
    enabled: Any = _key("auto", _otlp_enabled)
    endpoint: str = _key("", _otlp_endpoint)
    protocol: str = _key("", _choice("", "http/protobuf", "grpc"))
    headers: str = _key("", _otlp_headers)
    certificate: str = _key("", _string)
    client_certificate: str = _key("", _string)
    client_key: str = _key("", _string)
    interval_seconds: float = _key(60.0, _number(1, 86400))
    timeout_seconds: float = _key(10.0, _number(0.1, 300))

    def on(self, environ: Mapping[str, str]) -> bool:
        """Whether to push: ``enabled`` true, or auto with OTEL_METRICS_EXPORTER naming otlp (the SDK's own switch;
        OTEL_EXPORTER_OTLP_ENDPOINT alone, which operators inject into every pod, turns nothing on)."""
        if self.enabled != "auto":
            return bool(self.enabled)
        return "otlp" in {e.strip() for e in environ.get("OTEL_METRICS_EXPORTER", "").split(",")}


def _kernel_log(v: Any) -> str | None:
    """health.kernel_log: auto, journal, kmsg, off, or the absolute path of a file to follow."""
    if v is False:  # YAML 1.1 reads an unquoted off as false
        return 'expected auto, journal, kmsg, off or an absolute path, got false (write "off" in quotes)'
    if not isinstance(v, str):
        return f"expected auto, journal, kmsg, off or an absolute path, got {short_repr(v)}"
    if v in ("auto", "journal", "kmsg", "off") or v.startswith("/"):
        return None
    return f"expected auto, journal, kmsg, off or an absolute path, got {short_repr(v)}"


def _host_root(v: Any) -> str | None:
    """health.host_root: auto, off, or the absolute path of a tree laid out as / (its sys/bus/pci/devices and
    proc/driver/nvidia/gpus)."""
    if isinstance(v, str) and (v in ("auto", "off") or v.startswith("/")):
        return None
    return f"expected auto, off (in quotes) or an absolute path, got {short_repr(v)}"


@dataclass(frozen=True)
class HostHealthConfig:
    kernel_log: str = _key("auto", _kernel_log)
    host_root: str = _key("auto", _host_root)


@dataclass(frozen=True)
class Config:
    listen: str = _key("127.0.0.1:9941", _listen)
    web_config_file: str = _key("", _string)
    state_dir: str = _key("", _string)
    log_level: str = _key("info", _choice("debug", "info", "warning", "error"))
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    wear: WearConfig = field(default_factory=WearConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    health: HostHealthConfig = field(default_factory=HostHealthConfig)
    otlp: OtlpConfig = field(default_factory=OtlpConfig)

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_listen(self.listen)

    @property
    def listen_is_loopback(self) -> bool:
        host = self.listen_address[0]
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def resolved_state_dir(self) -> Path:
        """The state directory: the configured one, else systemd's $STATE_DIRECTORY, else
        ~/.local/state/gpuwear."""
        if self.state_dir:
            return Path(self.state_dir).expanduser()
        if os.environ.get("STATE_DIRECTORY"):
            return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
        return Path.home() / ".local" / "state" / "gpuwear"


def _build(cls: Any, data: Any, path: str, problems: list[str], base: Any = None) -> Any:
    base = cls() if base is None else base
    if data is None:
        return base
    if not isinstance(data, dict):
        problems.append(f"{path.rstrip('.') or '(top level)'}: expected a mapping, got {type(data).__name__}")
        return base
    known = {f.name: f for f in fields(cls)}
    for key in data:
        if key not in known:
            problems.append(f"{path}{_key_text(key)}: unknown key (known: {', '.join(known)})")
    values: dict[str, Any] = {}
    for name, f in known.items():
        if name not in data:
            continue
        default = getattr(base, name)
        if is_dataclass(default):  # a section
            values[name] = _build(type(default), data[name], f"{path}{name}.", problems, default)
            continue
        value = data[name]
        if isinstance(value, int) and not isinstance(value, bool) and isinstance(f.default, float):
            value = float(value)
        problem = f.metadata["check"](value)
        if problem:
            problems.append(f"{path}{name}: {problem}")
        else:
            values[name] = f.metadata.get("convert", lambda v: v)(value)
    return replace(base, **values)


def parse_config(data: Any) -> Config:
    """A :class:`Config` from parsed YAML; raises :class:`ConfigError` with every problem."""
    problems: list[str] = []
    config = _build(Config, data, "", problems)
    if problems:
        raise ConfigError(problems)
    return config  # type: ignore[no-any-return]


def load_config(path: str | Path | None) -> Config:
    """Read and validate a config file (``None``: the defaults)."""
    if path is None:
        return Config()
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # no more than one byte past the limit, whatever the file
    except OSError as exc:
        raise ConfigError([f"{p}: cannot read: {exc.strerror or exc}"]) from None
    try:
        data = load_yaml(raw, str(p), max_bytes=MAX_CONFIG_BYTES)
    except YamlError as exc:
        raise ConfigError([str(exc)]) from None
    return parse_config(data)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf key of a config as 'section.key' -> value."""
    out: dict[str, Any] = {}
    for f in fields(config):
        value = getattr(config, f.name)
        if is_dataclass(value):
            out.update(flatten(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out
