"""Tests of the ACP parameter records and their strict decoder, called directly (no server).

The server's answers to bad params over real stdio are in ``test_acp_e2e.py``;
these pin every message, what the ACP schema lets through (``_meta``, fields a
newer client sends) and, with hypothesis, that no shape of ``params`` gets
past the decoder as anything but a record or a ``-32602`` naming a field.
"""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_harness.acp import _jsonrpc as rpc
from trio_harness.acp._params import (
    AbsolutePath,
    AuthenticateParams,
    CancelParams,
    CloseSessionParams,
    InitializeParams,
    ListCursor,
    ListSessionsParams,
    LoadSessionParams,
    NewSessionParams,
    PromptParams,
    ProtocolVersion,
    ResourceBlock,
    ResourceLinkBlock,
    StdioMcpServer,
    TextBlock,
    TextResource,
    decode_params,
)

KINDS: list[type[Any]] = [
    InitializeParams,
    AuthenticateParams,
    NewSessionParams,
    LoadSessionParams,
    ListSessionsParams,
    PromptParams,
    CancelParams,
    CloseSessionParams,
]

# One valid params object per method, as a client sends it.
VALID: dict[type[Any], dict[str, Any]] = {
    InitializeParams: {"protocolVersion": 1},
    AuthenticateParams: {"methodId": "token"},
    NewSessionParams: {"cwd": "/work", "mcpServers": []},
    LoadSessionParams: {"sessionId": "s1", "cwd": "/work", "mcpServers": []},
    ListSessionsParams: {},
    PromptParams: {"sessionId": "s1", "prompt": [{"type": "text", "text": "hi"}]},
    CancelParams: {"sessionId": "s1"},
    CloseSessionParams: {"sessionId": "s1"},
}


def error_of(kind: type[Any], params: object) -> rpc.RpcError:
    with pytest.raises(rpc.RpcError) as info:
        decode_params(kind, params)
    assert info.value.code == rpc.INVALID_PARAMS
    return info.value


# ------------------------------------------------------------------ valid params


def test_valid_params_decode_into_records() -> None:
    assert decode_params(InitializeParams, {"protocolVersion": 1}) == InitializeParams(
        protocol_version=ProtocolVersion(1)
    )
    assert decode_params(AuthenticateParams, {"methodId": "t"}) == AuthenticateParams(method_id="t")
    assert decode_params(
        NewSessionParams, {"cwd": "/w", "mcpServers": [{"name": "fs", "command": "mcp-fs", "args": [], "env": []}]}
    ) == NewSessionParams(cwd=AbsolutePath("/w"), mcp_servers=(StdioMcpServer(name="fs", command="mcp-fs"),))
    assert decode_params(LoadSessionParams, {"sessionId": "s", "cwd": "/w"}) == LoadSessionParams(
        session_id="s", cwd=AbsolutePath("/w")
    )
    assert decode_params(ListSessionsParams, None) == ListSessionsParams()
    assert decode_params(ListSessionsParams, {"cwd": None, "cursor": "50"}) == ListSessionsParams(
        cursor=ListCursor("50")
    )
    assert decode_params(CancelParams, {"sessionId": "s"}) == CancelParams(session_id="s")
    assert decode_params(CloseSessionParams, {"sessionId": "s"}) == CloseSessionParams(session_id="s")


def test_prompt_blocks_and_their_text() -> None:
    params = decode_params(
        PromptParams,
        {
            "sessionId": "s",
            "prompt": [
                {"type": "text", "text": "look at"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "A", "mimeType": "text/plain"}},
                {"type": "resource_link", "uri": "file:///b.txt", "name": "b.txt"},
                {"type": "resource_link", "uri": "file:///c.txt"},
                {"type": "resource_link", "uri": "file:///d.txt", "name": ""},
            ],
        },
    )
    assert params.prompt == (
        TextBlock("look at"),
        ResourceBlock(TextResource("file:///a.txt", "A")),
        ResourceLinkBlock("file:///b.txt", "b.txt"),
        ResourceLinkBlock("file:///c.txt"),
        ResourceLinkBlock("file:///d.txt", ""),
    )
    assert params.text == (
        'look at\n\n<context uri="file:///a.txt">\nA\n</context>\n\n'
        "[b.txt](file:///b.txt)\n\n[file:///c.txt](file:///c.txt)\n\n[file:///d.txt](file:///d.txt)"
    )


