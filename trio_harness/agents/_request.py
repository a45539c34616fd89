"""The request of the next step: system prompt, messages, tools, model and merged settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .._records import ModelSettings
from ..model._context import tools_chars
from ..model._protocol import ModelRequest
from ._compaction import summary_section
from ._run import output_instructions

if TYPE_CHECKING:
    from ..model._protocol import ModelProvider
    from ._dispatch import ToolDispatch
    from ._history import History
    from ._options import AgentOptions
    from ._run import PendingOutput
    from ._tools import Tool


_NO_SETTINGS = ModelSettings()


@attrs.define(eq=False, repr=False, weakref_slot=False)
class RequestBuilder:
    """Builds one agent's next model request.

    The system prompt is the agent's, then the prompt sections of the shared
    and the agent's tool sets, the summary of the compacted conversation and,
    in a run() turn, how to give the typed answer.  The settings are merged
    field by field: the turn's over the agent's over the harness's over the
    provider's.
    """

    _options: AgentOptions = attrs.field(alias="options")
    _provider: ModelProvider = attrs.field(alias="provider")
    _history: History = attrs.field(alias="history")
    # The tools and their prompt sections.
    _dispatch: ToolDispatch = attrs.field(alias="dispatch")
    # Harness-wide model settings (open_harness(model_settings=...)).
    _harness_settings: ModelSettings | None = attrs.field(alias="harness_settings")
    # The model settings of the running turn (from the message that opened it).
    turn_settings: ModelSettings | None = attrs.field(default=None, init=False)
    # The output type of the running turn (from the run() prompt that opened it).
    turn_output: PendingOutput | None = attrs.field(default=None, init=False)
    # Provider, harness and agent settings merged (they do not change); built on first use.
    _base_settings: ModelSettings | None = attrs.field(default=None, init=False)
    _base_empty: bool | None = attrs.field(default=None, init=False)
    # The running turn's settings merged over the base, and whether that is empty:
    # merged once per turn, not per step.
    _merged_settings: tuple[ModelSettings, ModelSettings, ModelSettings, bool] | None = attrs.field(
        default=None, init=False
    )

    def clear_turn(self) -> None:
        """Between turns the request is the log's alone (what a resumed agent sees)."""
        self.turn_settings = None
        self.turn_output = None

    def tools(self) -> dict[str, Tool]:
        """The tools of the next step (do not mutate: it may be the previous step's dict)."""
        pending = self.turn_output
        return self._dispatch.tools(pending.tool if pending is not None else None)

    def system_prompt(self) -> str:
        dispatch = self._dispatch
        sections = (*dispatch.shared.prompt_sections(), *dispatch.own.prompt_sections())
        summary = self._history.summary
        if summary is not None:
            sections = (*sections, summary_section(summary))
        if self.turn_output is not None:
            sections = (*sections, output_instructions(self.turn_output))
        return "\n\n".join((self._options.system_prompt, *sections)) if sections else self._options.system_prompt

    def model_name(self) -> str:
        return self._options.model_name or getattr(self._provider, "model", "") or ""

    def fixed_chars(self) -> int:
        """The characters of the request besides the conversation: system prompt (summary included) and tools."""
        specs = tuple(tool.spec for tool in self.tools().values())
        return len(self.system_prompt()) + tools_chars(specs)

    def build(self, tools: dict[str, Tool]) -> ModelRequest:
        """The request of the next step, offering ``tools`` (a dict :meth:`tools` returned)."""
        settings = self.settings()
        messages = self._history.messages()
        processor = self._options.history_processor
        if processor is not None:
            messages = processor(messages)
        return ModelRequest(
            model=self.model_name(),
            system=self.system_prompt(),
            messages=messages,
            tools=self._dispatch.specs(tools),
            max_tokens=settings.max_tokens,
            settings=settings,
            output=self.turn_output.request_format if self.turn_output is not None else None,
        )

    def header_settings(self, settings: ModelSettings) -> ModelSettings | None:
        """What ``request/header`` records: the settings, or None when none is set."""
        if settings is self._base_settings and self._base_empty is not None:
            return None if self._base_empty else settings
        merged = self._merged_settings
        if merged is not None and settings is merged[2]:
            return None if merged[3] else settings
        return None if settings.empty else settings

    def settings(self) -> ModelSettings:
        """The merged settings of the next request: turn > agent > harness > the provider's (its spec)."""
        base = self._base_settings
        if base is None:
            provider = getattr(self._provider, "settings", None)
            base = provider if isinstance(provider, ModelSettings) else _NO_SETTINGS
            base = base.merge(self._harness_settings)
            if self._options.max_tokens is not None:
                base = base.merge(ModelSettings(max_tokens=self._options.max_tokens))
            base = self._base_settings = base.merge(self._options.model_settings)
            self._base_empty = base.empty
        turn = self.turn_settings
        if turn is None:
            return base
        merged = self._merged_settings
        if merged is not None and merged[0] is turn and merged[1] is base:
            return merged[2]
        settings = base.merge(turn)
        self._merged_settings = (turn, base, settings, settings.empty)
        return settings
