"""Benchmarks of the bash executor (``harness.bash``).

Figures:

* background throughput: 1 GiB from ``head -c 1073741824 /dev/zero`` consumed
  through :meth:`BashProcess.read_output` in a polling loop (target >= 200 MB/s);
* peak RSS growth of this process during that run (``ru_maxrss``, KiB): memory
  must stay bounded by the tail size, not grow with the stream;
* start -> kill -> exit latency of ``sleep 300``: :meth:`BashExecutor.start`,
  then :meth:`BashProcess.kill`, then :meth:`BashProcess.wait` returning;
* start -> exit latency of ``true`` (a foreground :meth:`BashExecutor.run`)
  without and with the bubblewrap sandbox (its default policy: no
  capabilities, the seccomp filter, the process bound, the default hidden
  paths), rounds interleaved in the same run, and their ratio
  (docs/sandbox.rst).  Without a working ``bwrap`` the sandbox rows say why
  instead of a figure.

Run with ``python bench/bench_bash.py``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile

import trio

from trio_harness.bash import BashRequest, BashRuntimeOptions, SandboxUnavailableError, open_bash_executor

_GIB = 1 << 30
_POLL = 0.01
_LATENCY_ROUNDS = 20
_SANDBOX_ROUNDS = 40


async def _throughput(spill_dir: str) -> tuple[float, float]:
    """Return (MB/s, peak RSS growth in KiB) for 1 GiB through read_output."""
    async with open_bash_executor(BashRuntimeOptions(spill_dir=spill_dir)) as executor:
        spec = executor.resolve(BashRequest(f"head -c {_GIB} /dev/zero"))
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = trio.current_time()
        process = await executor.start(spec)
        chars = 0
        while process.running:
            chars += len(process.read_output())
            await trio.sleep(_POLL)
        facts = await process.wait()
        chars += len(process.read_output())
        elapsed = trio.current_time() - started
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if facts.exit_code != 0 or process.stdout_bytes != _GIB:
            raise RuntimeError(f"bad run: {facts}, {process.stdout_bytes} bytes")
        if os.stat(process.stdout_path).st_size != _GIB:
            raise RuntimeError("spill file does not hold the full stream")
        if chars == 0:
            raise RuntimeError("read_output returned nothing")
        await process.aclose()
    return _GIB / elapsed / 1e6, float(rss_after - rss_before)


async def _kill_latency() -> list[float]:
    """Return start -> kill -> exit latencies (ms) of ``sleep 300``."""
    latencies: list[float] = []
    async with open_bash_executor() as executor:
        spec = executor.resolve(BashRequest("sleep 300"))
        for _ in range(_LATENCY_ROUNDS):
            started = trio.current_time()
            process = await executor.start(spec)
            process.kill("bench")
            await process.wait()
            latencies.append((trio.current_time() - started) * 1e3)
            await process.aclose()
    return latencies


async def _sandbox_latency() -> tuple[list[float], list[float] | str]:
    """Return start -> exit latencies (ms) of ``true`` without and with the sandbox (or why not)."""
    plain: list[float] = []
    boxed: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as workdir:
        try:
            async with open_bash_executor() as bare, open_bash_executor(BashRuntimeOptions(sandbox=True)) as sandboxed:
                for _ in range(_SANDBOX_ROUNDS):  # interleaved, so both see the same machine load
                    for executor, latencies in ((bare, plain), (sandboxed, boxed)):
                        started = trio.current_time()
                        result = await executor.run(executor.resolve(BashRequest("true", workdir=workdir)))
                        latencies.append((trio.current_time() - started) * 1e3)
                        if result.exit_code != 0:
                            raise RuntimeError(f"bad run: {result}")
        except SandboxUnavailableError as exc:
            return plain, f"unavailable: {exc}"
    return plain, boxed


async def bench() -> list[dict[str, object]]:
    """Run the bash executor benchmarks.

    Returns:
        Rows ``{"figure", "value", "unit", "target"}``.
    """
    with tempfile.TemporaryDirectory(prefix="bench-bash-") as spill_dir:
        mb_per_s, rss_growth = await _throughput(spill_dir)
    latencies = await _kill_latency()
    plain, boxed = await _sandbox_latency()
    if isinstance(boxed, str):
        sandbox_rows: list[dict[str, object]] = [
            {"figure": "sandboxed bash: start -> exit latency of true", "value": boxed, "unit": "", "target": "report"}
        ]
    else:
        sandbox_rows = [
            {
                "figure": f"start -> exit latency of true, no sandbox (median of {len(plain)})",
                "value": round(statistics.median(plain), 2),
                "unit": "ms",
                "target": "report",
            },
            {
                "figure": f"start -> exit latency of true, bubblewrap sandbox (median of {len(boxed)})",
                "value": round(statistics.median(boxed), 2),
                "unit": "ms",
                "target": "report",
            },
            {
                "figure": "sandbox / no sandbox latency ratio (medians, same run)",
                "value": round(statistics.median(boxed) / statistics.median(plain), 2),
                "unit": "x",
                "target": "report",
            },
        ]
    return [
        {
            "figure": "background bash throughput via read_output (1 GiB of /dev/zero)",
            "value": round(mb_per_s, 1),
            "unit": "MB/s",
            "target": ">= 200 MB/s",
        },
        {
            "figure": "peak RSS growth during the 1 GiB run",
            "value": float(rss_growth),
            "unit": "KiB",
            "target": "bounded (tail size, not stream size)",
        },
        {
            "figure": f"task start -> kill -> exit latency, sleep 300 (median of {len(latencies)})",
            "value": round(statistics.median(latencies), 2),
            "unit": "ms",
            "target": "report",
        },
        {
            "figure": f"task start -> kill -> exit latency, sleep 300 (max of {len(latencies)})",
            "value": round(max(latencies), 2),
            "unit": "ms",
            "target": "report",
        },
        *sandbox_rows,
    ]


if __name__ == "__main__":
    for row in trio.run(bench):
        print(json.dumps(row))
