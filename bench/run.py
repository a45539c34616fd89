"""Run every benchmark module and print one table of figures against their targets.

Each ``bench/bench_*.py`` module exposes ``async def bench() -> list[dict]``
returning rows ``{"figure", "value", "unit", "target"}``.  This runner runs each
module's ``bench()`` under its own ``trio.run`` in a **fresh subprocess** (so
peak-RSS and memory figures of one module are not polluted by another; use
``--in-process`` to run them all in this process instead), then prints one
table: module, figure, value and unit, target, and a mark:

* ``ok`` / ``MISS`` when the target is a numeric comparison such as
  ``>= 200 MB/s``, ``< 1.0 s``, ``<= 190 us`` or ``>= 5,000 agents/s``
  (converted to the row's unit for time, size and rate units);
* ``-`` when the target is not numeric (``report``, ``bounded ...``);
* ``?`` when the target is numeric but its unit cannot be compared.

A module that crashes gets a row with its error and the run continues.  The
exit code is 0 even when targets are missed (this is a report) and 1 when a
module crashed or timed out.

Usage::

    python bench/run.py [--only NAME] [--json PATH] [--in-process] [--timeout SECONDS]

``nox -s bench`` runs this with the ``bench`` dependency group installed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent

Row = dict[str, Any]

# ---------------------------------------------------------------- targets

_TARGET = re.compile(
    r"^\s*(?P<op>>=|<=|==|>|<|≥|≤)\s*(?P<num>[+-]?(?:\d[\d_,]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(?P<unit>.*?)\s*$"
)
_OPS = {"≥": ">=", "≤": "<="}

# Unit families: name -> (family, factor to the family's base unit).
_UNITS: dict[str, tuple[str, float]] = {}
for _names, _family, _factor in (
    (("ns",), "time", 1e-9),
    (("us", "µs", "μs"), "time", 1e-6),
    (("ms",), "time", 1e-3),
    (("s", "sec"), "time", 1.0),
    (("b", "bytes", "byte"), "size", 1.0),
    (("kb",), "size", 1e3),
    (("mb",), "size", 1e6),
    (("gb",), "size", 1e9),
    (("kib",), "size", 1024.0),
    (("mib",), "size", 1024.0**2),
    (("gib",), "size", 1024.0**3),
    (("b/s",), "bandwidth", 1.0),
    (("kb/s",), "bandwidth", 1e3),
    (("mb/s",), "bandwidth", 1e6),
    (("gb/s",), "bandwidth", 1e9),
    (("kib/s",), "bandwidth", 1024.0),
    (("mib/s",), "bandwidth", 1024.0**2),
    (("gib/s",), "bandwidth", 1024.0**3),
    (("x", "×"), "ratio", 1.0),
    (("%",), "percent", 1.0),
):
    for _name in _names:
        _UNITS[_name] = (_family, _factor)


def parse_target(target: object) -> tuple[str, float, str] | None:
    """Parse ``">= 200 MB/s"`` into ``(">=", 200.0, "MB/s")``; None when not numeric."""
    if not isinstance(target, str):
        return None
    match = _TARGET.match(target)
    if match is None:
        return None
    op = _OPS.get(match["op"], match["op"])
    try:
        number = float(match["num"].replace(",", "").replace("_", ""))
    except ValueError:
        return None
    return op, number, match["unit"]


def _convert(value: float, unit: str, to_unit: str) -> float | None:
    """Convert ``value`` from ``unit`` to ``to_unit``; None when they are not comparable."""
    a, b = unit.strip(), to_unit.strip()
    if a == b or not b:
        return value
    if a.lower() == b.lower():
        return value
    known_a, known_b = _UNITS.get(a.lower()), _UNITS.get(b.lower())
    if known_a and known_b and known_a[0] == known_b[0]:
        return value * known_a[1] / known_b[1]
    return None


def judge(row: Row) -> str:
    """``ok``, ``MISS``, ``-`` (no numeric target) or ``?`` (not comparable)."""
    parsed = parse_target(row.get("target"))
    if parsed is None:
        return "-"
    op, limit, target_unit = parsed
    value = row.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return "?"
    converted = _convert(float(value), str(row.get("unit") or ""), target_unit)
    if converted is None:
        return "?"
    passed = {
        ">=": converted >= limit,
        "<=": converted <= limit,
        ">": converted > limit,
        "<": converted < limit,
        "==": converted == limit,
    }[op]
    return "ok" if passed else "MISS"


# ---------------------------------------------------------------- modules


def discover() -> list[str]:
    """The benchmark module names (``bench_*``), sorted."""
    return sorted(path.stem for path in HERE.glob("bench_*.py"))


def _normalize(name: str) -> str:
    name = Path(name).name.removesuffix(".py")
    return name if name.startswith("bench_") else f"bench_{name}"


def _load(name: str) -> ModuleType:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {HERE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _check_rows(name: str, rows: object) -> list[Row]:
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise TypeError(f"{name}.bench() must return a list of dicts, got {type(rows).__name__}")
    for row in rows:
        missing = {"figure", "value", "unit", "target"} - set(row)
        if missing:
            raise TypeError(f"{name}.bench() returned a row without {sorted(missing)}: {row!r}")
    return rows


def run_in_process(name: str) -> Row:
    """Import the module and run its ``bench()`` under a fresh ``trio.run``.

    Returns:
        ``{"rows": [...]}`` or ``{"error": "...", "traceback": "..."}``.
    """
    import trio

    try:
        module = _load(name)
        bench = getattr(module, "bench", None)
        if bench is None:
            raise AttributeError(f"{name} has no bench() function")
        return {"rows": _check_rows(name, trio.run(bench))}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def run_in_subprocess(name: str, timeout: float) -> Row:
    """Run one module in a child interpreter (``run.py --child NAME``); returns like :func:`run_in_process`."""
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--result", str(out)]
        try:
            # The child's stdout goes to our stderr, so the table is the only thing on stdout.
            done = subprocess.run(command, stdout=sys.stderr, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:g} s"}
        if out.exists():
            try:
                result: Row = json.loads(out.read_text())
                return result
            except ValueError as exc:
                return {"error": f"unreadable result from the child: {exc}"}
        return {"error": f"the child exited with code {done.returncode} without a result"}


def _child(name: str, result_path: str) -> int:
    result = run_in_process(name)
    if "traceback" in result:
        print(result["traceback"], file=sys.stderr)
    Path(result_path).write_text(json.dumps(result, default=str))
    return 0


# ---------------------------------------------------------------- table


def format_value(value: object, unit: object) -> str:
    """``1,234.5 us``; strings (``n/a``) pass through."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        text = str(value)
    elif isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1000):
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:,.1f}"
    elif abs(value) >= 0.01 or value == 0:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}".rstrip() if unit else text


