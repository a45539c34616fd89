"""Sphinx configuration of the trio_harness documentation (``nox -s docs``).

Besides the usual settings this file holds seven small hooks that keep the
build warning-free and the reference accurate:

* re-exported constants and type aliases get the attribute docstring written
  beside their definition in the private module (autodoc only looks in the
  module named in the directive, and would otherwise show the docstring of
  ``int`` or ``frozenset``);
* property docstrings are read like method docstrings (napoleon would take
  the text before the first colon for a type);
* Protocol classes lose the meaningless ``(*args, **kwargs)`` signature;
* ``[source]`` links follow re-exports to the defining module: a public
  exception's ``__module__`` is its public package (``trio_harness.RunError``),
  where viewcode would otherwise look for its source;
* a reference to a re-exported name (``trio_harness.Tool``) resolves to the
  full entry where the name is defined (``trio_harness.agents.Tool``), as the
  reference pages document each object once;
* ``.. notice-table::`` renders the bus notices from ``trio_harness._bus.NOTICES``;
* ``.. cli-help:: run`` renders ``trio-harness run --help`` from the real
  argument parser, so the CLI page cannot drift from the code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import io
import os
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx
from sphinx.ext.napoleon.docstring import GoogleDocstring

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

project = "trio_harness"
author = "the trio_harness authors"
copyright = "trio_harness authors"
release = importlib.import_module("trio_harness").__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build"]
templates_path: list[str] = []
html_theme = "furo"
html_title = f"trio_harness {release}"
html_static_path: list[str] = []

default_role = "code"
nitpicky = True
# Targets outside this project: the build is offline (no intersphinx), so the
# standard library's, trio's and the other dependencies' names have no inventory.
nitpick_ignore_regex = [
    (r"py:.*", r"(typing|collections|contextlib|contextvars|datetime|decimal|os|pathlib|random|tempfile)\..*"),
    (r"py:mod", r"fnmatch"),
    (r"py:class", r"AbstractAsyncContextManager|Decimal|CallToolResult"),
    (r"py:.*", r"(trio|httpx|mcp|opentelemetry)\..*"),
    (r"py:class", r"TracerProvider|MeterProvider"),  # OpenTelemetry's (open_harness's providers)
    # Type parameters in signatures (``T``, ``~P``, ``trio_harness.agents._run.T``) are not objects.
    (r"py:class", r"(.*\.)?~?[A-Z]"),
    # Private types that signatures of runtime-built objects name (not part of the public surface).
    (r"py:class", r"_Feed|_Recorded|Notify|CancelCause|SendMode|Durability|ProcessGroup|Sandbox|LoopAgent"),
    (r"py:class", r"(trio_harness\.bash\._sandbox\.)?Sandbox|FileSystem"),
]
pygments_style = "sphinx"

autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_class_signature = "mixed"

napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Render "Attributes:" sections as field lists, not as attribute objects that
# would clash with the members autodoc documents.
napoleon_use_ivar = True
napoleon_use_rtype = False


# ---------------------------------------------------------------- attribute docstrings


def _attribute_doc(modname: str, name: str, depth: int = 0) -> str | None:
    """The docstring written under ``name = ...`` in ``modname``, following re-exports."""
    if depth > 5:
        return None
    module = importlib.import_module(modname)
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return None
    package = module.__package__ or modname
    body = tree.body
    for index, node in enumerate(body):
        targets: list[str] = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = importlib.util.resolve_name("." * node.level + node.module, package)
                    return _attribute_doc(source, alias.name, depth + 1)
        if name in targets and index + 1 < len(body):
            following = body[index + 1]
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                return inspect.cleandoc(following.value.value)
    return None


def _process_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    if what not in ("data", "attribute"):
        return
    modname, _, attr = name.rpartition(".")
    try:
        doc = _attribute_doc(modname, attr)
    except ImportError:
        return
    if doc is not None:
        lines[:] = [*doc.splitlines(), ""]


def _property_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Parse property docstrings like method docstrings (after napoleon ran).

    Napoleon reads the first line of a property docstring as ``type: description``,
    which turns "The agent's id: exactly its session's id." into a type.  Here
    properties are documented in Google style like any method instead.
    """
    if what != "property":
        return
    doc = inspect.getdoc(obj)
    if doc:
        lines[:] = GoogleDocstring(doc.splitlines(), app.config, app, "method", name, obj, options).lines()


