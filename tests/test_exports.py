"""The public surface: every exported name has a docstring and is documented in ``docs/``.

A public name is anything in a public package's namespace whose name does not
start with ``_`` (what ``from ._x import Name as Name`` re-exports), minus
submodules.  Constants and type aliases have no ``__doc__`` of their own; their
docstring is the string literal written under the assignment in the module
that defines them (the convention Sphinx's autodoc reads), found by following
the re-export chain.  The documentation check needs no Sphinx build: it reads
the ``.. auto*::`` directives of the ``.rst`` sources.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"

PUBLIC_PACKAGES = (
    "trio_harness",
    "trio_harness.session",
    "trio_harness.agents",
    "trio_harness.model",
    "trio_harness.tasks",
    "trio_harness.bash",
    "trio_harness.tools",
    "trio_harness.testing",
    "trio_harness.acp",
    "trio_harness.events",
)

# Public names that have no docstring yet, in modules this test does not own.
# Each entry is a known gap to fix at its definition; empty this allowlist as
# docstrings are added (a stale entry fails the test, so it cannot linger).
MISSING_DOCSTRINGS_ALLOWLIST: frozenset[str] = frozenset()

_DIRECTIVE = re.compile(
    r"^(?P<indent>[ \t]*)\.\.[ \t]+auto(?P<kind>class|function|data|exception|attribute|method|decorator|module)"
    r"::[ \t]*(?P<target>\S+)[ \t]*$"
)


def _packages() -> Iterator[types.ModuleType]:
    for name in PUBLIC_PACKAGES:
        try:
            yield importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a package still being written
            if exc.name != name:
                raise


def public_names() -> list[tuple[str, str, object]]:
    """``(package, name, object)`` for every public name of every public package."""
    found = []
    for package in _packages():
        for name, obj in vars(package).items():
            if name.startswith("_") or isinstance(obj, types.ModuleType):
                continue
            if type(obj).__module__ == "__future__":
                continue  # `from __future__ import annotations` in an __init__.py is not an export
            found.append((package.__name__, name, obj))
    return found


def attribute_docstring(module_name: str, name: str, depth: int = 0) -> str | None:
    """The string literal under ``name = ...`` in ``module_name``, following re-exports."""
    if depth > 5:
        return None
    module = importlib.import_module(module_name)
    body = ast.parse(inspect.getsource(module)).body
    package = module.__package__ or module_name
    for index, node in enumerate(body):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = importlib.util.resolve_name("." * node.level + node.module, package)
                    return attribute_docstring(source, alias.name, depth + 1)
        targets: list[str] = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        if name in targets and index + 1 < len(body):
            following = body[index + 1]
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                return following.value.value
    return None


def docstring_of(package: str, name: str, obj: object) -> str | None:
    """The docstring a reader of ``package.name`` gets, or None."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")  # not inherited
    elif inspect.isroutine(obj) or callable(getattr(obj, "__wrapped__", None)):
        doc = getattr(obj, "__doc__", None)
    else:
        doc = attribute_docstring(package, name)
    return doc if isinstance(doc, str) and doc.strip() else None


@functools.cache
def documented() -> dict[str, list[bool]]:
    """Every ``.. auto*::`` target in ``docs/``, with one ``no_index`` flag per occurrence."""
    targets: dict[str, list[bool]] = {}
    for path in sorted(DOCS.rglob("*.rst")):
        if "_build" in path.parts:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            match = _DIRECTIVE.match(line)
            if match is None:
                continue
            indent = len(match["indent"])
            no_index = False
            for option in lines[number + 1 :]:
                stripped = option.strip()
                if not stripped.startswith(":") or len(option) - len(option.lstrip()) <= indent:
                    break
                no_index = no_index or stripped in (":no-index:", ":noindex:")
            targets.setdefault(match["target"], []).append(no_index)
    return targets


def resolve(target: str) -> object:
    """Import the object a dotted autodoc target names."""
    parts = target.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(target)


NAMES = public_names()


def test_the_public_packages_export_something() -> None:
    packages = {package for package, _, _ in NAMES}
    assert {"trio_harness", "trio_harness.agents", "trio_harness.session"} <= packages
    assert len(NAMES) > 100


@pytest.mark.parametrize(("package", "name", "obj"), NAMES, ids=[f"{p}.{n}" for p, n, _ in NAMES])
def test_public_name_has_a_docstring(package: str, name: str, obj: object) -> None:
    qualified = f"{package}.{name}"
    doc = docstring_of(package, name, obj)
    if qualified in MISSING_DOCSTRINGS_ALLOWLIST:
        assert doc is None, f"{qualified} has a docstring now: remove it from MISSING_DOCSTRINGS_ALLOWLIST"
        pytest.skip(f"{qualified} has no docstring yet (allowlisted)")
    assert doc is not None, f"{qualified} has no docstring; write one where it is defined"


def test_allowlist_names_exist() -> None:
    exported = {f"{package}.{name}" for package, name, _ in NAMES}
    assert exported >= MISSING_DOCSTRINGS_ALLOWLIST


