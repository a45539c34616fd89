"""MCP tools as the model sees them: names, declarations the SDK accepts, schemas and results.

Pure functions, no I/O: :func:`mcp_tool_name` and :func:`_model_names` name a
server's tools ``mcp__<server>__<tool>`` within what the model APIs accept;
:func:`_sound_tools` takes out of a ``tools/list`` answer the declarations the
SDK would refuse (so one malformed tool does not cost the others);
:func:`_dangling_ref` finds an input schema that cannot check arguments;
:func:`render_mcp_result` is the text the model reads for a ``tools/call``
answer.  The connection (:mod:`._mcp`) builds the registered tools from them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from ..agents._tools import ToolOutput

if TYPE_CHECKING:
    from mcp.types import CallToolResult

__all__ = ["mcp_tool_name", "render_mcp_result"]

MAX_TOOL_NAME: Final = 64
"""The longest tool name the model APIs accept (OpenAI: 64 characters of ``[A-Za-z0-9_-]``)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def mcp_tool_name(server: str, tool: str) -> str:
    """The name the model sees for ``tool`` of ``server``: ``mcp__<server>__<tool>``.

    Characters the model APIs refuse (anything but ``A-Z a-z 0-9 _ -``) become
    ``_``; a name longer than 64 characters is cut and ends with 8 hex digits
    of a hash of the original names, so it stays unique.  (Two tools of one
    server whose names differ only in such characters are told apart the same
    way when they are registered.)
    """
    name = f"mcp__{_UNSAFE.sub('_', server)}__{_UNSAFE.sub('_', tool)}"
    if len(name) > MAX_TOOL_NAME:
        name = name[: MAX_TOOL_NAME - 9] + "_" + _digest(server, tool)
    return name


def _digest(server: str, tool: str) -> str:
    return hashlib.sha256(f"{server}\x00{tool}".encode()).hexdigest()[:8]


def _model_names(server: str, tools: Sequence[str]) -> dict[str, str]:
    """Model-facing name -> server tool name, unique even where sanitising made names collide."""
    base = {tool: mcp_tool_name(server, tool) for tool in tools}
    claims: dict[str, list[str]] = {}
    for tool, name in base.items():
        claims.setdefault(name, []).append(tool)
    names: dict[str, str] = {}
    for name, owners in claims.items():
        for tool in owners:
            exact = name == f"mcp__{_UNSAFE.sub('_', server)}__{tool}"
            if len(owners) == 1 or exact:
                names[name] = tool
            else:  # renamed by sanitising and ambiguous: tell it apart by a hash of the real name
                names[name[: MAX_TOOL_NAME - 9] + "_" + _digest(server, tool)] = tool
    return names


def _decoded_size(data: str) -> int | None:
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return None


def _size_text(size: int | None) -> str:
    return f"{size} bytes" if size is not None else "size unknown"


def render_mcp_result(result: CallToolResult) -> ToolOutput:
    """The tool result the model reads for an MCP ``tools/call`` answer.

    Text blocks are kept as they are; images and audio are described (type,
    MIME type, size); a resource link by its name, URI, MIME type and size; an
    embedded resource by its URI and MIME type, followed by its text when it is
    a text resource (its size when it is binary).  ``structuredContent`` is
    given as JSON text when the answer has no text block.  ``isError`` makes
    it an error result.
    """
    from mcp.types import (
        AudioContent,
        BlobResourceContents,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
        TextResourceContents,
    )

    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
            has_text = True
        elif isinstance(block, ImageContent):
            parts.append(f"[image: {block.mime_type}, {_size_text(_decoded_size(block.data))}]")
        elif isinstance(block, AudioContent):
            parts.append(f"[audio: {block.mime_type}, {_size_text(_decoded_size(block.data))}]")
        elif isinstance(block, ResourceLink):
            details = ", ".join(
                [str(block.uri)]
                + ([block.mime_type] if block.mime_type else [])
                + ([_size_text(block.size)] if block.size is not None else [])
            )
            line = f"[resource link: {block.name} ({details})]"
            if block.description:
                line += f" {block.description}"
            parts.append(line)
        elif isinstance(block, EmbeddedResource):
            resource = block.resource
            mime = resource.mime_type or "no MIME type"
            if isinstance(resource, TextResourceContents):
                parts.append(f"[resource: {resource.uri}, {mime}]\n{resource.text}")
            elif isinstance(resource, BlobResourceContents):
                parts.append(f"[resource: {resource.uri}, {mime}, {_size_text(_decoded_size(resource.blob))}]")
    if result.structured_content is not None and not has_text:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return ToolOutput("\n".join(parts) if parts else "(no content)", is_error=bool(result.is_error))


def _tool_problem(item: object, version: str | None) -> str | None:
    """Why the SDK would refuse one tool declaration of a ``tools/list`` answer, or None."""
    from mcp.types import ListToolsResult, methods
    from pydantic import ValidationError

    page = {"tools": [item]}
    try:
        if version is not None:
            try:
                methods.validate_server_result("tools/list", version, page)
            except ValidationError:
                raise
            except (KeyError, ValueError):  # a version or method this SDK has no table for
                pass
        ListToolsResult.model_validate(page, by_name=False)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"][2:])  # past ("tools", 0)
            problems.append(f"{where}: {error['msg']}" if where else error["msg"])
        return "; ".join(dict.fromkeys(problems))
    return None


def _sound_tools(result: dict[str, Any], version: str | None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A ``tools/list`` result without the declarations the SDK would refuse, and those left out."""
    tools = result.get("tools")
    if not isinstance(tools, list):
        return result, []  # not a listing at all: the SDK refuses it and says why
    kept: list[object] = []
    skipped: list[tuple[str, str]] = []
    for index, item in enumerate(tools, 1):
        problem = _tool_problem(item, version)
        if problem is None:
            kept.append(item)
            continue
        name = item.get("name") if isinstance(item, dict) else None
        skipped.append((name if isinstance(name, str) and name else f"#{index}", problem))
    return ({**result, "tools": kept} if skipped else result), skipped


# Keywords whose values are data, not schemas: a "$ref" inside them refers to nothing.
_SCHEMA_DATA = frozenset({"const", "default", "enum", "examples"})


def _dangling_ref(schema: Mapping[str, Any]) -> str | None:
    """The first ``$ref`` of ``schema`` that resolves to nothing within it (as jsonschema sees it), or None.

    Checking arguments against such a schema raises once it reaches the
    reference.  A schema with nested ``$id`` (other base URIs) is not looked
    into: the driver turns a check that raises into that call's error.
    """
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    refs: list[str] = []

    def walk(node: object, root: bool) -> bool:
        if isinstance(node, dict):
            if not root and "$id" in node:
                return False
            ref = node.get("$ref")
            if isinstance(ref, str):
                refs.append(ref)
            return all(walk(value, False) for key, value in node.items() if key not in _SCHEMA_DATA)
        if isinstance(node, list):
            return all(walk(value, False) for value in node)
        return True

    if not walk(schema, True) or not refs:
        return None
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(dict(schema)))
    for ref in dict.fromkeys(refs):
        try:
            resolver.lookup(ref)
        except Unresolvable as exc:
            return f"its $ref {ref!r} resolves to nothing ({type(exc).__name__})"
    return None
