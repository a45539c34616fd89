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

_publish_exceptions(__name__, globals())  # trio_harness.X in tracebacks, not the private module
del _publish_exceptions