def render(results: Sequence[tuple[str, Row]]) -> tuple[str, dict[str, int]]:
    """The table text and counts of marks (``ok``, ``MISS``, ``crashed``)."""
    lines: list[tuple[str, str, str, str, str]] = []
    counts = {"ok": 0, "MISS": 0, "crashed": 0}
    for name, result in results:
        short = name.removeprefix("bench_")
        if "error" in result:
            counts["crashed"] += 1
            lines.append((short, f"CRASHED: {result['error']}", "error", "", "ERROR"))
            continue
        for row in result["rows"]:
            mark = judge(row)
            counts[mark] = counts.get(mark, 0) + 1
            lines.append((short, str(row["figure"]), format_value(row["value"], row["unit"]), str(row["target"]), mark))
    header = ("module", "figure", "value", "target", "mark")
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) if lines else len(header[i]) for i in range(5)]
    widths[1] = min(widths[1], 110)

    def fmt(cells: Sequence[str]) -> str:
        module, figure, value, target, mark = cells
        return (
            f"{module:<{widths[0]}}  {figure:<{widths[1]}}  {value:>{widths[2]}}  {target:<{widths[3]}}  {mark}"
        ).rstrip()

    out = [fmt(header), fmt(["-" * w for w in widths])]
    out += [fmt(line) for line in lines]
    return "\n".join(out), counts


def _machine() -> str:
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    now = datetime.datetime.now().isoformat(timespec="seconds")
    return (
        f"{now}  Python {platform.python_version()}  {platform.machine()}  {os.cpu_count()} cores  load average {load}"
    )


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, print the table; returns the exit code."""
    parser = argparse.ArgumentParser(description="Run the trio_harness benchmarks and print one table.")
    parser.add_argument("--only", metavar="NAME", action="append", help="run only this module (repeatable)")
    parser.add_argument("--json", metavar="PATH", help="also write every row (and errors) to PATH as JSON")
    parser.add_argument("--in-process", action="store_true", help="run every module in this process")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per module (default 1800)")
    parser.add_argument("--list", action="store_true", help="list the modules and exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        return _child(args.child, args.result)
    modules = discover()
    if args.list:
        print("\n".join(modules))
        return 0
    if args.only:
        wanted = [_normalize(name) for name in args.only]
        unknown = [name for name in wanted if name not in modules]
        if unknown:
            parser.error(f"unknown module(s) {unknown}; choose from {modules}")
        modules = wanted

    started_at = _machine()
    results: list[tuple[str, Row]] = []
    for name in modules:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        if args.in_process:
            with contextlib.redirect_stdout(sys.stderr):  # only the table goes to stdout
                result = run_in_process(name)
        else:
            result = run_in_subprocess(name, args.timeout)
        if args.in_process and "traceback" in result:
            print(result["traceback"], file=sys.stderr)
        seconds = time.perf_counter() - start
        result["seconds"] = round(seconds, 1)
        status = f"failed: {result['error']}" if "error" in result else f"{len(result['rows'])} rows"
        print(f"[bench] {name}: {status} in {seconds:.1f} s", file=sys.stderr, flush=True)
        results.append((name, result))

    table, counts = render(results)
    print()
    print(f"trio_harness benchmarks: started {started_at}")
    print(f"                         ended load average {_machine().rsplit('load average ', 1)[-1]}")
    print()
    print(table)
    print()
    print(
        f"{counts.get('ok', 0)} ok, {counts.get('MISS', 0)} missed, {counts['crashed']} crashed "
        f"({len(results)} modules)"
    )

    if args.json:
        payload = {
            "machine": started_at,
            "modules": {
                name: {
                    "seconds": result.get("seconds"),
                    "error": result.get("error"),
                    "rows": [{**row, "mark": judge(row)} for row in result.get("rows", [])],
                }
                for name, result in results
            },
        }
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 1 if counts["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
