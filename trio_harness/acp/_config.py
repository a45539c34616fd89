"""Session config options: ``configOptions``, ``session/set_config_option``, ``config_option_update``.

Two options (ACP ``select`` options):

* ``mode`` (category ``mode``): the approval modes of :mod:`._modes`, offered
  when modes are (the server asks permission itself); the same state as
  ``modes`` / ``session/set_mode``, so clients that read only those agree.
* ``model`` (category ``model``): the models the server was started with
  (``AcpServer(models=...)``, ``trio-harness acp --model A --model B``); the
  first is every session's default.  With no list, the one model the
  sessions use is the only value.

A session's agent gets a :class:`ModelChoice`: a provider that forwards each
request to the chosen model, so a change reaches the next request (even one
of a turn already running).  Every change is logged as a ``session/config``
event (:class:`~trio_harness.events.ConfigChanged`), and ``session/load``
applies the last one of each option, so the choice survives a restart
(docs/acp.rst, "Config options").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from ..session import _events as ev
from . import _jsonrpc as rpc
from ._modes import AVAILABLE_MODES, MODE_IDS
from ._updates import shorten

if TYPE_CHECKING:
    from ..model._protocol import Emit, ModelProvider, ModelRequest

MODE_OPTION: Final = "mode"
MODEL_OPTION: Final = "model"


@attrs.define(eq=False)
class ModelChoice:
    """A model provider forwarding every request to the session's chosen model.

    Attributes:
        choices: the models by id, in the order offered.
        current: the id of the chosen one.
    """

    choices: dict[str, ModelProvider]
    current: str

    def __attrs_post_init__(self) -> None:
        if self.current not in self.choices:
            raise ValueError(f"unknown model {self.current!r}; known: {list(self.choices)}")

    @property
    def provider(self) -> ModelProvider:
        """The chosen provider."""
        return self.choices[self.current]

    @property
    def name(self) -> str:
        """The chosen provider's route name (prices and logs follow the choice)."""
        return self.provider.name

    def __getattr__(self, attribute: str) -> Any:
        # ``model``, ``context_window``, ``settings``, ``json_schema_output``,
        # ``base_url``...: the chosen provider's (read with getattr by the driver).
        if attribute.startswith("__") or attribute in ("choices", "current"):
            raise AttributeError(attribute)
        return getattr(self.choices[self.current], attribute)

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        """Run the request on the chosen model."""
        await self.provider.stream(request, emit)


def model_ids(providers: Sequence[ModelProvider]) -> dict[str, ModelProvider]:
    """The providers by id: each one's route name, made unique with ``#2``, ``#3``..."""
    ids: dict[str, ModelProvider] = {}
    for provider in providers:
        base = str(getattr(provider, "name", "") or "model")
        key, n = base, 1
        while key in ids:
            n += 1
            key = f"{base}#{n}"
        ids[key] = provider
    return ids


def _select(option_id: str, name: str, category: str, current: str, values: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": option_id,
        "name": name,
        "category": category,
        "type": "select",
        "currentValue": current,
        "options": values,
    }


def config_options(mode: str | None, model: ModelChoice | None) -> list[dict[str, Any]]:
    """The ``configOptions`` of a session: ``mode`` (when modes are offered) and ``model`` (when known)."""
    options: list[dict[str, Any]] = []
    if mode is not None:
        values = [{"value": m["id"], "name": m["name"], "description": m["description"]} for m in AVAILABLE_MODES]
        options.append(_select(MODE_OPTION, "Mode", "mode", mode, values))
    if model is not None:
        values = [{"value": key, "name": key} for key in model.choices]
        options.append(_select(MODEL_OPTION, "Model", "model", model.current, values))
    return options


def parse_set_config(params: object) -> tuple[str, str, str]:
    """``(sessionId, configId, value)`` of ``session/set_config_option`` params.

    Raises:
        RpcError: invalid params, naming the field.
    """
    if not isinstance(params, dict):
        raise rpc.RpcError(rpc.INVALID_PARAMS, "invalid params for session/set_config_option: expected an object")
    for field in ("sessionId", "configId", "value"):
        value = params.get(field)
        if not isinstance(value, str) or not value:
            raise rpc.RpcError(
                rpc.INVALID_PARAMS,
                f"invalid params for session/set_config_option: {field} must be a non-empty string"
                + ("; every option of this server is a select" if field == "value" else ""),
                {"field": field},
            )
    return params["sessionId"], params["configId"], params["value"]


def check_choice(config_id: str, value: str, modes: bool, model: ModelChoice | None) -> None:
    """Refuse an unknown option or value with a clear error (INVALID_PARAMS)."""
    known: list[str] = ([MODE_OPTION] if modes else []) + ([MODEL_OPTION] if model is not None else [])
    if config_id not in known:
        raise rpc.RpcError(
            rpc.INVALID_PARAMS,
            f"invalid params for session/set_config_option: unknown configId {shorten(config_id, 100)!r}; "
            f"known: {known}",
            {"field": "configId"},
        )
    values = sorted(MODE_IDS) if config_id == MODE_OPTION else list(model.choices if model is not None else ())
    if value not in values:
        raise rpc.RpcError(
            rpc.INVALID_PARAMS,
            f"invalid params for session/set_config_option: unknown value {shorten(value, 100)!r} "
            f"for {config_id!r}; known: {values}",
            {"field": "value"},
        )


def logged_choices(events: Sequence[ev.Event]) -> dict[str, str]:
    """The last logged value of each option (``session/config`` events)."""
    chosen: dict[str, str] = {}
    for event in events:
        if isinstance(event, ev.ConfigChanged):
            chosen[event.option] = event.value
    return chosen


def config_update(options: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``config_option_update`` session update carrying every option."""
    return {"sessionUpdate": "config_option_update", "configOptions": options}
