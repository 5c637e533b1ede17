"""Configuration: defaults, the documented config.yaml, and every problem reported at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from gpuwear.config import Config, ConfigError, flatten, load_config, parse_config


def gpuwear(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuwear", *args], capture_output=True, text=True,
                          timeout=30, check=False)


def test_documented_default_equals_the_built_in_defaults() -> None:
    assert load_config(REPO / "config.yaml") == Config()


def test_every_key_of_config_yaml_is_commented() -> None:
    lines = (REPO / "config.yaml").read_text().splitlines()
    keys = set(flatten(Config()))
    seen = set()
    path: list[tuple[int, str]] = []  # (indent, key) of the enclosing sections
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0]
        while path and path[-1][0] >= indent:
            path.pop()
        full = ".".join([k for _, k in path] + [key])
        path.append((indent, key))
        if full in keys:
            assert lines[i - 1].strip().startswith("#"), f"config.yaml: {full} has no comment above it"
            seen.add(full)
    assert seen == keys


def test_partial_config_keeps_defaults() -> None:
    config = parse_config({"sampling": {"interval_seconds": 5}})
    assert config.sampling.interval_seconds == 5.0
    assert config.sampling.slow_interval_seconds == 30.0 and config.listen == "127.0.0.1:9941"


def test_every_problem_is_reported_with_its_key_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"listen": "nowhere", "colour": "blue",
                      "sampling": {"interval_seconds": -1, "slow_interval_seconds": "often", "extra": 1},
                      "simulation": [1, 2], "log_level": "loud"})
    problems = info.value.problems
    assert len(problems) == 7, problems
    for expected in ("listen: expected HOST:PORT", "colour: unknown key", "sampling.interval_seconds: must be between",
                     "sampling.slow_interval_seconds: expected a number", "sampling.extra: unknown key",
                     "simulation: expected a mapping", "log_level: expected one of"):
        assert any(p.startswith(expected) for p in problems), (expected, problems)


@pytest.mark.parametrize("value", [True, float("nan"), float("inf"), 10**9, None])
def test_bad_numbers(value: object) -> None:
    with pytest.raises(ConfigError, match=r"sampling\.interval_seconds"):
        parse_config({"sampling": {"interval_seconds": value}})


def test_unreadable_files(tmp_path: Path) -> None:
    bad_utf8 = tmp_path / "latin1.yaml"
    bad_utf8.write_bytes(b"listen: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad_utf8)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("listen: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad_yaml)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    assert load_config(empty) == Config()
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="top level"):
        load_config(scalar)


def test_check_config_command(tmp_path: Path) -> None:
    ok = gpuwear("check-config", str(REPO / "config.yaml"))
    assert ok.returncode == 0 and "valid" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"sampling": {"interval_seconds": 0}, "listen": 9941}))
    result = gpuwear("check-config", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"gpuwear: {bad}: ") for line in lines), lines
    assert "Traceback" not in result.stderr


def test_run_refuses_an_invalid_config_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampling:\n  interval_seconds: fast\n")
    result = gpuwear("run", "--simulate", "--config", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == f"gpuwear: {bad}: sampling.interval_seconds: expected a number, got 'fast'"


def test_a_bare_off_for_the_kernel_log_says_to_quote_it(tmp_path: Path) -> None:
    """YAML 1.1 reads `kernel_log: off` as false: the refusal says so, in one line; quoted, it is taken."""
    path = tmp_path / "config.yaml"
    path.write_text("health:\n  kernel_log: off\n")
    with pytest.raises(ConfigError, match=r'health\.kernel_log: .*got false \(write "off" in quotes\)'):
        load_config(path)
    path.write_text('health:\n  kernel_log: "off"\n')
    assert load_config(path).health.kernel_log == "off"
    for bad in ("journald", "relative/kern.log", 3):
        with pytest.raises(ConfigError, match=r"health\.kernel_log: expected auto, journal, kmsg, off or an absolute"):
            parse_config({"health": {"kernel_log": bad}})
