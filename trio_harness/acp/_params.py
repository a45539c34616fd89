"""Typed parameters of the ACP methods the server answers, and their strict decoder.

Each method's ``params`` object is decoded into a frozen record by a private
cattrs converter before the server acts on it; anything that does not fit is a
JSON-RPC ``-32602`` (invalid params) error whose message and ``data.field``
name the offending field (``'cwd'``, ``prompt[1]``, ``prompt[0].text``).

How strict, following the ACP schema (``schema/v1/schema.json`` of
agentclientprotocol/agent-client-protocol):

* Values are strict JSON types: a string is a string (``5`` is not ``"5"``),
  an integer is not a boolean or a float, an array is a JSON array.
* Keys the server does not read are ignored.  The schema declares no request
  type closed (no ``additionalProperties: false``) and reserves every name for
  future protocol versions, so a newer client's fields (``additionalDirectories``,
  ``clientCapabilities``, ...) must not fail a request.
* ``_meta`` is accepted everywhere and kept as :attr:`meta`; like the schema
  says (``x-deserialize-default-on-error``), a ``_meta`` that is not an object
  is read as absent rather than refused.
* Beyond the schema, only what this server needs: ``cwd`` must be an absolute
  path (the schema's description says so), a ``cursor`` must be one this
  server issued, and a prompt must be non-empty and made of the blocks this
  server reads (text, images, text resources, resource links; an image's
  ``mimeType`` one of PNG, JPEG, GIF, WebP, its ``data`` valid base64 of at
  most 5 MiB).  ``mcpServers`` is
  optional here although the schema requires it, and so are the ``args``,
  ``env`` and ``headers`` arrays of its entries; an entry is a stdio server
  (no ``type``, or ``"stdio"``) or an ``"http"`` one (the server advertises
  ``mcpCapabilities.http``, not ``sse``).  :meth:`NewSessionParams.mcp_configs`
  turns the entries into the harness's server records (checked there: names,
  URLs, duplicates).
"""

from __future__ import annotations

import base64
import os
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NewType, Protocol, TypeAlias, TypeVar

import attrs
import cattrs
from cattrs.cols import homogenous_tuple_structure_factory
from cattrs.gen import make_dict_structure_fn, override
from cattrs.preconf.json import make_converter

from .._errors import McpConfigError
from .._records import IMAGE_MEDIA_TYPES, Image
from ..model._images import sniff_media_type, supports_images
from ..session._events import MAX_IMAGE_BYTES
from ..tools._mcp_config import McpHttpServer, McpServerConfig, McpStdioServer
from . import _jsonrpc as rpc

AbsolutePath = NewType("AbsolutePath", str)
"""A non-empty absolute path without NUL."""

ProtocolVersion = NewType("ProtocolVersion", int)
"""An ACP protocol version: an integer from 0 to 65535 (``uint16`` in the schema)."""

ListCursor = NewType("ListCursor", str)
"""A ``session/list`` cursor this server issued: a decimal offset, fewer than 10 digits."""

Meta: TypeAlias = Mapping[str, Any] | None


# ---------------------------------------------------------------- content blocks


@attrs.frozen
class TextBlock:
    """A ``text`` content block."""

    kind: ClassVar[str] = "text"
    text: str
    meta: Meta = None


@attrs.frozen
class TextResource:
    """The embedded text of a ``resource`` block (a blob resource is refused)."""

    uri: str
    text: str
    meta: Meta = None


@attrs.frozen
class ResourceBlock:
    """A ``resource`` content block: embedded context."""

    kind: ClassVar[str] = "resource"
    resource: TextResource
    meta: Meta = None


@attrs.frozen
class ResourceLinkBlock:
    """A ``resource_link`` content block (``name`` is optional here; the ``uri`` stands in)."""

    kind: ClassVar[str] = "resource_link"
    uri: str
    name: str | None = None
    meta: Meta = None


@attrs.frozen
class ImageBlock:
    """An ``image`` content block: base64 ``data`` and its ``mimeType`` (PNG, JPEG, GIF or WebP, at most 5 MiB)."""

    kind: ClassVar[str] = "image"
    data: str
    mime_type: str
    uri: str | None = None
    meta: Meta = None

    def image(self) -> Image:
        """The image it carries (checked when the block was decoded)."""
        return Image(base64.b64decode(self.data), self.mime_type)


