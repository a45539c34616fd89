"""Attacks on the file tools by a model that injects its own calls: memory bombs, races, paths (docs/tools.rst)."""

from __future__ import annotations

from pathlib import Path

from test_file_tools import call, run_calls

from trio_harness.tools import FileToolOptions


async def test_an_edit_or_write_past_the_file_limit_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """replace_all of one common character by a long text would build gigabytes in memory; refused at once."""
    (tmp_path / "a.txt").write_text("a" * 50_000)
    options = FileToolOptions(max_file_bytes=100_000)
    _, bomb, big, fits = await run_calls(
        tmp_path,
        [call("read_file", path="a.txt")],
        [call("edit_file", path="a.txt", old_text="a", new_text="b" * 1000, replace_all=True)],
        [call("write_file", path="new.txt", content="x" * 100_001)],
        [call("edit_file", path="a.txt", old_text="a" * 50_000, new_text="c" * 100_000)],
        file_tool_options=options,
    )
    assert bomb.is_error and "would be 50000000 bytes, more than the 100000-byte limit" in bomb.content
    assert (tmp_path / "a.txt").read_text() == "c" * 100_000  # the last edit, just at the limit
    assert big.is_error and "100001 bytes" in big.content and not (tmp_path / "new.txt").exists()
    assert not fits.is_error
