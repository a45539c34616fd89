"""The bash executor: foreground runs and background processes in their own process groups.

The ``bash`` tool that models call lives one layer up, in :mod:`trio_harness.tools`.
"""

from ._executor import BashError as BashError
from ._executor import BashExecutor as BashExecutor
from ._executor import BashProcess as BashProcess
from ._executor import BashProcessNotFoundError as BashProcessNotFoundError
from ._executor import BashRequest as BashRequest
from ._executor import BashResult as BashResult
from ._executor import BashSpec as BashSpec
from ._executor import ExitFacts as ExitFacts
from ._executor import open_bash_executor as open_bash_executor
from ._executor import render_result as render_result
from ._options import BashOptions as BashOptions