def test_meta_and_fields_of_newer_clients_are_accepted() -> None:
    # The schema reserves every name for future versions and closes no request type.
    params = decode_params(
        InitializeParams,
        {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": True}, "terminal": True},
            "clientInfo": {"name": "zed", "version": "1.0"},
            "_meta": {"traceparent": "00-80e1afed08e019fc1110464cfa66635c-7a085853722dc6d2-01"},
        },
    )
    assert params.meta == {"traceparent": "00-80e1afed08e019fc1110464cfa66635c-7a085853722dc6d2-01"}
    assert isinstance(params.meta, types.MappingProxyType)
    new = decode_params(NewSessionParams, {"cwd": "/w", "mcpServers": [], "additionalDirectories": ["/x"]})
    assert new == NewSessionParams(cwd=AbsolutePath("/w"))
    prompt = decode_params(
        PromptParams,
        {
            "sessionId": "s",
            "prompt": [{"type": "text", "text": "t", "annotations": {"priority": 1}, "_meta": {"k": 1}}],
            "_meta": {"zed.dev/debugMode": True},
        },
    )
    assert prompt.prompt == (TextBlock("t", meta={"k": 1}),)


@pytest.mark.parametrize("meta", [5, "x", [], True])
def test_malformed_meta_is_read_as_absent(meta: object) -> None:
    # x-deserialize-default-on-error in the schema: a bad _meta does not fail the request.
    assert decode_params(CancelParams, {"sessionId": "s", "_meta": meta}) == CancelParams(session_id="s")


# ------------------------------------------------------------------ invalid params


