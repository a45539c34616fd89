"""Tests of bash output buffering: the bounded tail, the read cursor, UTF-8 boundaries, the spill file.

No processes: bytes are fed to :class:`OutputStream` directly, the way the
executor's pumps feed what a pipe delivers.  Spill files are real files.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_harness.bash._output import OutputStream, Taken, incomplete_suffix, leading_continuations

EURO = "€".encode()  # e2 82 ac
GRIN = "😀".encode()  # f0 9f 98 80


def stream(limit: int = 1024, name: str = "stdout") -> OutputStream:
    return OutputStream(name, limit)


@pytest.fixture
def umask_zero() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# ------------------------------------------------------------------ UTF-8 helpers


@pytest.mark.parametrize(
    ("data", "start", "held"),
    [
        (b"", 0, 0),
        (b"abc", 0, 0),
        (b"a" + EURO, 0, 0),
        (b"a" + EURO[:1], 0, 1),
        (b"a" + EURO[:2], 0, 2),
        (GRIN[:3], 0, 3),
        (GRIN, 0, 0),
        (b"x\xc3", 0, 1),  # a two-byte lead alone
        (b"\x82\xac", 0, 0),  # orphan continuations: nothing to wait for
        (b"a" + EURO[:2], 1, 2),
        (b"a" + EURO[:2], 2, 0),  # only bytes from ``start`` count: a lead before it leaves an orphan
    ],
)
def test_incomplete_suffix(data: bytes, start: int, held: int) -> None:
    assert incomplete_suffix(bytearray(data), start) == held


@pytest.mark.parametrize(
    ("data", "start", "count"),
    [(b"abc", 0, 0), (EURO[1:] + b"a", 0, 2), (b"\x80\x80\x80\x80", 0, 3), (b"a\x80", 1, 1), (b"", 0, 0)],
)
def test_leading_continuations(data: bytes, start: int, count: int) -> None:
    assert leading_continuations(bytearray(data), start) == count


# ------------------------------------------------------------------ tail and cursor


def test_take_consumes_what_is_new() -> None:
    out = stream()
    out.feed(b"one\n")
    assert out.take() == Taken("one\n", 0, "")
    assert out.take() == Taken("", 0, "")
    out.feed(b"two\n")
    assert out.take() == Taken("two\n", 0, "")
    assert out.total == 8


def test_tail_keeps_the_last_limit_bytes() -> None:
    out = stream(limit=4)
    for piece in (b"ab", b"cd", b"ef"):
        out.feed(piece)
    assert bytes(out.buf) == b"cdef"
    assert out.total == 6
    out.feed(b"0123456789")  # one chunk longer than the limit
    assert bytes(out.buf) == b"6789"
    assert out.total == 16


def test_snapshot_does_not_consume() -> None:
    out = stream(limit=4)
    out.feed(b"abcdef")
    assert out.snapshot() == Taken("cdef", 2, "stdout is not kept")
    assert out.snapshot() == Taken("cdef", 2, "stdout is not kept")
    assert out.take() == Taken("cdef", 2, "stdout is not kept")
    assert out.snapshot() == Taken("cdef", 2, "stdout is not kept")


def test_lossy_take_counts_only_unread_bytes() -> None:
    out = stream(limit=4)
    out.feed(b"ab")
    assert out.take().text == "ab"
    out.feed(b"cdefgh")  # c and d fall out of the tail unread
    assert out.take() == Taken("efgh", 2, "stdout is not kept")
    out.feed(b"ij")
    assert out.take() == Taken("ij", 0, "")


def test_utf8_char_split_across_feeds_is_held_back() -> None:
    out = stream()
    out.feed(b"a" + EURO[:2])
    assert out.take() == Taken("a", 0, "")
    assert out.take() == Taken("", 0, "")
    out.feed(EURO[2:] + b"b")
    assert out.take() == Taken("€b", 0, "")


def test_four_byte_char_fed_one_byte_at_a_time() -> None:
    out = stream()
    for byte in GRIN:
        out.feed(bytes([byte]))
        text = out.take().text
        assert text in ("", "😀")
    assert out.cursor == out.total == 4


def test_incomplete_utf8_at_eof_is_replaced() -> None:
    out = stream()
    out.feed(b"x" + EURO[:2])
    assert out.take().text == "x"
    out.eof = True
    assert out.take().text == "\ufffd"


def test_invalid_bytes_are_replaced_not_held() -> None:
    out = stream()
    out.feed(b"a\xffb\x80c")
    assert out.take().text == "a\ufffdb\ufffdc"


def test_lossy_take_skips_orphan_continuation_bytes() -> None:
    out = stream(limit=4)
    out.feed("€€€€".encode())  # the tail holds ac e2 82 ac
    assert out.take() == Taken("€", 9, "stdout is not kept")


def test_lossy_snapshot_skips_orphan_continuation_bytes() -> None:
    out = stream(limit=5)
    out.feed(b"abc" + GRIN)  # the tail holds c f0 9f 98 80: no orphan
    assert out.snapshot() == Taken("c😀", 2, "stdout is not kept")
    out.feed(b"de")  # now 9f 98 80 d e: three orphans
    assert out.snapshot() == Taken("de", 7, "stdout is not kept")


def test_tail_shorter_than_a_char_yields_no_replacement() -> None:
    out = stream(limit=3)
    out.feed(GRIN)  # 9f 98 80: only continuation bytes
    assert out.take() == Taken("", 4, "stdout is not kept")
    out.eof = True
    assert out.take() == Taken("", 0, "")


def test_orphans_arriving_after_a_lossy_take_are_dropped_too() -> None:
    # A tail shorter than a character: the take that lost the lead byte cannot
    # see the last continuation byte yet; it must not be decoded when it comes.
    out = stream(limit=1)
    out.feed(GRIN[:3])
    assert out.take() == Taken("", 3, "stdout is not kept")
    out.feed(GRIN[3:])
    assert out.take() == Taken("", 1, "stdout is not kept")
    out.feed(b"!")
    assert out.take() == Taken("!", 0, "")
    out.feed(b"\x80")  # an orphan after a complete character is invalid input, replaced as usual
    out.eof = True
    assert out.take() == Taken("\ufffd", 0, "")


def test_orphan_skip_stops_at_three_bytes() -> None:
    out = stream(limit=2)
    out.feed(b"a\x80\x80")
    assert out.take() == Taken("", 3, "stdout is not kept")
    out.feed(b"\x80\x80")  # the fourth continuation byte cannot belong to the lost character
    out.eof = True
    assert out.take() == Taken("\ufffd", 1, "stdout is not kept")


# ------------------------------------------------------------------ spill file


def test_spill_file_holds_the_full_stream(tmp_path: Path) -> None:
    out = stream(limit=4)
    out.open_spill(str(tmp_path), "stem")
    assert out.spill_path is not None
    path = Path(out.spill_path)
    assert path.parent == tmp_path
    assert path.name.startswith("stem-")
    assert path.name.endswith(".stdout")
    out.feed(b"0123456789")
    out.feed(b"abcdef")
    assert path.read_bytes() == b"0123456789abcdef"
    assert out.take() == Taken("cdef", 12, f"full stdout in {path}")


def test_spill_files_are_distinct(tmp_path: Path) -> None:
    first, second = stream(), stream()
    first.open_spill(str(tmp_path), "same")
    second.open_spill(str(tmp_path), "same")
    assert first.spill_path != second.spill_path
    assert len(list(tmp_path.iterdir())) == 2


@pytest.mark.parametrize("mask", [0, 0o022, 0o277])
def test_spill_file_is_private_whatever_the_umask(tmp_path: Path, umask_zero: None, mask: int) -> None:
    os.umask(mask)
    out = stream()
    out.open_spill(str(tmp_path), "stem")
    assert out.spill_path is not None
    assert stat.S_IMODE(os.stat(out.spill_path).st_mode) == 0o600
    out.feed(b"written")  # still writable after the umask narrowed the mode
    assert Path(out.spill_path).read_bytes() == b"written"


def test_spill_open_failure_is_an_os_error(tmp_path: Path) -> None:
    out = stream()
    with pytest.raises(FileNotFoundError):
        out.open_spill(str(tmp_path / "missing"), "stem")
    assert out.spill_path is None
    assert out.spill_fd == -1


def test_spill_write_error_is_reported_not_raised() -> None:
    # /dev/full refuses every write with ENOSPC: a real write error.
    out = stream(limit=4)
    out.spill_path = "/dev/full"
    out.spill_fd = os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC)
    out.feed(b"0123456789")
    assert out.spill_fd == -1  # closed after the error
    assert out.spill_error is not None
    assert out.spill_error.startswith("OSError: [Errno 28]")
    out.feed(b"ab")  # the tail goes on
    assert out.take() == Taken("89ab", 8, f"stdout spill file /dev/full is incomplete ({out.spill_error})")


def test_remove_spill_deletes_once_and_says_so(tmp_path: Path) -> None:
    out = stream(limit=2, name="stderr")
    out.open_spill(str(tmp_path), "stem")
    assert out.spill_path is not None
    out.feed(b"abc")
    out.remove_spill()
    assert not os.path.exists(out.spill_path)
    assert out.spill_fd == -1
    out.remove_spill()  # idempotent
    out.feed(b"d")  # nothing written after removal; the tail still works
    assert list(tmp_path.iterdir()) == []
    assert out.take() == Taken("cd", 2, "the stderr spill file was removed")


def test_remove_spill_tolerates_a_file_already_gone(tmp_path: Path) -> None:
    out = stream()
    out.open_spill(str(tmp_path), "stem")
    assert out.spill_path is not None
    os.unlink(out.spill_path)
    out.remove_spill()
    assert out.spill_removed


def test_close_spill_keeps_the_file(tmp_path: Path) -> None:
    out = stream()
    out.open_spill(str(tmp_path), "stem")
    assert out.spill_path is not None
    out.feed(b"kept")
    out.close_spill()
    out.close_spill()  # idempotent
    out.feed(b" not spilled")
    assert Path(out.spill_path).read_bytes() == b"kept"
    assert out.where() == f"full stdout in {out.spill_path}"


# ------------------------------------------------------------------ properties


@st.composite
def feeds_and_takes(draw: st.DrawFn, data: bytes) -> list[bytes | None]:
    """``data`` cut into pieces, with takes (``None``) anywhere between them."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    bounds = [0, *cuts, len(data)]
    steps: list[bytes | None] = []
    for start, end in itertools.pairwise(bounds):
        steps.append(data[start:end])
        if draw(st.booleans()):
            steps.append(None)
    return steps


