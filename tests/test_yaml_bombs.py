"""Hostile YAML (too big, too deep, alias bombs, bad bytes) is refused quickly, in bounded memory,
with a one-line message: by the loader, the config file, the check-config command and scenarios."""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwear import yamlsafe
from gpuwear.config import Config, ConfigError, load_config, parse_config
from gpuwear.sim.simulated import ScenarioError, load_scenario
from gpuwear.yamlsafe import MAX_BYTES, MAX_DEPTH, MAX_NODES, YamlError, load_yaml, short_repr


def alias_bomb() -> str:
    """'Billion laughs': 9 levels of 9 aliases each, 9**9 (387 million) strings once expanded."""
    lines = ["lol1: &lol1 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(2, 10):
        lines.append(f"lol{level}: &lol{level} [" + ", ".join([f"*lol{level - 1}"] * 9) + "]")
    lines.append("listen: *lol9")  # a known key, so validation (and its message) meets the value
    return "\n".join(lines) + "\n"


DEEP_FLOW = "[" * 100_000 + "\n"
DEEP_BLOCK = "- " * 100_000 + "x\n"


@contextmanager
def bounded(seconds: float = 1.0, megabytes: float = 50) -> Iterator[None]:
    """The block answers within ``seconds`` and allocates at most ``megabytes`` at its peak."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        yield
    finally:
        elapsed = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < seconds, f"took {elapsed:.2f} s"
    assert peak < megabytes * 1e6, f"peak {peak / 1e6:.1f} MB"


def refused(call: Callable[[], Any], error: type[Exception] = YamlError) -> str:
    """The one-line message of the error ``call`` raises, answered quickly and in bounded memory."""
    with bounded(), pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    return message


def test_the_alias_bomb_is_small() -> None:
    assert 500 < len(alias_bomb()) < 1500


@pytest.mark.parametrize(("text", "problem"), [
    ("a: " + "x" * MAX_BYTES, f"f.yaml: larger than {MAX_BYTES} bytes"),
    ("a: " + "é" * (MAX_BYTES // 2), f"f.yaml: larger than {MAX_BYTES} bytes"),  # counted in UTF-8 bytes
    (DEEP_FLOW, f"f.yaml: nested deeper than {MAX_DEPTH} levels"),
    (DEEP_BLOCK, f"f.yaml: nested deeper than {MAX_DEPTH} levels"),
    ("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)), f"f.yaml: nested deeper than {MAX_DEPTH} levels"),
    (alias_bomb(), f"f.yaml: aliases expand to more than {MAX_NODES} values (an alias bomb?)"),
    ("a: &a [1, *a]\n", "f.yaml: alias *a refers to a value that contains it (a cyclic value)"),
    ("listen: [unclosed\nstate_dir: x\n", "f.yaml: invalid YAML: while parsing a flow sequence: did not find expected "
                                          "',' or ']' at line 2 column 1"),
    ("a: !!python/object/apply:os.system [true]\n", "f.yaml: invalid YAML: could not determine a constructor"),
    ("a: *nowhere\n", "f.yaml: invalid YAML: found undefined alias at line 1 column 4"),
    ("a: 2001-02-30\n", "f.yaml: invalid YAML value: day is out of range for month"),
    ("a: " + "9" * 5000 + "\n", "f.yaml: invalid YAML value: Exceeds the limit"),
    (b"listen: caf\xe9\n", "f.yaml: not UTF-8 text (invalid continuation byte at byte 11)"),
    ("\ufeffa: 1\n".encode("utf-16"), "f.yaml: not UTF-8 text"),
])
def test_hostile_yaml_is_refused_quickly_in_one_line(text: str | bytes, problem: str) -> None:
    assert refused(lambda: load_yaml(text, "f.yaml")).startswith(problem)


def test_the_pure_python_parser_is_guarded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where PyYAML lacks libyaml the loader falls back on the pure-Python one; the limits hold."""
    monkeypatch.setattr(yamlsafe, "_LOADER", yaml.SafeLoader)
    for text, problem in [(alias_bomb(), "aliases expand"), (DEEP_FLOW, "nested deeper"),
                          (DEEP_BLOCK, "nested deeper")]:
        start = time.monotonic()
        with pytest.raises(YamlError, match=problem):
            load_yaml(text, "f.yaml")
        assert time.monotonic() - start < 5
    assert load_yaml("a: &a [1]\nb: *a\n", "f.yaml") == {"a": [1], "b": [1]}


def test_limits_can_be_set_per_call() -> None:
    assert refused(lambda: load_yaml("[[[1]]]", "w.yml", max_depth=2)) == "w.yml: nested deeper than 2 levels"
    assert refused(lambda: load_yaml(b"abc", "w.yml", max_bytes=2)) == "w.yml: larger than 2 bytes"
    assert refused(lambda: load_yaml("a: &a [1, 2]\nb: [*a, *a]\n", "w.yml", max_nodes=8)).startswith(
        "w.yml: aliases expand to more than 8 values")
    assert refused(lambda: load_yaml("[" + "1, " * 1000 + "1]", "w.yml", max_nodes=1000)) == \
        "w.yml: more than 1000 values"
    assert load_yaml("a: &a [1, 2]\nb: [*a, *a]\n", "w.yml", max_nodes=13) == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


def test_nesting_up_to_the_limit_is_accepted() -> None:
    flow = load_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH, "f.yaml")
    block = load_yaml("- " * MAX_DEPTH + "x\n", "f.yaml")
    for value in (flow, block):
        depth = 0
        while isinstance(value, list):
            depth += 1
            value = value[0] if value else None
        assert depth == MAX_DEPTH