ContentBlock: TypeAlias = TextBlock | ImageBlock | ResourceBlock | ResourceLinkBlock
_BLOCKS: dict[str, type[ContentBlock]] = {
    cls.kind: cls for cls in (TextBlock, ImageBlock, ResourceBlock, ResourceLinkBlock)
}
Prompt: TypeAlias = tuple[ContentBlock, ...]


def prompt_capabilities(model: object) -> dict[str, bool]:
    """``promptCapabilities`` of ``initialize``: images when the harness's model takes them (``supports_images``)."""
    return {"image": supports_images(model), "audio": False, "embeddedContext": True}


def prompt_images(blocks: Prompt) -> tuple[Image, ...]:
    """The images of a prompt, in order (they follow its text in the message)."""
    return tuple(block.image() for block in blocks if isinstance(block, ImageBlock))


def prompt_text(blocks: Prompt) -> str:
    """The text of a prompt for the agent: resources wrapped in ``<context>``, links as Markdown links."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ImageBlock):
            continue  # the message's images (prompt_images)
        elif isinstance(block, ResourceBlock):
            parts.append(f'<context uri="{block.resource.uri}">\n{block.resource.text}\n</context>')
        else:
            parts.append(f"[{block.name or block.uri}]({block.uri})")
    return "\n\n".join(parts)


# ---------------------------------------------------------------- MCP servers


@attrs.frozen
class EnvVariable:
    """An environment variable of a stdio MCP server: ``{name, value}``."""

    name: str
    value: str
    meta: Meta = None


@attrs.frozen
class HttpHeader:
    """An HTTP header of an HTTP MCP server: ``{name, value}``."""

    name: str
    value: str
    meta: Meta = None


@attrs.frozen
class StdioMcpServer:
    """An MCP server the client asks the session to run: a command spoken to over stdio."""

    kind: ClassVar[str] = "stdio"
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[EnvVariable, ...] = ()
    meta: Meta = None


@attrs.frozen
class HttpMcpServer:
    """An MCP server the client asks the session to use over streamable HTTP (``"type": "http"``)."""

    kind: ClassVar[str] = "http"
    name: str
    url: str
    headers: tuple[HttpHeader, ...] = ()
    meta: Meta = None


McpServerParams: TypeAlias = StdioMcpServer | HttpMcpServer
McpServers: TypeAlias = tuple[McpServerParams, ...]
_MCP_KINDS: dict[str, type[McpServerParams]] = {"stdio": StdioMcpServer, "http": HttpMcpServer}


def mcp_configs(servers: McpServers, cwd: str, method: str) -> tuple[McpServerConfig, ...]:
    """The harness's records for a session's ``mcpServers`` (stdio servers run in ``cwd``).

    Raises:
        RpcError: ``-32602`` naming the entry and field that is invalid, or a
            name used twice.
    """
    configs: list[McpServerConfig] = []
    names: set[str] = set()
    for index, server in enumerate(servers):
        where = f"mcpServers[{index}]"
        try:
            if server.name in names:
                raise McpConfigError(f"the name {server.name!r} is used by two servers", field="name")
            names.add(server.name)
            if isinstance(server, StdioMcpServer):
                configs.append(
                    McpStdioServer(
                        name=server.name,
                        command=server.command,
                        args=server.args,
                        env={variable.name: variable.value for variable in server.env},
                        cwd=cwd,
                    )
                )
            else:
                headers = {header.name: header.value for header in server.headers}
                configs.append(McpHttpServer(name=server.name, url=server.url, headers=headers))
        except McpConfigError as exc:
            field = where + (f".{exc.field}" if exc.field else "")
            raise rpc.RpcError(
                rpc.INVALID_PARAMS, f"invalid params for {method}: {where}: {exc}", {"field": field}
            ) from None
    return tuple(configs)


# ---------------------------------------------------------------- method params


@attrs.frozen
class InitializeParams:
    """``initialize``: the client's protocol version (its capabilities are not read)."""

    method: ClassVar[str] = "initialize"
    protocol_version: ProtocolVersion
    meta: Meta = None


@attrs.frozen
class AuthenticateParams:
    """``authenticate``: one of the advertised auth method ids."""

    method: ClassVar[str] = "authenticate"
    method_id: str
    meta: Meta = None


