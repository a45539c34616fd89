"""Session modes of the ACP bridge: how much the agent asks before acting.

Two modes map onto the approval policy (docs/approval.rst):

* ``ask``: ask the client (``session/request_permission``) before every call
  that requires approval (``bash`` commands);
* ``auto``: run such calls without asking.

A session starts in ``ask``, or in ``auto`` when the server was started with
``trio-harness acp --yes``.  ``session/set_mode`` switches one session; the
server answers and sends ``current_mode_update`` (docs/acp.rst, "Modes").
"""

from __future__ import annotations

from typing import Any, Final

MODE_ASK: Final = "ask"
MODE_AUTO: Final = "auto"

AVAILABLE_MODES: Final = (
    {
        "id": MODE_ASK,
        "name": "Ask",
        "description": "Ask before running commands (and any other call that requires approval).",
    },
    {
        "id": MODE_AUTO,
        "name": "Auto",
        "description": "Run commands without asking.",
    },
)
"""The modes every session offers, in the shape of ACP ``SessionMode``."""

MODE_IDS: Final = frozenset(str(mode["id"]) for mode in AVAILABLE_MODES)


def mode_state(current: str) -> dict[str, Any]:
    """The ``modes`` member of a session/new or session/load result."""
    return {"currentModeId": current, "availableModes": [dict(mode) for mode in AVAILABLE_MODES]}
