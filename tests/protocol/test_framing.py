"""The 32-byte frame header, the two-phase publish, and readers that stop at a bad frame."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import pickle
import signal
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar_orchestration.protocol.framing import (
    FLAGS_OFFSET,
    HEADER_SIZE,
    MAGIC,
    BadMagic,
    FrameError,
    FrameHeader,
    FrameMismatch,
    FrameReader,
    FrameWriter,
    TruncatedFrame,
    UnpublishedFrame,
    UnsupportedVersion,
    encode_frame,
    iter_frames,
)

SOURCE = "source/00003/00000000000000000000.seg"

Frames = list[tuple[FrameHeader, bytes]]


def _read_bytes(data: bytes, **kw: int) -> tuple[Frames, FrameError | None]:
    out: Frames = []
    try:
        for header, payload in iter_frames(data, source=SOURCE, **kw):
            out.append((header, bytes(payload)))
    except FrameError as exc:
        return out, exc
    return out, None


def _read_file(data: bytes, **kw: int) -> tuple[Frames, FrameError | None]:
    out: Frames = []
    try:
        for header, payload in FrameReader(io.BytesIO(data), source=SOURCE, **kw):
            out.append((header, payload))
    except FrameError as exc:
        return out, exc
    return out, None


Reader = Callable[..., tuple[Frames, FrameError | None]]


@pytest.fixture(params=[_read_bytes, _read_file], ids=["iter_frames", "FrameReader"])
def read_all(request: pytest.FixtureRequest) -> Reader:
    """Both readers must behave identically: same frames, same error at the same offset."""
    fn = request.param
    assert callable(fn)
    return fn  # type: ignore[no-any-return]


def _frame(payload: bytes, *, partition: int = 3, generation: int = 7, epoch: int = 5) -> bytes:
    return encode_frame(payload, epoch=epoch, generation=generation, partition=partition)


# --- layout ---------------------------------------------------------------------


def test_header_layout_is_packed_little_endian_at_the_seed_offsets() -> None:
    header = FrameHeader(
        length=0x0A0B0C0D,
        epoch=0x1112131415161718,
        generation=0x2122232425262728,
        partition=0x31323334,
        flags=0x0001,
    )
    raw = header.pack()
    assert len(raw) == HEADER_SIZE == 32
    assert raw[0:4] == bytes([0x46, 0x4D, 0x4E, 0x5F]) == MAGIC.to_bytes(4, "little")
    assert raw[4:6] == b"\x01\x00"  # version 1
    assert raw[6:10] == bytes([0x0D, 0x0C, 0x0B, 0x0A])
    assert raw[10:18] == bytes(range(0x18, 0x10, -1))
    assert raw[18:26] == bytes(range(0x28, 0x20, -1))
    assert raw[26:30] == bytes([0x34, 0x33, 0x32, 0x31])
    assert raw[30:32] == b"\x01\x00"
    assert FLAGS_OFFSET == 30


def test_header_round_trips_and_encode_frame_publishes() -> None:
    header = FrameHeader(length=3, epoch=2**64 - 1, generation=9, partition=2**32 - 1, flags=1)
    assert FrameHeader.unpack(header.pack()) == header
    assert FrameHeader.unpack(b"pad" + header.pack(), 3) == header

    frame = encode_frame(b"abc", epoch=4, generation=5, partition=6)
    decoded = FrameHeader.unpack(frame)
    assert decoded.published and decoded.flags == 1
    assert (decoded.length, decoded.epoch, decoded.generation, decoded.partition) == (3, 4, 5, 6)
    assert frame[HEADER_SIZE:] == b"abc"


@pytest.mark.parametrize("field", [{"epoch": -1}, {"epoch": 2**64}, {"partition": 2**32}, {"flags": 2**16}])
def test_header_rejects_out_of_range_fields(field: dict[str, int]) -> None:
    values = {"length": 0, "epoch": 0, "generation": 0, "partition": 0, **field}
    with pytest.raises(ValueError, match="out of range"):
        FrameHeader(**values)


def test_readers_round_trip_several_frames(read_all: Reader) -> None:
    payloads = [b"first", b"", b"x" * 10_000]
    data = b"".join(_frame(p, partition=3, generation=i) for i, p in enumerate(payloads))
    frames, error = read_all(data)
    assert error is None
    assert [p for _, p in frames] == payloads
    assert [h.generation for h, _ in frames] == [0, 1, 2]
    assert read_all(b"") == ([], None)


# --- two-phase publish -----------------------------------------------------------


def test_frame_writer_publishes_in_two_phases(tmp_path: Path) -> None:
    path = tmp_path / "frames.bin"
    with open(path, "w+b") as fh:
        writer = FrameWriter(fh, epoch=1, generation=2, partition=3, fsync=True)
        assert writer.write(b"one") == 0
        second = writer.write_unpublished(b"two")
        assert second == HEADER_SIZE + 3
        fh.seek(second + FLAGS_OFFSET)
        assert fh.read(2) == b"\x00\x00"  # phase one: not yet published
        writer.publish(second)
        fh.seek(second + FLAGS_OFFSET)
        assert fh.read(2) == b"\x01\x00"
        assert writer.write(b"three") == second + HEADER_SIZE + 3  # appends after the flag flip
    with open(path, "rb") as fh:
        got = [(h.partition, p) for h, p in FrameReader(fh, source=str(path))]
    assert got == [(3, b"one"), (3, b"two"), (3, b"three")]


def test_frame_writer_refuses_append_mode(tmp_path: Path) -> None:
    with open(tmp_path / "f", "ab") as fh, pytest.raises(ValueError, match="append mode"):
        FrameWriter(fh, epoch=1, generation=1, partition=0)


def _crashing_writer(path: str) -> None:
    """Child process: publish one frame, then die by SIGKILL between the two phases."""
    with open(path, "w+b") as fh:
        writer = FrameWriter(fh, epoch=1, generation=1, partition=0, fsync=True)
        writer.write(b"committed")
        writer.write_unpublished(b"in flight")
        os.kill(os.getpid(), signal.SIGKILL)


def test_writer_killed_between_phases_leaves_an_unpublished_frame(tmp_path: Path) -> None:
    path = tmp_path / "frames.bin"
    proc = mp.get_context("spawn").Process(target=_crashing_writer, args=(str(path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    frames, error = _read_bytes(path.read_bytes())
    assert [p for _, p in frames] == [b"committed"]
    assert isinstance(error, UnpublishedFrame)
    assert error.offset == HEADER_SIZE + len(b"committed")


# --- errors: typed, located, and the reader stops -----------------------------------


def _three_frames() -> tuple[bytes, int]:
    """Three published frames and the offset of the second."""
    first = _frame(b"good")
    return first + _frame(b"middle") + _frame(b"never read"), len(first)


def _assert_stopped_at_second(frames: Frames, error: FrameError | None, offset: int) -> None:
    assert [p for _, p in frames] == [b"good"]  # the frame after the bad one is never yielded
    assert error is not None
    assert (error.source, error.offset) == (SOURCE, offset)
    assert SOURCE in str(error) and f"offset {offset}" in str(error)


def test_corrupt_magic_stops_the_reader(read_all: Reader) -> None:
    data, second = _three_frames()
    corrupt = bytearray(data)
    corrupt[second] ^= 0xFF
    frames, error = read_all(bytes(corrupt))
    _assert_stopped_at_second(frames, error, second)
    assert isinstance(error, BadMagic)
    assert error.magic == MAGIC ^ 0xFF


def test_unknown_version_stops_the_reader(read_all: Reader) -> None:
    data, second = _three_frames()
    corrupt = bytearray(data)
    struct.pack_into("<H", corrupt, second + 4, 2)
    frames, error = read_all(bytes(corrupt))
    _assert_stopped_at_second(frames, error, second)
    assert isinstance(error, UnsupportedVersion)
    assert error.version == 2


def test_torn_two_phase_write_is_an_unpublished_frame(read_all: Reader) -> None:
    buf = io.BytesIO()
    writer = FrameWriter(buf, epoch=5, generation=7, partition=3)
    writer.write(b"good")
    second = writer.write_unpublished(b"middle")  # the writer "dies" here
    writer.write(b"never read")  # a later frame must not be reached past the torn one
    frames, error = read_all(buf.getvalue())
    _assert_stopped_at_second(frames, error, second)
    assert isinstance(error, UnpublishedFrame)
    assert (error.flags, error.length) == (0, len(b"middle"))


def test_torn_write_with_short_payload_is_still_reported_as_unpublished(read_all: Reader) -> None:
    buf = io.BytesIO()
    writer = FrameWriter(buf, epoch=5, generation=7, partition=3)
    writer.write(b"good")
    second = writer.write_unpublished(b"middle")
    frames, error = read_all(buf.getvalue()[:-3])  # killed mid-payload
    _assert_stopped_at_second(frames, error, second)
    assert isinstance(error, UnpublishedFrame)


def test_truncated_payload_stops_the_reader(read_all: Reader) -> None:
    data, second = _three_frames()
    cut = second + HEADER_SIZE + 2  # two of the six payload bytes of "middle"
    frames, error = read_all(data[:cut])
    _assert_stopped_at_second(frames, error, second)
    assert isinstance(error, TruncatedFrame)
    assert (error.needed, error.available) == (HEADER_SIZE + 6, HEADER_SIZE + 2)
    assert "truncated payload" in str(error)


def test_truncated_header_stops_the_reader(read_all: Reader) -> None:
    data, second = _three_frames()
    frames, error = read_all(data[: second + 10])
    _assert_stopped_at_second(frames, error, second)
    assert isinstance(error, TruncatedFrame)
    assert (error.needed, error.available) == (HEADER_SIZE, 10)
    assert "truncated header" in str(error)


def test_declared_length_beyond_the_data_is_truncation_not_a_misread(read_all: Reader) -> None:
    data, second = _three_frames()
    corrupt = bytearray(data)
    struct.pack_into("<I", corrupt, second + 6, 2**32 - 1)  # length overflows the object
    frames, error = read_all(bytes(corrupt))
    _assert_stopped_at_second(frames, error, second)
    assert isinstance(error, TruncatedFrame)
    assert error.needed == HEADER_SIZE + 2**32 - 1
    assert error.available == len(data) - second


def test_expected_partition_and_generation_are_enforced(read_all: Reader) -> None:
    data = _frame(b"a", partition=3, generation=7) + _frame(b"b", partition=4, generation=7)
    frames, error = read_all(data, expected_partition=3)
    assert [p for _, p in frames] == [b"a"]
    assert isinstance(error, FrameMismatch)
    assert (error.field, error.expected, error.actual) == ("partition", 3, 4)
    assert error.offset == HEADER_SIZE + 1

    frames, error = read_all(data, expected_generation=8)
    assert frames == []
    assert isinstance(error, FrameMismatch)
    assert (error.field, error.expected, error.actual, error.offset) == ("generation", 8, 7, 0)


def test_frame_errors_pickle_with_their_fields() -> None:
    for err in (
        BadMagic(SOURCE, 64, 0xDEADBEEF),
        UnsupportedVersion(SOURCE, 0, 2),
        UnpublishedFrame(SOURCE, 32, 0, 10),
        TruncatedFrame(SOURCE, 96, 42, 5),
        FrameMismatch(SOURCE, 0, "partition", 1, 2),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and vars(back) == vars(err) and str(back) == str(err)
