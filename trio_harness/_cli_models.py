"""``trio-harness models``: the model catalog as a short table (:mod:`trio_harness.model._catalog`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._cli_common import EXIT_OK
from .model._catalog import known_models

_ROUTES = ("anthropic", "openai", "openai-responses", "deepseek")


def add_models_command(commands: Any) -> None:
    """Add the ``models`` subcommand to the CLI's subparsers."""
    models = commands.add_parser(
        "models",
        help="list the known models (context window, max output, images, reasoning)",
        description="List the models of the built-in catalog: the routes that reach each "
        "(spec prefixes), its context window, its longest output, whether it takes images and "
        "whether it reasons.  A model not listed still works, with no known context window.",
    )
    models.add_argument("--route", choices=_ROUTES, help="only the models this spec prefix reaches")
    models.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    models.set_defaults(handler=models_command, store=False)


def models_command(args: argparse.Namespace) -> int:
    """Print the catalog (filtered by ``--route``) as a table or JSON lines; exit 0."""
    rows = known_models(args.route)
    out = sys.stdout
    if args.json:
        for info in rows:
            record = {
                "model": info.model,
                "family": info.family,
                "routes": list(info.routes),
                "context_window": info.context_window,
                "max_output_tokens": info.max_output_tokens,
                "images": info.images,
                "reasoning": info.reasoning,
            }
            out.write(json.dumps(record) + "\n")
        return EXIT_OK
    table = [("MODEL", "ROUTES", "CONTEXT", "MAX OUTPUT", "IMAGES", "REASONING")]
    for info in rows:
        table.append(
            (
                info.model,
                ",".join(info.routes),
                f"{info.context_window:,}",
                f"{info.max_output_tokens:,}",
                "yes" if info.images else "no",
                "yes" if info.reasoning else "no",
            )
        )
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]))]
    for row in table:
        cells = [
            cell.rjust(width) if column in (2, 3) else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths))
        ]
        out.write("  ".join(cells).rstrip() + "\n")
    return EXIT_OK
