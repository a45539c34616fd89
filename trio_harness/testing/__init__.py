"""The testing kit: deterministic fixtures and event-log assertions for your agents.

Opt in from a ``conftest.py``::

    pytest_plugins = ["trio_harness.testing"]

and use the fixtures with pytest-trio (``trio_mode = true``)::

    async def test_greets(harness, scripted_model):
        scripted_model.push({"text": "hello"})
        async with harness.agents.open() as agent:
            agent.followup("hi")
            await agent.when_idle()
        assert_events(
            agent.session,
            ["turn/start", "step/start", "user/message", "assistant/message", "step/end", "turn/end"],
            ignore=NOISE,
        )

Everything runs on Trio's clock, so tests are deterministic under
``autojump_clock`` and never sleep on the real clock.
"""

import importlib.util as _importlib_util

from .._errors import publish_exceptions as _publish_exceptions
from ._assertions import NOISE as NOISE
from ._assertions import EventLogMismatch as EventLogMismatch
from ._assertions import assert_balanced as assert_balanced
from ._assertions import assert_events as assert_events
from ._assertions import event_types as event_types
from ._harness import open_test_harness as open_test_harness

# The fixtures need pytest; the helpers above work without it (in scripts, examples).
if _importlib_util.find_spec("pytest") is not None:
    from ._fixtures import harness as harness
    from ._fixtures import scripted_model as scripted_model

_publish_exceptions(__name__, globals())  # trio_harness.X in tracebacks, not the private module
del _publish_exceptions