def test_benign_yaml_with_a_few_aliases_is_accepted() -> None:
    text = ("defaults: &defaults {kind: train, seconds: 600}\n"
            "phases: [*defaults, *defaults, {<<: *defaults, seconds: 60}]\n"
            "empty:\n")
    with bounded():
        doc = load_yaml(text.encode(), "f.yaml")
    assert doc == {"defaults": {"kind": "train", "seconds": 600},
                   "phases": [{"kind": "train", "seconds": 600}] * 2 + [{"kind": "train", "seconds": 60}],
                   "empty": None}
    assert load_yaml("", "f.yaml") is None
    assert load_yaml("# only a comment\n", "f.yaml") is None
    assert load_yaml("\ufeffa: 1\n".encode(), "f.yaml") == {"a": 1}  # a UTF-8 byte order mark is fine


def test_short_repr_is_short_without_walking_a_big_value() -> None:
    row = list(range(1000))
    big = [row] * 1000  # a million items, shared rows
    with bounded(megabytes=1):
        text = short_repr(big)
    assert len(text) <= 60 and text.startswith("[[0, 1, 2, 3")
    assert short_repr("fast") == "'fast'" and short_repr(2.5) == "2.5"
    assert len(short_repr("x" * 10**6)) <= 60


def test_config_errors_keep_big_values_out_of_their_messages() -> None:
    row = list(range(1000))
    big = [row] * 1000
    with bounded(), pytest.raises(ConfigError) as info:
        parse_config({"listen": big, "state_dir": big, "log_level": "x" * 10**6, "sampling": {"interval_seconds": big},
                      "jobs": {"record_users": big}, "k" * 10**6: 1, "bad\nkey": 2})
    problems = info.value.problems
    assert len(problems) == 7
    for problem in problems:
        assert "\n" not in problem and len(problem) < 300, problem
    with pytest.raises(ConfigError, match=r"^listen: expected HOST:PORT.*, got 'h+\.\.\.h+'$") as info:
        parse_config({"listen": "h" * 10**6})
    assert len(str(info.value)) < 150


@pytest.mark.parametrize(("text", "problem"), [
    (alias_bomb(), f"aliases expand to more than {MAX_NODES} values"),
    (DEEP_FLOW, f"nested deeper than {MAX_DEPTH} levels"),
    (DEEP_BLOCK, f"nested deeper than {MAX_DEPTH} levels"),
    ("sampling:\n  interval_seconds: 5\n" + "# padding\n" * (MAX_BYTES // 10), f"larger than {MAX_BYTES} bytes"),
    ("listen: [unclosed\n", "invalid YAML: while parsing a flow sequence"),
])
def test_config_file_bombs_are_config_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    message = refused(lambda: load_config(path), ConfigError)
    assert message.startswith(f"{path}: {problem}"), message


def test_a_config_file_may_use_aliases(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("wear:\n  cycles:\n    exponent: &band {low: 2.0, central: 2.0, high: 2.0}\n"
                    "    peak_term_kelvin: *band\n")
    config = load_config(path)
    assert config.wear.cycles.exponent == config.wear.cycles.peak_term_kelvin != Config().wear.cycles.exponent


@pytest.mark.parametrize(("text", "problem"), [
    (alias_bomb(), f"aliases expand to more than {MAX_NODES} values"),
    (DEEP_FLOW, f"nested deeper than {MAX_DEPTH} levels"),
])
def test_check_config_refuses_bombs_in_one_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "gpuwear", "check-config", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)
    elapsed = time.monotonic() - start
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpuwear: {path}: {path}: {problem}"), lines
    assert elapsed < 5, f"took {elapsed:.1f} s"


@pytest.mark.parametrize(("text", "problem"), [
    ("gpus: [{product: v100}]\n" + alias_bomb().replace("listen:", "faults:"),
     f"scenario bomb: aliases expand to more than {MAX_NODES} values"),
    (DEEP_FLOW, f"scenario bomb: nested deeper than {MAX_DEPTH} levels"),
    ("gpus: [{product: v100}]\ndriver: " + "x" * 100_000 + "\n", "scenario bomb: driver: expected one of"),
])
def test_scenario_file_bombs_are_scenario_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    assert refused(lambda: load_scenario(str(path)), ScenarioError).startswith(problem)
    path.write_bytes(b"gpus: [{product: v100}]\ndescription: caf\xe9\n")
    assert refused(lambda: load_scenario(str(path)), ScenarioError).startswith("scenario bomb: not UTF-8 text")