@pytest.mark.parametrize(
    ("kind", "params", "field", "message"),
    [
        (InitializeParams, {}, "protocolVersion", "'protocolVersion' is required (an integer from 0 to 65535)"),
        (InitializeParams, {"protocolVersion": "one"}, "protocolVersion",
         "'protocolVersion' must be an integer from 0 to 65535, got 'one'"),
        (InitializeParams, {"protocolVersion": True}, "protocolVersion",
         "'protocolVersion' must be an integer from 0 to 65535, got True"),
        (InitializeParams, {"protocolVersion": -1}, "protocolVersion",
         "'protocolVersion' must be an integer from 0 to 65535, got -1"),
        (InitializeParams, {"protocolVersion": 65536}, "protocolVersion",
         "'protocolVersion' must be an integer from 0 to 65535, got 65536"),
        (InitializeParams, {"protocolVersion": 1.0}, "protocolVersion",
         "'protocolVersion' must be an integer from 0 to 65535, got 1.0"),
        (AuthenticateParams, {}, "methodId", "'methodId' is required (a string)"),
        (AuthenticateParams, {"methodId": 5}, "methodId", "'methodId' must be a string, got 5"),
        (NewSessionParams, {"mcpServers": []}, "cwd", "'cwd' is required (an absolute path)"),
        (NewSessionParams, {"cwd": "relative/dir"}, "cwd", "'cwd' must be an absolute path, got 'relative/dir'"),
        (NewSessionParams, {"cwd": ""}, "cwd", "'cwd' must be an absolute path, got ''"),
        (NewSessionParams, {"cwd": "/a\x00b"}, "cwd", "'cwd' must be an absolute path, got '/a\\x00b'"),
        (NewSessionParams, {"cwd": None}, "cwd", "'cwd' must be an absolute path, got None"),
        (NewSessionParams, {"cwd": "/", "mcpServers": {}}, "mcpServers", "'mcpServers' must be an array, got {}"),
        (LoadSessionParams, {"cwd": "/"}, "sessionId", "'sessionId' is required (a string)"),
        (LoadSessionParams, {"sessionId": 5, "cwd": "/"}, "sessionId", "'sessionId' must be a string, got 5"),
        # The first field that fails is reported, in the order the schema lists them.
        (LoadSessionParams, {"sessionId": 5, "cwd": "x"}, "sessionId", "'sessionId' must be a string, got 5"),
        (LoadSessionParams, {"sessionId": "s", "cwd": "x"}, "cwd", "'cwd' must be an absolute path, got 'x'"),
        (ListSessionsParams, {"cwd": "w"}, "cwd", "'cwd' must be an absolute path, got 'w'"),
        (ListSessionsParams, {"cursor": "bogus"}, "cursor", "'cursor' is not a cursor this server issued, got 'bogus'"),
        (ListSessionsParams, {"cursor": 50}, "cursor", "'cursor' is not a cursor this server issued, got 50"),
        (ListSessionsParams, {"cursor": "1" * 10}, "cursor",
         "'cursor' is not a cursor this server issued, got '1111111111'"),
        (PromptParams, {"prompt": [{"type": "text", "text": "x"}]}, "sessionId", "'sessionId' is required (a string)"),
        (PromptParams, {"sessionId": "s"}, "prompt", "'prompt' is required (a non-empty array of content blocks)"),
        (PromptParams, {"sessionId": "s", "prompt": []}, "prompt",
         "'prompt' must be a non-empty array of content blocks, got []"),
        (PromptParams, {"sessionId": "s", "prompt": "hello"}, "prompt",
         "'prompt' must be a non-empty array of content blocks, got 'hello'"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "image", "data": "", "mimeType": "image/png"}]},
         "prompt[0]", "prompt[0] has empty image data"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "audio", "data": "", "mimeType": "audio/wav"}]},
         "prompt[0]", "prompt[0] has unsupported type 'audio'; supported: text, image, resource (text), resource_link"),
        (PromptParams, {"sessionId": "s", "prompt": [{"text": "no type"}]},
         "prompt[0]", "prompt[0] has unsupported type None; supported: text, image, resource (text), resource_link"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "text"}]}, "prompt[0].text",
         "prompt[0].text is required (a string)"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "text", "text": "ok"}, 5]}, "prompt[1]",
         "prompt[1] must be an object, got 5"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "resource", "resource": {"uri": "u", "blob": "AA=="}}]},
         "prompt[0].resource", "prompt[0].resource is a binary resource; only text resources are supported"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "resource", "resource": {"text": "t"}}]},
         "prompt[0].resource.uri", "prompt[0].resource.uri is required (a string)"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "resource", "resource": "file:///a"}]},
         "prompt[0].resource", "prompt[0].resource must be an object, got 'file:///a'"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "resource_link", "uri": 3}]}, "prompt[0].uri",
         "prompt[0].uri must be a string, got 3"),
        (PromptParams, {"sessionId": "s", "prompt": [{"type": "resource_link", "uri": "u", "name": 3}]},
         "prompt[0].name", "prompt[0].name must be a string, got 3"),
        (CancelParams, {"sessionId": None}, "sessionId", "'sessionId' must be a string, got None"),
        (CloseSessionParams, {}, "sessionId", "'sessionId' is required (a string)"),
    ],
)  # fmt: skip
def test_invalid_params_name_the_field(kind: type[Any], params: object, field: str, message: str) -> None:
    error = error_of(kind, params)
    assert str(error) == f"invalid params for {kind.method}: {message}"
    assert error.data == {"field": field}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("params", [[], [1, 2], "x", 5])
def test_params_that_are_not_an_object(kind: type[Any], params: object) -> None:
    error = error_of(kind, params)
    assert str(error) == f"invalid params for {kind.method}: params must be an object"
    assert error.data is None


def test_long_values_are_shortened_in_messages() -> None:
    error = error_of(NewSessionParams, {"cwd": "x" * 500})
    assert len(str(error)) < 200
    assert str(error).endswith("…")