@attrs.frozen
class NewSessionParams:
    """``session/new``: the session's working directory."""

    method: ClassVar[str] = "session/new"
    cwd: AbsolutePath
    mcp_servers: McpServers = ()
    meta: Meta = None

    def mcp_configs(self) -> tuple[McpServerConfig, ...]:
        """The session's MCP servers as harness records (see :func:`mcp_configs`)."""
        return mcp_configs(self.mcp_servers, self.cwd, self.method)


@attrs.frozen
class LoadSessionParams:
    """``session/load``: a stored session to resume."""

    method: ClassVar[str] = "session/load"
    session_id: str
    cwd: AbsolutePath
    mcp_servers: McpServers = ()
    meta: Meta = None

    def mcp_configs(self) -> tuple[McpServerConfig, ...]:
        """The session's MCP servers as harness records (see :func:`mcp_configs`)."""
        return mcp_configs(self.mcp_servers, self.cwd, self.method)


@attrs.frozen
class ListSessionsParams:
    """``session/list``: an optional working-directory filter and page cursor."""

    method: ClassVar[str] = "session/list"
    cwd: AbsolutePath | None = None
    cursor: ListCursor | None = None
    meta: Meta = None


@attrs.frozen
class PromptParams:
    """``session/prompt``: the session and the prompt's content blocks (at least one)."""

    method: ClassVar[str] = "session/prompt"
    session_id: str
    prompt: Prompt
    meta: Meta = None

    @property
    def text(self) -> str:
        """The prompt as the text the agent receives (see :func:`prompt_text`)."""
        return prompt_text(self.prompt)

    @property
    def images(self) -> tuple[Image, ...]:
        """The prompt's images (see :func:`prompt_images`)."""
        return prompt_images(self.prompt)

    @property
    def content(self) -> str | list[str | Image]:
        """What the agent is sent: the text, followed by the images when there are some."""
        images = self.images
        return [self.text, *images] if images else self.text


@attrs.frozen
class CancelParams:
    """``session/cancel``: the session whose turn to cancel."""

    method: ClassVar[str] = "session/cancel"
    session_id: str
    meta: Meta = None


@attrs.frozen
class SetSessionModeParams:
    """``session/set_mode``: the session and the id of the mode to switch to."""

    method: ClassVar[str] = "session/set_mode"
    session_id: str
    mode_id: str
    meta: Meta = None


@attrs.frozen
class CloseSessionParams:
    """``session/close``: the session to dispose."""

    method: ClassVar[str] = "session/close"
    session_id: str
    meta: Meta = None


_RECORDS: tuple[type, ...] = (
    EnvVariable,
    HttpHeader,
    StdioMcpServer,
    HttpMcpServer,
    TextBlock,
    TextResource,
    ResourceBlock,
    ResourceLinkBlock,
    ImageBlock,
    InitializeParams,
    AuthenticateParams,
    SetSessionModeParams,
    NewSessionParams,
    LoadSessionParams,
    ListSessionsParams,
    PromptParams,
    CancelParams,
    CloseSessionParams,
)

# ---------------------------------------------------------------- the converter


class _Invalid(Exception):
    """A value that does not fit; the message completes ``"<field> ..."``."""


def _shown(value: object, limit: int = 100) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _wire(name: str) -> str:
    """The JSON key of an attribute: ``session_id`` -> ``sessionId``; ``meta`` -> ``_meta``."""
    if name == "meta":
        return "_meta"
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


_converter = make_converter(detailed_validation=True, forbid_extra_keys=False)


def _string(value: object, _: object) -> str:
    if type(value) is not str:
        raise _Invalid(f"must be a string, got {_shown(value)}")
    return value


def _absolute_path(value: object, _: object) -> AbsolutePath:
    if type(value) is not str or not value or "\x00" in value or not os.path.isabs(value):
        raise _Invalid(f"must be an absolute path, got {_shown(value)}")
    return AbsolutePath(value)


def _protocol_version(value: object, _: object) -> ProtocolVersion:
    if type(value) is not int or not 0 <= value <= 0xFFFF:
        raise _Invalid(f"must be an integer from 0 to 65535, got {_shown(value)}")
    return ProtocolVersion(value)


