"""A small docstring reader: the description and the per-parameter texts.

Function tools need two things from a docstring: what the tool does (the text
before the first section) and one sentence or so per parameter.  This reads
the three styles Python code uses:

* Google: ``Args:`` (or ``Arguments:``, ``Parameters:``, ``Keyword Args:`` ...)
  followed by indented ``name (type): text`` entries;
* NumPy: a ``Parameters`` title underlined with dashes, ``name : type`` lines
  and indented text;
* Sphinx / reST: ``:param name: text`` (or ``:param type name: text``) fields.

Anything else (``Returns:``, ``Raises``, ``:rtype:`` ...) ends the description
and is otherwise ignored.  Continuation lines are joined with single spaces.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

import attrs

# Google section titles: the ones that list parameters, and every other one (they end a section).
_GOOGLE_PARAMS = frozenset(
    {
        "args",
        "arguments",
        "parameters",
        "params",
        "keyword args",
        "keyword arguments",
        "kwargs",
        "other parameters",
        "other params",
    }
)
_GOOGLE_ATTRIBUTES = frozenset({"attributes"})
_GOOGLE_OTHER = frozenset(
    {
        "returns",
        "return",
        "yields",
        "yield",
        "raises",
        "raise",
        "except",
        "exceptions",
        "warns",
        "warnings",
        "warning",
        "examples",
        "example",
        "notes",
        "note",
        "see also",
        "references",
        "todo",
        "methods",
        "receives",
        "tip",
        "hint",
        "important",
        "caution",
        "danger",
        "attention",
    }
)
_GOOGLE_HEADER = re.compile(r"^([A-Za-z][A-Za-z ]*?)\s*:\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:(?:\s+(.*))?$")
_NUMPY_UNDERLINE = re.compile(r"^-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(?::.*)?$")
_SPHINX_FIELD = re.compile(r"^:([A-Za-z]+)((?:\s+[^:]+)?)\s*:(?:\s+(.*))?$")
_SPHINX_PARAMS = frozenset({"param", "parameter", "arg", "argument", "key", "keyword"})
_SPHINX_ATTRIBUTES = frozenset({"var", "ivar", "cvar"})


@attrs.frozen
class Docstring:
    """What a docstring says about a callable.

    Attributes:
        description: the text before the first section (summary and extended
            description), or ``""``.
        params: parameter (or attribute) name -> its description, in order.
    """

    description: str
    params: Mapping[str, str]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join(lines: list[str]) -> str:
    return " ".join(part for part in (line.strip() for line in lines) if part)


def _section_start(lines: list[str], index: int) -> tuple[str, str, int] | None:
    """``(style, title, first body line)`` if a section starts at ``index``."""
    line = lines[index]
    if not line.strip() or _indent(line) > 0:
        return None
    stripped = line.strip()
    if stripped.startswith(":") and _SPHINX_FIELD.match(stripped):
        return ("sphinx", "", index)
    if index + 1 < len(lines) and _NUMPY_UNDERLINE.match(lines[index + 1].strip()) and _indent(lines[index + 1]) == 0:
        return ("numpy", stripped.lower(), index + 2)
    match = _GOOGLE_HEADER.match(stripped)
    if match:
        title = match.group(1).lower()
        if title in _GOOGLE_PARAMS or title in _GOOGLE_ATTRIBUTES or title in _GOOGLE_OTHER:
            return ("google", title, index + 1)
    return None


def parse_docstring(doc: str | None, *, attributes: bool = False) -> Docstring:
    """Read ``doc`` (Google, NumPy or Sphinx style).

    Args:
        doc: the raw ``__doc__`` (None gives an empty result).
        attributes: read the attribute sections (``Attributes:``, ``:ivar x:``)
            as the parameter texts, for a class whose fields are its parameters;
            the parameter sections count too.
    """
    if not doc:
        return Docstring("", {})
    lines = inspect.cleandoc(doc).splitlines()
    starts = [(i, start) for i in range(len(lines)) if (start := _section_start(lines, i)) is not None]
    end = starts[0][0] if starts else len(lines)
    description = "\n".join(lines[:end]).strip()
    params: dict[str, str] = {}
    wanted_google = _GOOGLE_PARAMS | (_GOOGLE_ATTRIBUTES if attributes else frozenset())
    wanted_sphinx = _SPHINX_PARAMS | (_SPHINX_ATTRIBUTES if attributes else frozenset())
    for position, (index, (style, title, body)) in enumerate(starts):
        stop = starts[position + 1][0] if position + 1 < len(starts) else len(lines)
        if style == "sphinx":
            _read_sphinx(lines[index:stop], wanted_sphinx, params)
        elif style == "numpy" and title in wanted_google:
            _read_numpy(lines[body:stop], params)
        elif style == "google" and title in wanted_google:
            _read_google(lines[body:stop], params)
    return Docstring(description, params)


def _read_google(body: list[str], params: dict[str, str]) -> None:
    entry_indent: int | None = None
    name: str | None = None
    text: list[str] = []
    for line in [*body, ""]:
        if not line.strip():
            continue
        indent = _indent(line)
        if entry_indent is None:
            entry_indent = indent
        if indent <= entry_indent:
            if name is not None:
                params.setdefault(name, _join(text))
            match = _GOOGLE_ENTRY.match(line.strip())
            name, text = (match.group(1), [match.group(2) or ""]) if match else (None, [])
        elif name is not None:
            text.append(line)
    if name is not None:
        params.setdefault(name, _join(text))


def _read_numpy(body: list[str], params: dict[str, str]) -> None:
    names: list[str] = []
    text: list[str] = []

    def flush() -> None:
        for one in names:
            params.setdefault(one, _join(text))

    for line in body:
        if not line.strip():
            continue
        if _indent(line) == 0:
            flush()
            match = _NUMPY_ENTRY.match(line.strip())
            names = [part.strip().lstrip("*") for part in match.group(1).split(",")] if match else []
            text = []
        else:
            text.append(line)
    flush()


def _read_sphinx(body: list[str], wanted: frozenset[str], params: dict[str, str]) -> None:
    name: str | None = None
    text: list[str] = []
    for line in [*body, ":end:"]:
        if not line.strip():
            continue
        match = _SPHINX_FIELD.match(line.strip()) if _indent(line) == 0 else None
        if match is None:
            if name is not None:
                text.append(line)
            continue
        if name is not None:
            params.setdefault(name, _join(text))
        kind, target, first = match.group(1).lower(), match.group(2).split(), match.group(3) or ""
        name, text = (target[-1].lstrip("*"), [first]) if kind in wanted and target else (None, [])
