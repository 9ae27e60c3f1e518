"""The ``serial`` transport: a board's tile through the UART register bridge.

:class:`SerialTransport` speaks the framed protocol of ``docs/uart.md`` (frames, CRC
and constants from :mod:`fusetile.host.uart_protocol`) over a serial port opened with
pyserial::

    >>> dev = Device(open_transport("serial:/dev/ttyUSB0@3000000"))

Every burst becomes requests of at most :data:`~fusetile.host.uart_protocol.MAX_WORDS`
words; each request gets exactly one response. A request the board refused unread
(``BAD_CRC``, ``TIMEOUT``) is sent again; a response that is lost or garbled is not
(see :meth:`SerialTransport._exchange`). The board's tile runs freely, so
:meth:`~SerialTransport.wait_cycles` sleeps.
"""

import errno
import numbers
import time

from ..hdl.regmap import tile_memory_map
from ..kernels.config import TileConfig
from .transport import Transport, TransportError, register_transport
from .uart_protocol import (SYNC_RESP, MAX_WORDS, FRAME_TIMEOUT_BYTES, Cmd, Status,
                            ProtocolError, encode_request, decode_response, response_length)


__all__ = ["SerialTransport", "DEFAULT_BAUD", "parse_port"]


DEFAULT_BAUD = 1_000_000
_BITS_PER_BYTE = 10            # start bit, 8 data bits, stop bit
_SHOWN_BYTES = 24              # bytes of a bad response quoted in an error message
_HEADER = 3                    # SYNC_RESP, STATUS, ARG
_RESENT = (Status.BAD_CRC, Status.TIMEOUT)


def parse_port(arg):
    """Split ``"PORT[@BAUD]"`` into ``(port, baud)``; ``baud`` is ``None`` when absent.

    Raises
    ------
    ValueError
        If the port is empty or ``BAUD`` is not a positive decimal integer.
    """
    if not isinstance(arg, str):
        raise TypeError(f"Serial port must be a string 'PORT[@BAUD]', not {arg!r}")
    port, sep, baud = arg.rpartition("@")
    if not sep:
        port, baud = arg, None
    if not port:
        raise ValueError(f"Serial target must be 'serial:PORT[@BAUD]' "
                         f"(e.g. 'serial:/dev/ttyUSB0@3000000'), not {arg!r}: no port")
    if baud is not None:
        if not (baud.isascii() and baud.isdigit()) or int(baud) == 0:
            raise ValueError(f"Baud rate must be a positive decimal integer, not {baud!r} "
                             f"(in {arg!r})")
        baud = int(baud)
    return port, baud


def _check_positive(name, value):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be a positive number, not {value!r}")


def _hex(data):
    shown = bytes(data[:_SHOWN_BYTES]).hex(" ")
    more = f" ... ({len(data)} bytes)" if len(data) > _SHOWN_BYTES else ""
    return (shown + more) if data else "nothing"