def _list_cursor(value: object, _: object) -> ListCursor:
    if type(value) is not str or not (value.isascii() and value.isdigit() and len(value) < 10):
        raise _Invalid(f"is not a cursor this server issued, got {_shown(value)}")
    return ListCursor(value)


def _meta(value: object, _: object) -> Mapping[str, Any] | None:
    # The schema reads a malformed _meta as absent (x-deserialize-default-on-error).
    return types.MappingProxyType(value) if type(value) is dict else None


def _array_hook(kind: Any) -> Callable[[object, object], Any]:
    """A strict JSON array of ``kind``'s elements (built once the element hook exists)."""
    elements = homogenous_tuple_structure_factory(kind, _converter)

    def structure(value: object, _: object) -> Any:
        # Checked here: cattrs would turn any iterable into a tuple ("ab" -> ("a", "b")).
        if type(value) is not list:
            raise _Invalid(f"must be an array, got {_shown(value)}")
        return elements(value, kind)

    return structure


def _mcp_server(value: object, _: object) -> McpServerParams:
    if type(value) is not dict:
        raise _Invalid(f"must be an object, got {_shown(value)}")
    kind = value.get("type", "stdio")
    if kind == "sse":
        raise _Invalid("has type 'sse', which this agent does not support (mcpCapabilities.sse is false); use http")
    cls = _MCP_KINDS.get(kind) if type(kind) is str else None
    if cls is None:
        raise _Invalid(f"has unsupported type {_shown(kind, 60)}; supported: stdio (no type), http")
    server: McpServerParams = _converter.structure(value, cls)
    return server


def _prompt_hook() -> Callable[[object, object], Prompt]:
    # Built once the ContentBlock hook exists: the elements' hook is looked up now.
    elements = homogenous_tuple_structure_factory(Prompt, _converter)

    def structure(value: object, _: object) -> Prompt:
        # Checked here: cattrs would turn any iterable into a tuple ("ab" -> ("a", "b")).
        if type(value) is not list or not value:
            raise _Invalid(f"must be a non-empty array of content blocks, got {_shown(value)}")
        blocks: Prompt = elements(value, Prompt)
        return blocks

    return structure


def _content_block(value: object, _: object) -> ContentBlock:
    if type(value) is not dict:
        raise _Invalid(f"must be an object, got {_shown(value)}")
    kind = value.get("type")
    cls = _BLOCKS.get(kind) if type(kind) is str else None
    if cls is None:
        raise _Invalid(
            f"has unsupported type {_shown(kind, 60)}; supported: text, image, resource (text), resource_link"
        )
    block: ContentBlock = _converter.structure(value, cls)
    if isinstance(block, ImageBlock):
        _check_image(block)
    return block


def _check_image(block: ImageBlock) -> None:
    if block.mime_type not in IMAGE_MEDIA_TYPES:
        raise _Invalid(
            f"has mimeType {_shown(block.mime_type, 60)}; supported images: {', '.join(sorted(IMAGE_MEDIA_TYPES))}"
        )
    if len(block.data) > (MAX_IMAGE_BYTES + 2) // 3 * 4:
        raise _Invalid(f"is an image larger than the {MAX_IMAGE_BYTES} bytes a message image may have")
    try:
        data = base64.b64decode(block.data, validate=True)
    except ValueError:
        raise _Invalid("has data that is not valid base64") from None
    if not data:
        raise _Invalid("has empty image data")
    # A lying mimeType (a JPEG sent as image/png, or no image at all) would be logged and sent in every
    # later request of the session, which providers refuse (Anthropic: 400): the session would be stuck.
    found = sniff_media_type(data)
    if found != block.mime_type:
        what = f"is an {found} image" if found is not None else "is not a PNG, JPEG, GIF or WebP image"
        raise _Invalid(f"has mimeType {_shown(block.mime_type, 60)} but its data {what}")


def _record_hook(cls: type) -> Callable[[object, object], Any]:
    renames: dict[str, Any] = {field.name: override(rename=_wire(field.name)) for field in attrs.fields(cls)}
    inner: Callable[[Mapping[str, Any], Any], Any] = make_dict_structure_fn(cls, _converter, **renames)
    binary = cls is TextResource

    def structure(value: object, _: object) -> Any:
        if type(value) is not dict:
            raise _Invalid(f"must be an object, got {_shown(value)}")
        if binary and "text" not in value and "blob" in value:
            raise _Invalid("is a binary resource; only text resources are supported")
        return inner(value, cls)

    return structure


