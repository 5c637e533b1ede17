"""Loading YAML that cannot hurt the daemon: bounded in size, nesting and alias expansion.

``yaml.safe_load`` refuses arbitrary tags but not hostile shapes: ``"[" * 100000`` makes the
recursive composer raise RecursionError (or overflow the C stack), and a ~1 KB "billion
laughs" file of anchors whose aliases repeat each other composes cheaply into shared objects
that any walk over the value (validation, ``repr`` in an error message) expands to billions of
items. :func:`load_yaml` therefore, before building anything:

* refuses input over ``max_bytes`` (1 MiB), and bytes that are not UTF-8;
* streams the parser's events (the event parser is iterative) and refuses nesting deeper
  than ``max_depth`` (64) collections;
* on the same stream counts the value's *expanded* size, each alias counting the whole
  subtree of its anchor every time it is used, and refuses more than ``max_nodes`` (100000)
  scalars and collections; an alias inside its own anchor (a cyclic value) is refused too;

and only then composes and constructs the value with PyYAML's safe loader (the C one where
available). Every refusal is a :class:`YamlError` whose message is one short line that starts
with ``where``.
"""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000

_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_START = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_END = (yaml.MappingEndEvent, yaml.SequenceEndEvent)

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxlist, _repr.maxtuple, _repr.maxdict, _repr.maxset = 2, 4, 4, 4, 4
_repr.maxstring = _repr.maxlong = _repr.maxother = 50


class YamlError(ValueError):
    """YAML refused: unreadable, invalid, or too large, deep or alias-expanding to load."""


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to at most ``limit`` characters, without walking all of a big value."""
    text = _repr.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc: yaml.YAMLError) -> str:
    """One line for a PyYAML error: the problem and where in the file (line and column, from 1)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if problem and mark is not None:
        context = getattr(exc, "context", None)
        text = f"{context + ': ' if context else ''}{problem} at line {mark.line + 1} column {mark.column + 1}"
    else:
        text = str(exc)
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


def _check_shape(text: str, where: str, max_depth: int, max_nodes: int) -> None:
    """Refuse too deep nesting, too many expanded nodes, or a cyclic alias, from parser events."""
    open_nodes: list[list[Any]] = []  # [anchor, expanded size so far] per open collection
    sizes: dict[str, int] = {}  # anchor -> expanded size of its node (within the current document)
    total, aliased = 0, False

    def add(anchor: str | None, size: int) -> None:
        nonlocal total
        if anchor is not None:
            sizes[anchor] = size
        if open_nodes:
            open_nodes[-1][1] += size
            size = open_nodes[-1][1]
        else:
            total += size
            size = total
        if size > max_nodes:
            raise YamlError(f"{where}: aliases expand to more than {max_nodes} values (an alias bomb?)"
                            if aliased else f"{where}: more than {max_nodes} values")

    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, _START):
            if len(open_nodes) >= max_depth:
                raise YamlError(f"{where}: nested deeper than {max_depth} levels")
            open_nodes.append([event.anchor, 1])
        elif isinstance(event, _END):
            anchor, size = open_nodes.pop()
            add(anchor, size)
        elif isinstance(event, yaml.ScalarEvent):
            add(event.anchor, 1)
        elif isinstance(event, yaml.AliasEvent):
            if any(node[0] == event.anchor for node in open_nodes):
                raise YamlError(f"{where}: alias *{short_repr(event.anchor)[1:-1]} refers to a value "
                                "that contains it (a cyclic value)")
            aliased = True
            add(None, sizes.get(event.anchor or "", 1))  # an undefined alias: the composer names it below
        elif isinstance(event, yaml.DocumentStartEvent):
            sizes.clear()


def load_yaml(text: str | bytes, where: str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
              max_nodes: int = MAX_NODES) -> Any:
    """The value of one YAML document (``None`` for an empty one), loaded safely.

    ``where`` names the source in messages (usually the file path). Raises :class:`YamlError`
    with a one-line message: "WHERE: larger than N bytes", "WHERE: not UTF-8 text (...)",
    "WHERE: nested deeper than N levels", "WHERE: aliases expand to more than N values (an
    alias bomb?)", "WHERE: invalid YAML: PROBLEM at line L column C", ...
    """
    if len(text) > max_bytes or (isinstance(text, str) and len(text.encode("utf-8", "surrogatepass")) > max_bytes):
        raise YamlError(f"{where}: larger than {max_bytes} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise YamlError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        _check_shape(text, where, max_depth, max_nodes)
        return yaml.load(text, Loader=_LOADER)  # the safe loader, on a checked shape
    except YamlError:
        raise
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(getattr(exc, "problem", "")):  # libyaml's own limit, met scanning ahead
            raise YamlError(f"{where}: nested deeper than {max_depth} levels") from None
        raise YamlError(f"{where}: invalid YAML: {_describe(exc)}") from None
    except (ValueError, OverflowError, TypeError) as exc:  # a scalar no Python value holds: 2001-02-30, 5000 digits
        raise YamlError(f"{where}: invalid YAML value: {' '.join(str(exc).split())[:200]}") from None
