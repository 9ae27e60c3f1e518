"""The UART register bridge's framed protocol: one source of truth for the gateware
(``hdl/uart_bridge.py``), the host's serial transport and their tests.

The host sends *requests*, the bridge answers each complete request with exactly one
*response*. All multi-byte fields are little-endian. ``docs/uart.md`` is the
specification in prose.

Request::

    SYNC_REQ  CMD  ADDR[3]  COUNT-1  [DATA: 4 * COUNT bytes, writes only]  CRC

* ``CMD``: a :class:`Cmd`: read or write, at consecutive word addresses or (``_FIXED``)
  all at the same one (to drain a FIFO register);
* ``ADDR``: the Wishbone *word* address (byte address >> 2) of the first word;
* ``COUNT - 1``: 0..``MAX_WORDS - 1``;
* ``CRC``: CRC-8 (polynomial 0x07, initial value 0, no reflection, no final XOR) of
  every byte after ``SYNC_REQ``.

Response::

    SYNC_RESP  STATUS  ARG  [DATA: 4 * COUNT bytes, a successful read only]  CRC

* ``STATUS``: a :class:`Status`;
* ``ARG``: ``COUNT - 1`` of the request when it succeeded; the index of the word that
  the bus refused (:attr:`Status.BUS_ERROR`); 0 otherwise.

A write is carried out only once its CRC has checked (the bridge holds the burst).
Bytes outside a frame that are not ``SYNC_REQ`` are ignored, so a host can resync by
waiting out :data:`FRAME_TIMEOUT_BYTES` byte times of silence.
"""

import enum


__all__ = ["SYNC_REQ", "SYNC_RESP", "MAX_WORDS", "FRAME_TIMEOUT_BYTES", "Cmd", "Status",
           "crc8", "encode_request", "encode_response", "decode_request",
           "response_length", "decode_response", "ProtocolError"]


SYNC_REQ = 0xA5
SYNC_RESP = 0x5A
MAX_WORDS = 64                 #: words per burst (the bridge buffers a write burst)
FRAME_TIMEOUT_BYTES = 32       #: silence inside a frame, in byte times, that drops it


class Cmd(enum.IntEnum):
    READ = 0x01                #: COUNT words from ADDR, ADDR + 1, ...
    WRITE = 0x02
    READ_FIXED = 0x11          #: COUNT words, all from ADDR
    WRITE_FIXED = 0x12

    @property
    def is_write(self):
        return self in (Cmd.WRITE, Cmd.WRITE_FIXED)


class Status(enum.IntEnum):
    OK = 0x00
    BAD_CRC = 0x01             #: the request's CRC did not check: nothing was done
    BAD_COMMAND = 0x02         #: CMD is not a Cmd: the bridge looks for SYNC again
    BUS_ERROR = 0x03           #: the bus answered ERR (or not at all) at word ARG
    TIMEOUT = 0x04             #: the request stopped mid-frame for FRAME_TIMEOUT_BYTES


class ProtocolError(ValueError):
    """Bytes that are not a well-formed frame."""


def crc8(data, crc=0):
    """CRC-8, polynomial x^8 + x^2 + x + 1 (0x07), MSB first, initial value ``crc``."""
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _words(data):
    return b"".join(int(w).to_bytes(4, "little") for w in data)


def encode_request(cmd, addr, count=None, data=()):
    """The bytes of a request. ``addr`` is a *word* address; a read gives ``count``, a
    write its ``data`` words."""
    cmd = Cmd(cmd)
    data = list(data)
    count = len(data) if cmd.is_write else count
    if not 1 <= count <= MAX_WORDS:
        raise ValueError(f"a burst is 1 to {MAX_WORDS} words, not {count}")
    if not 0 <= addr < 1 << 24:
        raise ValueError(f"word address {addr:#x} does not fit 24 bits")
    body = bytes([cmd]) + addr.to_bytes(3, "little") + bytes([count - 1])
    if cmd.is_write:
        body += _words(data)
    return bytes([SYNC_REQ]) + body + bytes([crc8(body)])


def decode_request(frame):
    """``(cmd, addr, count, data)`` of a request's bytes (the inverse of
    :func:`encode_request`). Raises :class:`ProtocolError`."""
    frame = bytes(frame)
    if len(frame) < 7 or frame[0] != SYNC_REQ:
        raise ProtocolError("not a request")
    if crc8(frame[1:-1]) != frame[-1]:
        raise ProtocolError("bad CRC")
    cmd = Cmd(frame[1])
    addr = int.from_bytes(frame[2:5], "little")
    count = frame[5] + 1
    payload = frame[6:-1]
    expect = 4 * count if cmd.is_write else 0
    if len(payload) != expect:
        raise ProtocolError(f"{len(payload)} data bytes, expected {expect}")
    data = [int.from_bytes(payload[i:i + 4], "little") for i in range(0, len(payload), 4)]
    return cmd, addr, count, data


def encode_response(status, arg=0, data=()):
    """The bytes of a response."""
    body = bytes([Status(status), arg & 0xFF]) + _words(data)
    return bytes([SYNC_RESP]) + body + bytes([crc8(body)])


def response_length(cmd, count, status=Status.OK):
    """Bytes of the response to a request (the data only with a successful read)."""
    data = 4 * count if not Cmd(cmd).is_write and status == Status.OK else 0
    return 4 + data


def decode_response(frame):
    """``(status, arg, data)`` of a response's bytes. Raises :class:`ProtocolError`."""
    frame = bytes(frame)
    if len(frame) < 4 or frame[0] != SYNC_RESP:
        raise ProtocolError("not a response")
    if crc8(frame[1:-1]) != frame[-1]:
        raise ProtocolError("bad CRC")
    try:
        status = Status(frame[1])
    except ValueError:
        raise ProtocolError(f"unknown status {frame[1]:#04x}") from None
    payload = frame[3:-1]
    if len(payload) % 4:
        raise ProtocolError(f"{len(payload)} data bytes, not whole words")
    data = [int.from_bytes(payload[i:i + 4], "little") for i in range(0, len(payload), 4)]
    return status, frame[2], data
