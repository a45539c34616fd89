"""``python -m trio_harness``: the ``trio-harness`` command line."""

from __future__ import annotations

from ._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
