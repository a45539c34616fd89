"""The bash executor: foreground runs and background processes in their own process groups.

The ``bash`` tool that models call lives one layer up, in :mod:`trio_harness.tools`.
"""

from typing import TYPE_CHECKING

from .._deprecate import renamed as _renamed
from .._errors import BashError as BashError
from .._errors import publish_exceptions as _publish_exceptions
from ._env import DEFAULT_ENV_DENY as DEFAULT_ENV_DENY
from ._env import EnvPolicy as EnvPolicy
from ._executor import BashExecutor as BashExecutor
from ._executor import BashProcess as BashProcess
from ._executor import BashProcessNotFoundError as BashProcessNotFoundError
from ._executor import open_bash_executor as open_bash_executor
from ._options import BashRuntimeOptions as BashRuntimeOptions
from ._records import BashRequest as BashRequest
from ._records import BashResult as BashResult
from ._records import BashSpec as BashSpec
from ._records import ExitFacts as ExitFacts
from ._sandbox import SandboxPolicy as SandboxPolicy
from ._sandbox import SandboxUnavailableError as SandboxUnavailableError

if not TYPE_CHECKING:  # old names, kept for one release (docs/sessions.rst, "Renamed in this release")
    __getattr__ = _renamed(__name__, {"BashOptions": ("trio_harness.bash.BashRuntimeOptions", BashRuntimeOptions)})
del TYPE_CHECKING, _renamed  # end of old names

_publish_exceptions(__name__, globals())  # trio_harness.X in tracebacks, not the private module
del _publish_exceptions