def _process_signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    if what == "class" and getattr(obj, "_is_protocol", False):
        return "", None
    return None


# ---------------------------------------------------------------- source links


def _defining_module(modname: str, name: str, depth: int = 0) -> str | None:
    """The module whose source defines ``name``, following ``from X import name`` re-exports from ``modname``."""
    if depth > 5:
        return None
    try:
        module = importlib.import_module(modname)
        tree = ast.parse(inspect.getsource(module))
    except (ImportError, OSError, TypeError):
        return None
    package = module.__package__ or modname
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return modname
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = importlib.util.resolve_name("." * node.level + node.module, package)
                    return _defining_module(source, alias.name, depth + 1)
    return None


def _follow_imported(app: Sphinx, modname: str, attribute: str) -> str | None:
    """viewcode: the module to show the source of ``modname.attribute`` from (None: viewcode's own rule)."""
    return _defining_module(modname, attribute.split(".")[0])


# ---------------------------------------------------------------- re-exported names

_PACKAGES = ("agents", "session", "model", "tasks", "bash", "tools", "testing", "acp", "events")


def _resolve_reexport(app: Sphinx, env: Any, node: Any, contnode: nodes.Element) -> nodes.Element | None:
    """Resolve ``Name[.member]`` or ``trio_harness.Name[.member]`` to the page that documents ``Name``.

    A package page documents each object once, under the package that defines
    it; a reference by another exported path (the top-level re-export, or the
    short name from a docstring shown on another page, or a member named from
    its class's docstring) resolves there.
    """
    # ``ev.Event``: the package's modules name the event module ``ev``.
    target = node.get("reftarget", "").removeprefix("ev.")
    if node.get("refdomain") != "py" or not target:
        return None
    domain = env.get_domain("py")
    owner = node.get("py:class")
    for name in (target, f"{owner}.{target}") if owner else (target,):
        head, _, rest = name.removeprefix("trio_harness.").partition(".")
        for package in ("", *_PACKAGES):
            if getattr(importlib.import_module(f"trio_harness.{package}".rstrip(".")), head, None) is None:
                continue
            canonical = ".".join(filter(None, ("trio_harness", package, head, rest)))
            if canonical in domain.objects:
                resolved: nodes.Element | None = domain.resolve_xref(
                    env, node["refdoc"], app.builder, node["reftype"], canonical, node, contnode
                )
                return resolved
    return None


# ---------------------------------------------------------------- the CLI's own help


class CliHelp(Directive):
    """``.. cli-help:: [SUBCOMMAND ...]``: the argparse help of ``trio-harness``."""

    optional_arguments = 3

    def run(self) -> list[nodes.Node]:
        from trio_harness import _cli

        # The default store depends on the machine that builds the docs.
        real_default_store = _cli.default_store
        _cli.default_store = lambda: Path("<user data dir>/trio-harness/sessions")
        os.environ["COLUMNS"] = "100"
        try:
            parser = _cli.build_parser()
        finally:
            _cli.default_store = real_default_store
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            try:
                parser.parse_args([*self.arguments, "--help"])
            except SystemExit:
                pass
        text = buffer.getvalue().rstrip()
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


class NoticeTable(Directive):
    """``.. notice-table::``: the bus notices, from ``trio_harness._bus.NOTICES``."""

    def run(self) -> list[nodes.Node]:
        from docutils.statemachine import StringList

        from trio_harness._bus import NOTICES

        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 25 75", ""]
        lines += ["   * - notice", "     - subject and data"]
        for name, text in NOTICES.items():
            lines += [f"   * - ``{name}``", f"     - {text}"]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source="notice-table"), self.content_offset, container)
        return list(container.children)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-process-docstring", _process_docstring)
    app.connect("autodoc-process-docstring", _property_docstring, priority=600)  # after napoleon
    app.connect("autodoc-process-signature", _process_signature)
    app.connect("viewcode-follow-imported", _follow_imported)
    app.connect("missing-reference", _resolve_reexport)
    app.add_directive("cli-help", CliHelp)
    app.add_directive("notice-table", NoticeTable)
    return {"parallel_read_safe": True}