@register_transport("serial")
class SerialTransport(Transport):
    """A board's tile, reached through the UART register bridge.

    Parameters
    ----------
    port : str or file-like
        ``"PORT[@BAUD]"`` (e.g. ``"/dev/ttyUSB0@3000000"``, as in the target
        ``serial:/dev/ttyUSB0@3000000``), or an already-open port: an object with
        pyserial's ``read(n)`` (returning fewer bytes on timeout) and ``write(data)``,
        and optionally ``reset_input_buffer()``. An object given is not closed by
        :meth:`close`; its own timeout applies.
    baud : int or None
        Line rate, if not given in ``port`` (default :data:`DEFAULT_BAUD`).
    timeout : float
        Seconds to wait for each part of a response (its header, then the rest).
    retries : int
        How many times a request the board answered ``BAD_CRC`` or ``TIMEOUT`` is sent
        again.
    clock_hz : float
        The board tile's clock: :meth:`wait_cycles` sleeps ``n / clock_hz`` seconds.
    config : TileConfig or None
        The board tile's configuration, to name registers in error messages (otherwise
        a :class:`~fusetile.host.device.Device` fills the memory map in).

    Attributes
    ----------
    port : str
        The port's name.
    baud : int or None
        ``None`` for an object given as ``port``.
    timeout, retries, clock_hz
        As given (``timeout`` is the open port's: changing the attribute later only
        changes messages).
    resends : int
        Requests sent again after ``BAD_CRC`` / ``TIMEOUT`` so far.

    Raises
    ------
    ValueError
        If an argument is malformed (e.g. ``"/dev/ttyUSB0@fast"``).
    TransportError
        If the port does not exist or cannot be opened, or pyserial is missing.
    """

    def __init__(self, port=None, *, baud=None, timeout=1.0, retries=3, clock_hz=50e6,
                 config=None):
        if port is None:
            raise ValueError("The serial transport needs a port: 'serial:PORT[@BAUD]' "
                             "(e.g. 'serial:/dev/ttyUSB0@3000000')")
        _check_positive("timeout", timeout)
        _check_positive("clock_hz", clock_hz)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"retries must be a non-negative integer, not {retries!r}")
        if config is not None and not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig or None, not {config!r}")
        if baud is not None and (not isinstance(baud, int) or isinstance(baud, bool)
                                 or baud <= 0):
            raise ValueError(f"baud must be a positive integer, not {baud!r}")
        super().__init__(memory_map=None if config is None else tile_memory_map(config))
        self.timeout = timeout
        self.retries = retries
        self.clock_hz = clock_hz
        self.resends = 0
        if isinstance(port, str):
            self.port, in_port = parse_port(port)
            if baud is not None and in_port is not None and baud != in_port:
                raise ValueError(f"Two baud rates: {in_port} in {port!r} and baud={baud}")
            self.baud = baud or in_port or DEFAULT_BAUD
            self._serial = self._open(self.port, self.baud, timeout)
            self._owned = True
        elif callable(getattr(port, "read", None)) and callable(getattr(port, "write", None)):
            self.port = str(getattr(port, "name", None) or getattr(port, "port", None)
                            or repr(port))
            self.baud = baud or getattr(port, "baudrate", None)
            self._serial = port
            self._owned = False
        else:
            raise TypeError(f"port must be a 'PORT[@BAUD]' string or an open port with "
                            f"read() and write(), not {port!r}")

    @staticmethod
    def _open(port, baud, timeout):
        try:
            import serial
        except ImportError as e:
            raise TransportError(f"The serial transport needs pyserial "
                                 f"(pip install 'pyserial>=3.5'): {e}") from e
        try:
            return serial.Serial(port, baud, timeout=timeout, write_timeout=timeout,
                                 exclusive=True)
        except serial.SerialException as e:
            if e.errno == errno.ENOENT:
                raise TransportError(f"Serial port {port} does not exist") from e
            raise TransportError(f"Cannot open serial port {port}: {e}") from e
        except ValueError as e:                  # pyserial's own check of the settings
            raise ValueError(f"Cannot open serial port {port} at {baud} baud: {e}") from e

    # -- Transport -----------------------------------------------------------------
    def _read32(self, addr):
        return self._read_burst(addr, 1, True)[0]

    def _write32(self, addr, value):
        self._write_burst(addr, [value], True)

    def _read_burst(self, addr, count, increment):
        cmd = Cmd.READ if increment else Cmd.READ_FIXED
        words = []
        for start in range(0, count, MAX_WORDS):
            at = addr + 4 * start if increment else addr
            words += self._exchange(cmd, at, min(MAX_WORDS, count - start))
        return words

    def _write_burst(self, addr, values, increment):
        cmd = Cmd.WRITE if increment else Cmd.WRITE_FIXED
        for start in range(0, len(values), MAX_WORDS):
            at = addr + 4 * start if increment else addr
            chunk = values[start:start + MAX_WORDS]
            self._exchange(cmd, at, len(chunk), chunk)

    def wait_cycles(self, n):
        """Sleep ``n`` cycles of the board's clock (its tile runs on its own)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"Cycle count must be a non-negative integer, not {n!r}")
        self._check_open()
        time.sleep(n / self.clock_hz)

    def close(self):
        if not self.closed and self._owned:
            self._serial.close()
        super().close()

    # -- one request ------------------------------------------------------------------
    def _exchange(self, cmd, addr, count, data=()):
        """Send one request for ``count`` words at byte address ``addr`` and return the
        words read (``[]`` for a write).

        Only a request the board answered ``BAD_CRC`` or ``TIMEOUT`` is sent again: the
        board did not carry it out. A response that is lost or garbled is never
        retried, because the request may have been carried out and repeating it may
        not be harmless: a write to ``CTRL`` may have started the tile (or swapped,
        aborted, cleared a fault), a read of ``TRACE_DATA`` pops trace records.
        """
        request = encode_request(cmd, addr >> 2, count, data)
        what = self._describe(cmd, addr, count)
        for attempt in range(self.retries + 1):
            if attempt:
                self.resends += 1
                self._resync()
            self._send(request, what)
            status, arg, words = self._receive(cmd, addr, count, what)
            if status == Status.OK:
                return words
            if status == Status.BUS_ERROR:
                step = 4 if cmd in (Cmd.READ, Cmd.WRITE) else 0
                raise self._bus_error(addr + step * arg, cmd.is_write)
            if status not in _RESENT:
                raise TransportError(f"the board on {self.port} answered {status.name} to "
                                     f"{what}")
        tries = self.retries + 1
        raise TransportError(f"the board on {self.port} answered {status.name} to {what} "
                             f"{tries} time{'s' if tries > 1 else ''} in a row: the link "
                             f"loses or corrupts requests")

    def _describe(self, cmd, addr, count):
        where = f"{addr:#010x}"
        entry = self.memory_map.lookup(addr) if self.memory_map is not None else None
        if entry is not None:
            offset = addr - entry.addr
            where += f" ({entry.item.name}" + (f" + {offset:#x}" if offset else "") + ")"
        kind = "write" if cmd.is_write else "read"
        fixed = " at one address" if cmd in (Cmd.READ_FIXED, Cmd.WRITE_FIXED) else ""
        words = f"{count} words" if count > 1 else "1 word"
        return f"a {kind} of {words}{fixed} at {where}"

    def _resync(self):
        """Wait out twice the bridge's frame timeout before a resend: a bridge that took
        a corrupted byte of the failed request for a frame's start has dropped that
        frame by then, and its TIMEOUT answer is flushed with the stale input."""
        if self.baud:
            time.sleep(2 * FRAME_TIMEOUT_BYTES * _BITS_PER_BYTE / self.baud)

    def _send(self, request, what):
        try:
            reset = getattr(self._serial, "reset_input_buffer", None)
            if reset is not None:
                reset()                      # a late answer to an earlier request
            self._serial.write(request)
        except OSError as e:                 # pyserial's SerialException is an OSError
            raise TransportError(f"cannot send {what} to the board on {self.port}: "
                                 f"{e}") from e

    def _read(self, n, what):
        try:
            return bytes(self._serial.read(n)) if n > 0 else b""
        except OSError as e:
            raise TransportError(f"cannot read the board's answer to {what} on "
                                 f"{self.port}: {e}") from e

    def _receive(self, cmd, addr, count, what):
        """``(status, arg, words)`` of the response; raises on silence or garbage."""
        head = self._read(_HEADER, what)
        if not head:
            raise TransportError(f"no answer from the board on {self.port} within "
                                 f"{self.timeout:g} s to {what}")
        if head[0] == SYNC_RESP and len(head) < _HEADER:
            raise self._garbage(head, what, "a response cut short")
        try:
            status = Status(head[1]) if head[0] == SYNC_RESP else None
        except ValueError:
            status = None
        if status is None:
            longest = response_length(cmd, count)
            raise self._garbage(head + self._read(longest - len(head), what), what,
                                "not a response")
        frame = head + self._read(response_length(cmd, count, status) - _HEADER, what)
        if len(frame) < response_length(cmd, count, status):
            raise self._garbage(frame, what, "a response cut short")
        try:
            status, arg, words = decode_response(frame)
        except ProtocolError as e:
            raise self._garbage(frame, what, f"a bad response ({e})") from None
        if status == Status.OK and arg != count - 1 or \
                status == Status.BUS_ERROR and arg >= count:
            raise self._garbage(frame, what, f"a response to another request "
                                f"({status.name}, ARG {arg})")
        return status, arg, words

    def _garbage(self, data, what, kind):
        return TransportError(f"the board on {self.port} sent {kind} to {what}: "
                              f"{_hex(data)}")