@pytest.mark.parametrize(("package", "name", "obj"), NAMES, ids=[f"{p}.{n}" for p, n, _ in NAMES])
def test_public_methods_have_docstrings(package: str, name: str, obj: object) -> None:
    if not inspect.isclass(obj):
        return
    missing = []
    for member, value in vars(obj).items():
        if member.startswith("_"):
            continue
        if isinstance(value, property) or inspect.isfunction(value):
            doc = inspect.getdoc(value)
        elif isinstance(value, classmethod | staticmethod):
            doc = inspect.getdoc(value.__func__)
        else:
            continue
        if not doc:
            missing.append(member)
    assert not missing, f"{package}.{name} has public members without a docstring: {missing}"


@pytest.mark.parametrize(("package", "name", "obj"), NAMES, ids=[f"{p}.{n}" for p, n, _ in NAMES])
def test_public_name_is_in_an_autodoc_directive(package: str, name: str, obj: object) -> None:
    qualified = f"{package}.{name}"
    assert qualified in documented(), (
        f"{qualified} is not documented: add `.. autoclass:: {qualified}` (or autofunction, "
        "autodata, autoexception) to the API reference in docs/api/, with `:no-index:` if the "
        "object is documented in full under another name"
    )


def test_each_exported_object_is_indexed_exactly_once() -> None:
    """Re-exports are documented with ``:no-index:``; the defining package's entry is the index."""
    targets = documented()
    by_object: dict[int, list[str]] = {}
    for package, name, obj in NAMES:
        if inspect.isclass(obj) or inspect.isroutine(obj):
            by_object.setdefault(id(obj), []).append(f"{package}.{name}")
    problems = []
    for names in by_object.values():
        indexed = [n for n in names for flag in targets.get(n, []) if not flag]
        if len(indexed) != 1:
            problems.append(f"{names}: indexed as {indexed}")
    assert not problems, "each exported object needs exactly one directive without :no-index:\n" + "\n".join(problems)


def test_every_autodoc_target_exists() -> None:
    targets = documented()
    assert targets, f"no autodoc directives found under {DOCS}"
    for target in targets:
        resolve(target)  # raises if the docs name something that does not exist


# ---------------------------------------------------------------- exceptions: their public module

EXCEPTIONS = sorted(
    {obj for _, _, obj in NAMES if isinstance(obj, type) and issubclass(obj, BaseException)}, key=lambda c: c.__name__
)


def indexed_package(obj: object) -> str:
    """The package of the reference entry that indexes ``obj`` (the directive without ``:no-index:``)."""
    targets = documented()
    (entry,) = [
        f"{package}.{name}"
        for package, name, other in NAMES
        if other is obj and False in targets.get(f"{package}.{name}", [])
    ]
    return entry.rpartition(".")[0]


def test_exceptions_are_collected() -> None:
    names = {cls.__name__ for cls in EXCEPTIONS}
    assert {"HarnessError", "RunError", "BashError", "RpcError", "EventLogMismatch"} <= names


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__name__)
def test_a_public_exception_shows_the_package_it_is_imported_from(cls: type[BaseException]) -> None:
    """``trio_harness.RunError`` in tracebacks and reprs, not ``trio_harness._errors.RunError``."""
    package = indexed_package(cls)
    assert cls.__module__ == package, f"{cls.__qualname__} shows module {cls.__module__!r}, not {package!r}"
    assert getattr(importlib.import_module(package), cls.__qualname__) is cls  # pickle finds it there
    assert repr(cls) == f"<class '{package}.{cls.__qualname__}'>"


def test_a_traceback_names_the_public_module() -> None:
    import traceback

    from trio_harness import RunError

    lines = traceback.format_exception(RunError("the turn ended with reason error"))
    assert lines[-1] == "trio_harness.RunError: the turn ended with reason error\n"


def _example(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` with every argument its constructor requires (a string, or a tuple of strings)."""
    try:
        signature = inspect.signature(cls)
    except ValueError:  # the constructor of a built-in exception: a message
        return cls("the message")
    args: list[object] = []
    kwargs: dict[str, object] = {}
    for parameter in signature.parameters.values():
        if parameter.default is not inspect.Parameter.empty or parameter.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            continue
        value: object = ("one", "two") if parameter.name.endswith("s") else f"the {parameter.name}"
        if parameter.annotation in ("int", int):
            value = 7
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[parameter.name] = value
        else:
            args.append(value)
    if not args and not kwargs:
        return cls("the message")
    return cls(*args, **kwargs)


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__name__)
def test_a_public_exception_survives_pickle_and_copy(cls: type[BaseException]) -> None:
    import copy
    import pickle

    error = _example(cls)
    error.__dict__["extra"] = "kept"  # an attribute set after construction comes back too
    for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(again) is cls
        assert (again.args, str(again), again.__dict__) == (error.args, str(error), error.__dict__)
    assert pickle.loads(pickle.dumps(cls)) is cls


def test_a_run_error_keeps_its_turn_end_through_pickle() -> None:
    import pickle

    from trio_harness import RunError
    from trio_harness.events import TurnEnd

    end = TurnEnd(seq=3, ts=1.0, turn=1, reason="budget")
    again = pickle.loads(pickle.dumps(RunError("stopped", end=end)))
    assert isinstance(again, RunError) and again.end == end and str(again) == "stopped"