@given(data=st.data(), raw=st.binary(max_size=40))
def test_lossless_reads_of_any_split_decode_like_the_whole(data: st.DataObject, raw: bytes) -> None:
    out = stream(limit=max(len(raw), 1))
    texts: list[str] = []
    for step in data.draw(feeds_and_takes(raw)):
        if step is None:
            taken = out.take()
            assert taken.dropped == 0
            texts.append(taken.text)
        else:
            out.feed(step)
    whole = raw.decode("utf-8", "replace")
    # While the stream is open, only a complete prefix has been handed out.
    assert whole.startswith("".join(texts))
    out.eof = True
    texts.append(out.take().text)
    assert "".join(texts) == whole
    assert out.cursor == out.total == len(raw)


@given(data=st.data(), raw=st.binary(max_size=60), limit=st.integers(1, 12))
def test_tail_is_always_the_last_limit_bytes(data: st.DataObject, raw: bytes, limit: int) -> None:
    out = stream(limit=limit)
    fed = b""
    for step in data.draw(feeds_and_takes(raw)):
        if step is not None:
            out.feed(step)
            fed += step
            assert bytes(out.buf) == fed[-limit:]
            assert out.total == len(fed)


@given(data=st.data(), text=st.text(alphabet=st.characters(codec="ascii"), max_size=60), limit=st.integers(1, 12))
def test_lossy_reads_account_for_every_byte(data: st.DataObject, text: str, limit: int) -> None:
    raw = text.encode()
    out = stream(limit=limit)
    position = 0
    for step in [*data.draw(feeds_and_takes(raw)), None]:
        if step is not None:
            out.feed(step)
            continue
        taken = out.take()
        # Each take is the stream's next bytes after what it reports as dropped.
        position += taken.dropped
        assert taken.text == text[position : position + len(taken.text)]
        position += len(taken.text)
    assert position == len(raw)


@given(
    data=st.data(),
    text=st.text(alphabet=st.characters(exclude_characters="\ufffd", exclude_categories=["Cs"]), max_size=30),
    limit=st.integers(1, 16),
)
def test_lossy_reads_of_valid_utf8_never_cut_a_character(data: st.DataObject, text: str, limit: int) -> None:
    out = stream(limit=limit)
    steps = [*data.draw(feeds_and_takes(text.encode())), None]
    for index, step in enumerate(steps):
        if step is not None:
            out.feed(step)
            continue
        takes = [out.take()]
        if index == len(steps) - 1:
            out.eof = True
            takes += [out.take(), out.snapshot()]  # a snapshot is of a finished stream
        for taken in takes:
            assert "\ufffd" not in taken.text
            assert taken.text in text
