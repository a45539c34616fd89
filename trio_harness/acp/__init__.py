"""The Agent Client Protocol (ACP) bridge: harness agents served over JSON-RPC on stdio.

Run it from the command line with ``trio-harness acp``, or in-process::

    async with open_harness(model=..., store=...) as harness:
        await serve_stdio(harness)          # or AcpServer(harness).serve(receive, send)

Everything runs on Trio streams; no asyncio is involved.
"""

from .._errors import publish_exceptions as _publish_exceptions
from ._jsonrpc import DEFAULT_MAX_LINE_BYTES as DEFAULT_MAX_LINE_BYTES
from ._jsonrpc import RpcError as RpcError
from ._server import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._server import AcpServer as AcpServer
from ._server import serve_stdio as serve_stdio
from ._updates import live_update as live_update
from ._updates import replay_updates as replay_updates
from ._updates import stop_reason_for as stop_reason_for

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "PROTOCOL_VERSION",
    "AcpServer",
    "RpcError",
    "live_update",
    "replay_updates",
    "serve_stdio",
    "stop_reason_for",
]

_publish_exceptions(__name__, globals())  # trio_harness.X in tracebacks, not the private module
del _publish_exceptions
