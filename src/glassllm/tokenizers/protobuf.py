"""Just enough of the protobuf wire format to read a SentencePiece ``.model`` file.

A message is a run of fields; each starts with a varint key ``(number << 3) | wire_type``.
Wire types: 0 varint, 1 eight bytes, 2 a varint length then that many bytes
(strings and nested messages), 5 four bytes (a float). Nothing is executed.
"""

from __future__ import annotations

__all__ = ["fields"]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated or malformed varint")
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, at


def fields(data: bytes) -> dict[int, list]:
    """Field number -> its values in order: ints (varints) or bytes (everything else)."""
    out: dict[int, list] = {}
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, at = data[at:at + size], at + size
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at:at + size], at + size
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if at > len(data):
            raise ValueError("truncated message")
        out.setdefault(number, []).append(value)
    return out
