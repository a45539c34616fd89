"""Turning a model spec string (the CLI's ``--model SPEC``) into a provider.

Accepted forms:

* ``deepseek:MODEL`` - DeepSeek's API, key from ``DEEPSEEK_API_KEY`` (required);
* ``openai:MODEL`` - OpenAI's API, key from ``OPENAI_API_KEY`` (required);
* ``openai:MODEL@BASE_URL`` - any OpenAI-compatible server (vLLM, Ollama,
  llama.cpp, a gateway); ``OPENAI_API_KEY`` is sent when set, and optional;
* ``openai-responses:MODEL`` - OpenAI's Responses API
  (:class:`~trio_harness.model.ResponsesProvider`), key from ``OPENAI_API_KEY``
  (required); ``openai-responses:MODEL@BASE_URL`` for any server speaking it
  (the key is then optional);
* ``scripted:PATH`` - a :class:`~trio_harness.model._scripted.ScriptedModel`
  replaying a script file (for tests and demos; ``~`` is expanded);
* ``replay:PATH`` - a :class:`~trio_harness.model._replay.ReplayModel`
  answering from a recorded session log (``session.jsonl``), offline;
* a :class:`~trio_harness.model.ModelProvider` object, returned unchanged.

:func:`open_model` is the one owner of what a spec builds: it yields the
provider for an ``async with`` block and closes it at the block's end when it
built it (a provider object passed in stays the caller's).

A spec may end in query parameters setting the route's default model
settings (:class:`~trio_harness.model.ModelSettings`) and its context window:
``deepseek:deepseek-chat?temperature=0.2&max_tokens=100``.  The keys are
``temperature``, ``top_p``, ``max_tokens``, ``seed``, ``stop`` (repeat it for
several sequences), ``reasoning_effort``, ``parallel_tool_calls``
(``true`` / ``false``) and ``context_window``; an unknown key or a bad value is
a :class:`~trio_harness.ModelError` naming it.  ``replay:`` takes none.  The
query starts at the last ``?`` of the spec.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import trio

from .._errors import ModelError
from .._records import ModelSettings
from .._redact import redact_urls
from ._openai import OpenAIProvider
from ._protocol import ModelProvider
from ._responses import ResponsesProvider

DEEPSEEK_BASE_URL: Final = "https://api.deepseek.com"
"""The base URL of ``deepseek:`` specs."""

OPENAI_BASE_URL: Final = "https://api.openai.com/v1"
"""The base URL of ``openai:MODEL`` specs without ``@BASE_URL``."""

_FORMS: Final = (
    "accepted forms: 'deepseek:MODEL' (key from DEEPSEEK_API_KEY), "
    "'openai:MODEL' (key from OPENAI_API_KEY), "
    "'openai:MODEL@BASE_URL' (OPENAI_API_KEY optional), "
    "'openai-responses:MODEL[@BASE_URL]' (the same keys, OpenAI's Responses API), 'scripted:PATH', 'replay:PATH', "
    "or a ModelProvider object"
)

_BASE_URL_AT: Final = re.compile(r"@(?=https?://)", re.IGNORECASE)


def resolve_model(
    spec: str | ModelProvider, *, env: Mapping[str, str] | None = None, require_key: bool = True
) -> ModelProvider:
    """Return the provider a model spec names.

    Nothing is sent over the network: a missing API key is reported here,
    before any request.

    Args:
        spec: a spec string (see the module docstring) or a provider, which is
            returned unchanged.
        env: where API keys are read from; defaults to ``os.environ``.
        require_key: False builds the provider even when its required API key
            is not set (``api_key`` None: set the attribute before the first
            request).  ``trio-harness acp`` does so to answer the handshake and
            advertise the key as an auth method (docs/acp.rst, "Authentication").

    Returns:
        The provider.  An :class:`~trio_harness.model._openai.OpenAIProvider`
        made here owns an HTTP client: close it with ``aclose()`` when done.

    Raises:
        ModelError: the spec is malformed (unknown prefix, empty model name or
            path, bad base URL) or a required API key is not set.
    """
    if not isinstance(spec, str):
        if isinstance(spec, ModelProvider):
            return spec
        raise ModelError(f"model spec must be a string or a ModelProvider, not {spec!r}; {_FORMS}")
    environ: Mapping[str, str] = os.environ if env is None else env
    text = spec.strip()
    prefix, colon, rest = text.partition(":")
    prefix = prefix.lower()
    if not colon or prefix not in ("deepseek", "openai", "openai-responses", "scripted", "replay"):
        raise ModelError(f"unknown model spec {redact_urls(spec)!r}; {_FORMS}")
    rest = rest.strip()
    settings, context_window = ModelSettings(), None
    if "?" in rest:
        if prefix == "replay":
            raise ModelError(
                f"model spec {redact_urls(spec)!r}: a replay takes no query parameters (it answers as recorded)"
            )
        rest, _, query = rest.rpartition("?")
        settings, context_window = _parse_query(spec, query)
    if prefix == "replay":
        if not rest:
            raise ModelError(f"model spec {redact_urls(spec)!r} names no session log; {_FORMS}")
        from ._replay import ReplayModel

        return ReplayModel.from_file(os.path.expanduser(rest))
    if prefix == "scripted":
        if not rest:
            raise ModelError(f"model spec {redact_urls(spec)!r} names no script file; {_FORMS}")
        from ._scripted import ScriptedModel

        scripted = ScriptedModel.from_file(os.path.expanduser(rest))
        scripted.settings = settings
        if context_window is not None:
            scripted.context_window = context_window
        return scripted
    if prefix == "deepseek":
        model = rest
        _check_model(spec, model)
        return OpenAIProvider(
            model=model,
            base_url=DEEPSEEK_BASE_URL,
            api_key=_key(environ, "DEEPSEEK_API_KEY", spec, required=require_key),
            api_key_env="DEEPSEEK_API_KEY",
            name=f"deepseek:{model}",
            settings=settings,
            context_window=context_window,
            output_format="json_object",  # DeepSeek's JSON mode takes no schema
            supports_images=False,  # DeepSeek's chat API takes text only
        )
    if prefix == "openai-responses":
        return _responses(spec, rest, environ, require_key, settings, context_window)
    # openai
    found = _BASE_URL_AT.search(rest)
    if found is not None:
        model, base_url = rest[: found.start()], rest[found.end() :]
        _check_model(spec, model)
        return OpenAIProvider(
            model=model,
            base_url=base_url,
            api_key=_key(environ, "OPENAI_API_KEY", spec, required=False),
            api_key_env="OPENAI_API_KEY",
            name=f"openai:{model}@{base_url}",
            settings=settings,
            context_window=context_window,
        )
    if "@" in rest:
        model, _, base_url = rest.rpartition("@")
        raise ModelError(
            redact_urls(
                f"model spec {spec!r}: base URL {base_url!r} must start with http:// or https://"
                f" (e.g. 'openai:{model or 'MODEL'}@http://localhost:8000/v1'); {_FORMS}"
            )
        )
    model = rest
    _check_model(spec, model)
    return OpenAIProvider(
        model=model,
        base_url=OPENAI_BASE_URL,
        api_key=_key(environ, "OPENAI_API_KEY", spec, required=require_key),
        api_key_env="OPENAI_API_KEY",
        name=f"openai:{model}",
        settings=settings,
        context_window=context_window,
    )


def missing_api_key(spec: str | ModelProvider, *, env: Mapping[str, str] | None = None) -> str | None:
    """The environment variable a spec requires and ``env`` lacks (``DEEPSEEK_API_KEY``...), or None.

    None as well for a spec that needs no key (``scripted:``, ``replay:``,
    ``openai:MODEL@BASE_URL``, a provider object) and for a malformed spec
    (:func:`resolve_model` reports it).
    """
    if not isinstance(spec, str):
        return None
    environ: Mapping[str, str] = os.environ if env is None else env
    prefix, colon, rest = spec.strip().partition(":")
    prefix = prefix.lower()
    if not colon:
        return None
    if prefix == "deepseek":
        variable = "DEEPSEEK_API_KEY"
    elif prefix in ("openai", "openai-responses") and _BASE_URL_AT.search(rest) is None:
        variable = "OPENAI_API_KEY"
    else:
        return None
    return None if environ.get(variable, "").strip() else variable


@asynccontextmanager
async def open_model(
    spec: str | ModelProvider, *, env: Mapping[str, str] | None = None, require_key: bool = True
) -> AsyncIterator[ModelProvider]:
    """Hold the provider a model spec names for the ``async with`` block.

    A spec string is resolved as :func:`resolve_model` does, and the provider
    built from it is the block's: when the block exits, however it exits (its
    end, an error, a cancellation), the provider's ``aclose()`` is awaited,
    shielded from the cancellation, which closes, e.g., the HTTP connections
    of an :class:`~trio_harness.model.OpenAIProvider`.  A provider object
    passed in belongs to the caller: it is yielded as it is and not closed.

    Example::

        async with open_model("deepseek:deepseek-chat") as model:
            async with open_harness(model=model) as harness:
                ...

    Args:
        spec: a spec string (see :func:`resolve_model`) or a provider.
        env: where API keys are read from; defaults to ``os.environ``.
        require_key: as for :func:`resolve_model`.

    Yields:
        The provider.

    Raises:
        ModelError: on entering, the spec is malformed or a required API key
            is not set (nothing was built, so nothing is closed).
    """
    provider = resolve_model(spec, env=env, require_key=require_key)
    if provider is spec:
        yield provider  # the caller's: not ours to close
        return
    try:
        yield provider
    finally:
        aclose = getattr(provider, "aclose", None)
        if aclose is not None:
            with trio.CancelScope(shield=True):
                await aclose()


def shown_spec(spec: str) -> str:
    """A working spec for display: its base URL's userinfo and query values ``***``, its settings as written.

    The settings (the query after the last ``?``) are the route's own, checked
    by :func:`resolve_model`, so they stay readable; ``openai:m@http://u:p@h/v1?temperature=0``
    is shown as ``openai:m@http://***@h/v1?temperature=0``.
    """
    head, mark, query = spec.rpartition("?")
    if not mark:
        return redact_urls(spec)
    return redact_urls(head) + mark + redact_urls(query)


def _responses(
    spec: str,
    rest: str,
    environ: Mapping[str, str],
    require_key: bool,
    settings: ModelSettings,
    context_window: int | None,
) -> ModelProvider:
    """An ``openai-responses:MODEL[@BASE_URL]`` spec's provider."""
    found = _BASE_URL_AT.search(rest)
    if found is None and "@" in rest:
        model, _, base_url = rest.rpartition("@")
        raise ModelError(
            redact_urls(f"model spec {spec!r}: base URL {base_url!r} must start with http:// or https://; {_FORMS}")
        )
    model = rest if found is None else rest[: found.start()]
    base_url = OPENAI_BASE_URL if found is None else rest[found.end() :]
    _check_model(spec, model)
    return ResponsesProvider(
        model=model,
        base_url=base_url,
        api_key=_key(environ, "OPENAI_API_KEY", spec, required=require_key and found is None),
        api_key_env="OPENAI_API_KEY",
        name=f"openai-responses:{model}" if found is None else f"openai-responses:{model}@{base_url}",
        settings=settings,
        context_window=context_window,
    )


