"""Authentication by an API key in the agent's environment (the ACP ``env_var`` auth method).

``trio-harness acp`` started without the API key its model needs (e.g.
``--model deepseek:deepseek-chat`` and no ``DEEPSEEK_API_KEY``) still answers
``initialize``: it advertises one auth method of the ACP schema's ``env_var``
kind naming the variable, and requires ``authenticate`` before any session
method.  ``authenticate`` succeeds once the variable is set in the agent's
environment (the key is then given to the provider); otherwise it answers a
JSON-RPC ``-32000`` (auth required) error saying which variable to set and
that the agent must be restarted with it: a client cannot change the
environment of a process already running (docs/acp.rst, "Authentication").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ..model._anthropic import AnthropicProvider
from ..model._openai import OpenAIProvider
from . import _jsonrpc as rpc

_LINKS: Final = {
    "DEEPSEEK_API_KEY": "https://platform.deepseek.com/api_keys",
    "OPENAI_API_KEY": "https://platform.openai.com/api-keys",
    "ANTHROPIC_API_KEY": "https://console.anthropic.com/settings/keys",
}


@attrs.define(eq=False)
class EnvKeyAuth:
    """The ``env_var`` auth method of one API key, and the authenticator that checks it.

    Give :meth:`method` to :class:`~trio_harness.acp.AcpServer` as its only
    ``auth_methods`` entry and the object itself as its ``authenticator``.

    Attributes:
        variable: the environment variable holding the key (``DEEPSEEK_API_KEY``).
        provider: the provider built without the key; it gets the key when
            ``authenticate`` succeeds (None: nothing to give it to).
        env: where the key is looked up (default ``os.environ``, read at
            each ``authenticate``).
    """

    variable: str
    provider: OpenAIProvider | AnthropicProvider | None = None
    env: Mapping[str, str] = attrs.field(default=os.environ, repr=False)

    @property
    def method_id(self) -> str:
        """The auth method's id: ``env:`` and the variable name."""
        return f"env:{self.variable}"

    def method(self) -> dict[str, Any]:
        """The auth method, in the shape of the ACP schema's ``EnvVarAuthMethod`` (``type: "env_var"``)."""
        method: dict[str, Any] = {
            "type": "env_var",
            "id": self.method_id,
            "name": f"API key in {self.variable}",
            "description": (
                f"The model needs an API key: set the {self.variable} environment variable "
                "where the agent is started, and restart the agent."
            ),
            "vars": [{"name": self.variable, "label": f"API key ({self.variable})", "secret": True}],
        }
        link = _LINKS.get(self.variable)
        if link is not None:
            method["link"] = link
        return method

    def __call__(self, method_id: str) -> bool:
        """Decide ``authenticate``: the key is in the environment now, or an error naming the variable."""
        key = self.env.get(self.variable, "").strip()
        if not key:
            message = (
                f"the model's API key is missing: {self.variable} is not set in the agent's environment. "
                f"Set {self.variable} where the client starts the agent (its environment settings for "
                "this agent) and restart the agent; a running agent cannot see a variable set later"
            )
            # ``details``: the message as a sentence; some clients (Toad) show only that member of ``data``.
            details = f"{message[:1].upper()}{message[1:]}."
            raise rpc.RpcError(
                rpc.AUTH_REQUIRED, message, {"methodId": method_id, "variable": self.variable, "details": details}
            )
        if self.provider is not None:
            self.provider.api_key = key
        return True
