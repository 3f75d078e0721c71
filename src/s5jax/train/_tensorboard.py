"""A minimal TensorBoard event-file writer (scalars only), without TensorFlow or protobuf.

An event file is a sequence of TFRecords. Each record is

    uint64 length (little endian) | uint32 masked_crc32c(length bytes)
    | data | uint32 masked_crc32c(data)

where `data` is a serialised `tensorflow.Event` protobuf. Only the fields needed for scalars
are encoded by hand:

    Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
                 Summary summary = 5; SessionLog session_log = 6; }
    Summary    { repeated Value value = 1; }
    Value      { string tag = 1; float simple_value = 2; }
    SessionLog { SessionStatus status = 1; }   // START = 1

The first record of a file carries `file_version = "brain.Event:2"`. A `SessionLog.START`
event at step s makes TensorBoard discard the events at steps ≥ s that an earlier (killed) run
wrote, so a resumed run does not show duplicated curves.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

__all__ = [
    "EventWriter",
    "crc32c",
    "encode_event",
    "frame_record",
    "masked_crc32c",
]

_CRC32C_POLY = 0x82F63B78  # Castagnoli polynomial, bit-reversed
_MASK_DELTA = 0xA282EAD8
_FILE_VERSION = "brain.Event:2"
_SESSION_START = 1


def _crc32c_table() -> tuple[int, ...]:
    """The 256-entry lookup table of the reflected CRC-32C."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC32C_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`, as used by TFRecord.

    **Arguments:**
    - `data`: the bytes to checksum.

    **Returns:** the checksum as an unsigned 32-bit integer.
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C that TFRecord stores (rotate right by 15, add a constant).

    **Arguments:**
    - `data`: the bytes to checksum.

    **Returns:** the masked checksum as an unsigned 32-bit integer.
    """
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """Wrap `data` in TFRecord framing.

    **Arguments:**
    - `data`: the record payload.

    **Returns:** length, masked CRC of the length, payload and masked CRC of the payload.
    """
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer (< 2**64)."""
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    """Protobuf field key."""
    return _varint((field << 3) | wire_type)


def _length_delimited(field: int, payload: bytes) -> bytes:
    """A length-delimited (wire type 2) protobuf field."""
    return _key(field, 2) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
    """Little-endian float32; values beyond the float32 range become ±inf."""
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def _summary_value(tag: str, value: float) -> bytes:
    """A serialised `Summary.Value` with a tag and a simple (float) value."""
    return _length_delimited(1, tag.encode("utf-8")) + _key(2, 5) + _float32(value)


def encode_event(
    wall_time: float,
    step: int,
    *,
    file_version: str | None = None,
    scalars: Mapping[str, float] | None = None,
    session_start: bool = False,
) -> bytes:
    """Serialise one `tensorflow.Event` protobuf.

    **Arguments:**
    - `wall_time`: seconds since the Unix epoch.
    - `step`: the global step (int64; negative values are encoded as two's complement).
    - `file_version`: if given, the `file_version` field (first event of a file).
    - `scalars`: if given, a `Summary` with one simple value per tag.
    - `session_start`: add a `SessionLog` with status START.

    **Returns:** the serialised event.
    """
    out = _key(1, 1) + struct.pack("<d", wall_time)
    out += _key(2, 0) + _varint(int(step) & 0xFFFFFFFFFFFFFFFF)
    if file_version is not None:
        out += _length_delimited(3, file_version.encode("utf-8"))
    if scalars:
        summary = b"".join(
            _length_delimited(1, _summary_value(tag, float(v))) for tag, v in scalars.items()
        )
        out += _length_delimited(5, summary)
    if session_start:
        out += _length_delimited(6, _key(1, 0) + _varint(_SESSION_START))
    return out


def _event_file_path(log_dir: Path, wall_time: float) -> Path:
    """A fresh event-file name `events.out.tfevents.<int time>.<hostname>[.<n>]`."""
    base = f"events.out.tfevents.{int(wall_time)}.{socket.gethostname()}"
    path = log_dir / base
    n = 0
    while path.exists():
        n += 1
        path = log_dir / f"{base}.{n}"
    return path


class EventWriter:
    """Writes scalar summaries to a new TensorBoard event file in `log_dir`.

    **Arguments:**
    - `log_dir`: directory of the event file (created if missing).
    - `clock`: wall-clock function (seconds since the epoch), for the event times.

    Every `add_scalars` call writes one record and flushes it, so a killed run keeps complete
    records. Use as a context manager or call `close()`.
    """

    def __init__(self, log_dir: str | os.PathLike, *, clock: Callable[[], float] = time.time):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        now = clock()
        self.path = _event_file_path(self.log_dir, now)
        self._file = open(self.path, "xb")
        self._write(encode_event(now, 0, file_version=_FILE_VERSION))

    def _write(self, event: bytes) -> None:
        """Frame, write and flush one serialised event."""
        self._file.write(frame_record(event))
        self._file.flush()

    def add_scalars(
        self, scalars: Mapping[str, float], step: int, wall_time: float | None = None
    ) -> None:
        """Write one event holding the given scalars.

        **Arguments:**
        - `scalars`: tag → value (converted with `float`).
        - `step`: the global step.
        - `wall_time`: event time; defaults to the clock.
        """
        if not scalars:
            return
        t = self._clock() if wall_time is None else wall_time
        self._write(encode_event(t, step, scalars=scalars))

    def session_start(self, step: int) -> None:
        """Write a `SessionLog.START` event: TensorBoard drops earlier events at steps ≥ `step`.

        **Arguments:**
        - `step`: the first step of the resumed run.
        """
        self._write(encode_event(self._clock(), step, session_start=True))

    def close(self) -> None:
        """Close the file (idempotent)."""
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
