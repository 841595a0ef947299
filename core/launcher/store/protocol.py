"""torch's TCPStore wire protocol (torch 2.13): codes, limits and the codec both ends share.

Used by launcher's server (:mod:`launcher.store.server`) and client (:mod:`launcher.store.client`).
See ``docs/store.md`` for the message table. Only the standard library (and
:mod:`launcher.addresses`, itself standard library only) is imported here.
"""

from __future__ import annotations

import enum
import re
import struct
from typing import Final

# One of this module's names since before it moved to the module the rendezvous shares.
from launcher.addresses import format_address

__all__ = [
    "I64",
    "KEY_PREFIX",
    "MAX_KEY_COUNT",
    "MAX_KEY_LEN",
    "MAX_VALUE_LEN",
    "U8",
    "U32",
    "U64",
    "VALIDATION_MAGIC",
    "CheckResponse",
    "NeedMore",
    "ProtocolError",
    "QueryType",
    "Reader",
    "WaitResponse",
    "as_bytes",
    "encode_key",
    "format_address",
    "pack_blob",
    "parse_int",
]

#: The number a client sends right after connecting to prove it speaks this protocol.
VALIDATION_MAGIC: Final = 0x3C85F7CE

#: torch's TCPStore client puts this in front of every user key (``set("a")`` stores ``"/a"``).
#: Our client and :class:`LocalStore` do the same so all three see one namespace.
KEY_PREFIX: Final = "/"


class QueryType(enum.IntEnum):
    """Request codes: the first byte of every client message (torch 2.13 numbering)."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


class CheckResponse(enum.IntEnum):
    """One-byte answer to CHECK."""

    READY = 0
    NOT_READY = 1


class WaitResponse(enum.IntEnum):
    """One-byte answers to WAIT, BARRIER and CANCEL_WAIT."""

    STOP_WAITING = 0
    WAIT_CANCELED = 1


# Upper bounds that tell a malformed message from a real one. They are well above torch's own
# libuv server limits (8 KiB keys, 8 MiB values, 128 Ki keys per request), so anything torch's
# server accepts, this one accepts too.
MAX_KEY_LEN: Final = 1 << 20
MAX_VALUE_LEN: Final = 1 << 30
MAX_KEY_COUNT: Final = 1 << 20

U8 = struct.Struct("<B")
U32 = struct.Struct("<I")
I64 = struct.Struct("<q")
U64 = struct.Struct("<Q")
I64_MIN: Final = -(1 << 63)
I64_MAX: Final = (1 << 63) - 1

# Like C's strtoll as torch's server uses it: optional leading whitespace, an optional sign and
# digits; anything after the digits is ignored.
_LEADING_INT = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")


def parse_int(value: bytes) -> int:
    match = _LEADING_INT.match(value)
    if match is None:
        raise ValueError(f"value {value[:40]!r} is not an integer")
    number = int(match.group(1))
    if not I64_MIN <= number <= I64_MAX:
        raise ValueError(f"value {value[:40]!r} does not fit in a signed 64-bit integer")
    return number


def encode_key(key: str) -> bytes:
    return (KEY_PREFIX + key).encode("utf-8")


def as_bytes(value: bytes | bytearray | memoryview | str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


class NeedMore(Exception):
    """The input buffer ends inside a message; wait for more bytes."""


class ProtocolError(Exception):
    """The peer sent something this protocol does not allow; its connection is closed."""


class Reader:
    """Reads protocol fields from a connection's input buffer without consuming it."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytearray, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def _unpack(self, fmt: struct.Struct) -> int:
        end = self.pos + fmt.size
        if end > len(self.buf):
            raise NeedMore
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos = end
        return int(value)

    def u8(self) -> int:
        return self._unpack(U8)

    def u32(self) -> int:
        return self._unpack(U32)

    def i64(self) -> int:
        return self._unpack(I64)

    def count(self) -> int:
        # Counts are size_t on the wire (int64 for MULTI_SET; same bytes for sane values).
        n = self._unpack(U64)
        if n > MAX_KEY_COUNT:
            raise ProtocolError(f"too many keys in one request ({n})")
        return n

    def _blob(self, limit: int, what: str) -> bytes:
        n = self._unpack(U64)
        if n > limit:
            raise ProtocolError(f"{what} of {n} bytes exceeds the limit of {limit}")
        return self.fixed(n)

    def key(self) -> bytes:
        return self._blob(MAX_KEY_LEN, "key")

    def fixed(self, n: int) -> bytes:
        """The next ``n`` bytes; :class:`NeedMore` until they have all arrived."""
        end = self.pos + n
        if end > len(self.buf):
            raise NeedMore
        data = bytes(self.buf[self.pos : end])
        self.pos = end
        return data

    def value(self) -> bytes:
        return self._blob(MAX_VALUE_LEN, "value")

    def keys(self) -> list[bytes]:
        return [self.key() for _ in range(self.count())]


def pack_blob(data: bytes) -> bytes:
    return U64.pack(len(data)) + data