# ------------------------------------------------------------------ properties

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)

KEYS = ["protocolVersion", "methodId", "cwd", "mcpServers", "sessionId", "cursor", "prompt", "_meta"]

shaped_params = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), json_values, max_size=6),
    st.fixed_dictionaries(
        {},
        optional={
            "sessionId": st.text(max_size=8) | json_values,
            "cwd": st.sampled_from(["/", "/w", "rel", ""]) | json_values,
            "protocolVersion": st.integers(-2, 70000) | json_values,
            "prompt": st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["text", "resource", "resource_link", "image"]) | json_values},
                    optional={
                        "text": st.text(max_size=5) | json_values,
                        "uri": st.text(max_size=5) | json_values,
                        "name": st.text(max_size=5) | json_values,
                        "resource": st.fixed_dictionaries(
                            {}, optional={"uri": json_values, "text": json_values, "blob": json_values}
                        )
                        | json_values,
                    },
                )
                | json_values,
                max_size=3,
            )
            | json_values,
            "cursor": st.text(max_size=4) | json_values,
        },
    ),
)


def outcome(kind: type[Any], params: object) -> object:
    """The record, or the RpcError (any other exception propagates)."""
    try:
        return decode_params(kind, params)
    except rpc.RpcError as error:
        return error


@given(kind=st.sampled_from(KINDS), params=shaped_params)
def test_any_params_decode_or_name_the_bad_field(kind: type[Any], params: object) -> None:
    # A round trip through JSON: the decoder only ever sees what json.loads makes.
    params = json.loads(json.dumps(params))
    result = outcome(kind, params)
    if not isinstance(result, rpc.RpcError):
        assert isinstance(result, kind)
        return
    assert result.code == rpc.INVALID_PARAMS
    assert str(result).startswith(f"invalid params for {kind.method}: ")
    if result.data is None:
        assert str(result).endswith("params must be an object")
        assert not isinstance(params, dict | None)
        return
    field = result.data["field"]
    assert field in str(result)
    # The field is a key that is there with a bad value, or one that is missing.
    top = field.split("[")[0].split(".")[0]
    present = isinstance(params, dict) and top in params
    assert present or " is required (" in str(result)
    if " is required (" in str(result) and "[" not in field:
        assert not present


valid_prompt_blocks = st.one_of(
    st.builds(lambda text: {"type": "text", "text": text}, st.text(max_size=8)),
    st.builds(
        lambda uri, text: {"type": "resource", "resource": {"uri": uri, "text": text}},
        st.text(max_size=8),
        st.text(max_size=8),
    ),
    st.builds(lambda uri: {"type": "resource_link", "uri": uri}, st.text(max_size=8)),
)


@given(
    session_id=st.text(max_size=12),
    blocks=st.lists(valid_prompt_blocks, min_size=1, max_size=4),
    extra=st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in KEYS), json_values, max_size=3),
)
def test_unknown_keys_never_change_the_record(session_id: str, blocks: list[Any], extra: dict[str, Any]) -> None:
    plain = {"sessionId": session_id, "prompt": blocks}
    assert decode_params(PromptParams, {**extra, **plain}) == decode_params(PromptParams, plain)


@given(
    kind=st.sampled_from([k for k in KINDS if k is not ListSessionsParams]),
    data=st.data(),
)
def test_a_wrong_type_in_a_required_field_is_named(kind: type[Any], data: st.DataObject) -> None:
    params = dict(VALID[kind])
    field = data.draw(st.sampled_from(sorted(k for k in params if k != "mcpServers")))
    # A JSON value of another type than the valid one (and not a number for a number).
    wrong = data.draw(json_values.filter(lambda v: type(v) is not type(params[field]) and v is not None))
    params[field] = wrong
    error = error_of(kind, params)
    assert error.data is not None
    assert error.data["field"] == field
    assert str(error).startswith(f"invalid params for {kind.method}: '{field}' ")