def _check_model(spec: str, model: str) -> None:
    if not model or model.isspace():
        raise ModelError(f"model spec {redact_urls(spec)!r} names no model; {_FORMS}")


def _key(environ: Mapping[str, str], variable: str, spec: str, *, required: bool) -> str | None:
    key = environ.get(variable, "").strip()
    if key:
        return key
    if required:
        raise ModelError(f"model spec {redact_urls(spec)!r} needs an API key: set the {variable} environment variable")
    return None


_QUERY_KEYS: Final = (
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "stop",
    "reasoning_effort",
    "parallel_tool_calls",
    "context_window",
)


def _parse_query(spec: str, query: str) -> tuple[ModelSettings, int | None]:
    """The settings and context window a spec's query parameters give (see the module docstring)."""
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ModelError(
            f"model spec {redact_urls(spec)!r}: cannot read the query {query!r}; write key=value pairs joined by '&'"
        ) from None
    fields: dict[str, Any] = {}
    stops: list[str] = []
    context_window: int | None = None
    for key, raw in pairs:
        if key not in _QUERY_KEYS:
            raise ModelError(
                f"model spec {redact_urls(spec)!r}: unknown parameter {key!r}; "
                f"known parameters: {', '.join(_QUERY_KEYS)}"
            )
        if key == "stop":
            stops.append(raw)
            continue
        if key in fields or (key == "context_window" and context_window is not None):
            raise ModelError(f"model spec {redact_urls(spec)!r}: parameter {key!r} is given twice")
        value: Any
        try:
            if key in ("temperature", "top_p"):
                value = float(raw)
            elif key in ("max_tokens", "seed", "context_window"):
                value = int(raw)
            elif key == "parallel_tool_calls":
                lowered = raw.strip().lower()
                if lowered not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                value = lowered in ("true", "1")
            else:
                value = raw
        except ValueError:
            expected = {
                "temperature": "a number",
                "top_p": "a number",
                "max_tokens": "an integer",
                "seed": "an integer",
                "context_window": "an integer",
                "parallel_tool_calls": "true or false",
            }[key]
            raise ModelError(f"model spec {redact_urls(spec)!r}: {key}={raw!r} is not {expected}") from None
        if key == "context_window":
            if value <= 0:
                raise ModelError(f"model spec {redact_urls(spec)!r}: context_window must be positive, got {value}")
            context_window = value
        else:
            fields[key] = value
    if stops:
        fields["stop"] = tuple(stops)
    try:
        return ModelSettings(**fields), context_window
    except (TypeError, ValueError) as exc:
        raise ModelError(f"model spec {redact_urls(spec)!r}: {exc}") from None