# Registration order matters: a hook built now looks up its fields' hooks now.
_converter.register_structure_hook(str, _string)
_converter.register_structure_hook(AbsolutePath, _absolute_path)
_converter.register_structure_hook(ProtocolVersion, _protocol_version)
_converter.register_structure_hook(ListCursor, _list_cursor)
_converter.register_structure_hook_func(lambda kind: kind == Meta, _meta)
_converter.register_structure_hook_func(lambda kind: kind == tuple[str, ...], _array_hook(tuple[str, ...]))
_converter.register_structure_hook_func(lambda kind: kind == McpServerParams, _mcp_server)
_converter.register_structure_hook_func(lambda kind: kind == ContentBlock, _content_block)
_converter.register_structure_hook_func(lambda kind: kind == Prompt, _prompt_hook())

# The MCP server entries, innermost first: each array after its elements' hook,
# the server records after their arrays, the list of servers before the params.
_converter.register_structure_hook(EnvVariable, _record_hook(EnvVariable))
_converter.register_structure_hook(HttpHeader, _record_hook(HttpHeader))
_converter.register_structure_hook_func(
    lambda kind: kind == tuple[EnvVariable, ...], _array_hook(tuple[EnvVariable, ...])
)
_converter.register_structure_hook_func(
    lambda kind: kind == tuple[HttpHeader, ...], _array_hook(tuple[HttpHeader, ...])
)
_converter.register_structure_hook(StdioMcpServer, _record_hook(StdioMcpServer))
_converter.register_structure_hook(HttpMcpServer, _record_hook(HttpMcpServer))
_converter.register_structure_hook_func(lambda kind: kind == McpServers, _array_hook(McpServers))
for _cls in _RECORDS[4:]:
    _converter.register_structure_hook(_cls, _record_hook(_cls))

# ---------------------------------------------------------------- decoding

_NEEDS: dict[object, str] = {
    str: "a string",
    AbsolutePath: "an absolute path",
    ProtocolVersion: "an integer from 0 to 65535",
    Prompt: "a non-empty array of content blocks",
    TextResource: "an object",
}


class _Params(Protocol):
    method: ClassVar[str]


P = TypeVar("P", bound=_Params)


def _first_problem(exc: BaseException) -> tuple[str, BaseException, object]:
    """The path of the first field that failed (in field order), its error, and its declared type."""
    path = ""
    declared: object = None
    while isinstance(exc, cattrs.ClassValidationError | cattrs.IterableValidationError):
        with_notes, _without = exc.group_exceptions()
        if not with_notes:
            break
        exc, note = with_notes[0]
        if isinstance(note, cattrs.AttributeValidationNote):
            path += ("." if path else "") + _wire(note.name)
        else:
            path += f"[{note.index}]"
        declared = note.type
    return path, exc, declared


def decode_params(kind: type[P], params: object) -> P:
    """Decode a request's ``params`` (``None`` for none) into the method's record.

    Args:
        kind: the method's record type, e.g. :class:`NewSessionParams`.
        params: the ``params`` member as parsed from JSON.

    Raises:
        RpcError: ``-32602`` naming the first field that does not fit (in
            ``data.field``), or saying the params are not an object.
    """
    method = kind.method
    if params is None:
        params = {}
    if type(params) is not dict:
        raise rpc.RpcError(rpc.INVALID_PARAMS, f"invalid params for {method}: params must be an object")
    try:
        record: P = _converter.structure(params, kind)
    except cattrs.BaseValidationError as exc:
        path, problem, declared = _first_problem(exc)
        if isinstance(problem, _Invalid):
            what = str(problem)
        elif isinstance(problem, KeyError):
            needs = _NEEDS.get(declared)
            what = f"is required ({needs})" if needs else "is required"
        else:
            what = f"is invalid ({type(problem).__name__}: {problem})"
        shown = path if "[" in path or "." in path else f"'{path}'"
        raise rpc.RpcError(
            rpc.INVALID_PARAMS, f"invalid params for {method}: {shown} {what}", {"field": path}
        ) from None
    return record
