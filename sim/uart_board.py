"""A stand-in for a board with the UART register bridge, behind a pseudo-terminal.

Two parts, so that the line can later be served by the gateware bridge under Verilator
instead:

- :class:`BridgeModel`: the bridge's protocol (``docs/uart.md``) in Python. It parses
  the bytes of the line as the gateware does, one at a time, carries the requests out
  on another :class:`~fusetile.host.transport.Transport` (the golden model by default)
  and returns the responses. Time is passed in, so it is tested without threads.
- :class:`UartBoard`: a pseudo-terminal pair and a thread that feeds what the host
  writes to the slave side into a bridge and writes its answers back, with faults
  injected on request (corrupted request bytes, lost or garbled responses). Its
  :attr:`~UartBoard.port` is a serial port for ``open_transport(f"serial:{port}")``.

    >>> with UartBoard() as board:
    ...     dev = Device(open_transport(f"serial:{board.port}@3000000"))
"""

import collections
import os
import select
import threading
import time
import tty

from ..host.transport import Transport, TransportError, open_transport
from ..host.uart_protocol import (SYNC_REQ, Cmd, Status, ProtocolError, decode_request,
                                  encode_response)


__all__ = ["BridgeFrame", "BridgeModel", "UartBoard"]


_COMMANDS = frozenset(Cmd)
_FIELDS = 5                    # CMD, ADDR[3], COUNT - 1: the length is known after them


BridgeFrame = collections.namedtuple("BridgeFrame", "cmd addr count status")
BridgeFrame.__doc__ = """One frame the bridge answered: its ``cmd`` (a :class:`Cmd`, or
the int received for ``BAD_COMMAND``; ``None`` for a ``TIMEOUT`` before the CMD byte),
*word* address and word count (``None`` where the frame stopped before them), and the
:class:`Status` of the answer."""


def _check_positive(name, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{name} must be a positive number, not {value!r}")


class BridgeModel:
    """The UART register bridge's protocol, in front of a transport.

    Outside a frame, bytes other than ``SYNC_REQ`` are ignored; an unknown ``CMD`` is
    answered ``BAD_COMMAND`` at once; a frame silent for ``frame_timeout`` seconds is
    dropped and answered ``TIMEOUT``; a complete frame is carried out only if its CRC
    checks (else ``BAD_CRC``), word by word, stopping with ``BUS_ERROR`` at the first
    word the bus refuses.

    Parameters
    ----------
    backend : Transport or None
        The tile's bus. ``None``: the golden model (``open_transport("model")``), closed
        by :meth:`close`.
    config : TileConfig or None
        The golden model's configuration when ``backend`` is ``None``.
    frame_timeout : float
        Seconds of silence that drop a frame: ``FRAME_TIMEOUT_BYTES`` byte times of the
        real line, scaled up for a host and a board that are threads of one process.
    clock_hz : float or None
        The tile runs freely, as on a board: every :meth:`poll` lets it run the cycles
        due at this clock since the last one (at most ``max_step`` at a time: a model
        slower than this clock falls behind rather than stalling the line). ``None``:
        only bus accesses move the tile's clock, which keeps runs deterministic.
    max_step : int
        Most cycles the tile runs in one :meth:`poll`.

    Attributes
    ----------
    backend : Transport
    frames : list of BridgeFrame
        Every frame answered so far, in order.
    cycles : int
        Cycles the tile ran freely (not counting those of bus accesses).
    """

    def __init__(self, backend=None, *, config=None, frame_timeout=0.05, clock_hz=None,
                 max_step=1024):
        _check_positive("frame_timeout", frame_timeout)
        if clock_hz is not None:
            _check_positive("clock_hz", clock_hz)
        if not isinstance(max_step, int) or isinstance(max_step, bool) or max_step < 1:
            raise ValueError(f"max_step must be a positive integer, not {max_step!r}")
        if backend is None:
            backend = open_transport("model", **({} if config is None else {"config": config}))
            self._owned = True
        elif isinstance(backend, Transport):
            self._owned = False
        else:
            raise TypeError(f"backend must be a Transport or None, not {backend!r}")
        self.backend = backend
        self.frame_timeout = frame_timeout
        self.clock_hz = clock_hz
        self.max_step = max_step
        self.frames = []
        self.cycles = 0
        self._frame = None            # bytes after SYNC_REQ of the frame in progress
        self._last_byte = None
        self._clock_origin = None

    @property
    def deadline(self):
        """When the frame in progress times out (``time.monotonic()`` seconds), or
        ``None`` outside a frame."""
        return None if self._frame is None else self._last_byte + self.frame_timeout

    def feed(self, data, now=None):
        """Bytes from the host, received at ``now`` (``time.monotonic()`` seconds).
        Returns the responses they complete, one ``bytes`` each."""
        now = time.monotonic() if now is None else now
        responses = self.poll(now)
        for byte in bytes(data):
            response = self._take(byte)
            if response is not None:
                responses.append(response)
        if data:
            self._last_byte = now
        return responses

    def poll(self, now=None):
        """Let time pass to ``now``: a silent frame times out (its ``TIMEOUT`` response
        is returned, in a list), the tile runs if it runs freely."""
        now = time.monotonic() if now is None else now
        responses = []
        if self._frame is not None and now - self._last_byte >= self.frame_timeout:
            frame, self._frame = self._frame, None
            responses.append(self._answer(frame, Status.TIMEOUT))
        self._run_tile(now)
        return responses

    def close(self):
        if self._owned:
            self.backend.close()

    # -- the line ---------------------------------------------------------------------
    def _take(self, byte):
        """One byte of the line; returns a response or ``None``."""
        if self._frame is None:
            if byte == SYNC_REQ:
                self._frame = bytearray()
            return None
        frame = self._frame
        frame.append(byte)
        if len(frame) == 1 and byte not in _COMMANDS:
            self._frame = None
            return self._answer(frame, Status.BAD_COMMAND)
        if len(frame) < _FIELDS:
            return None
        count = frame[4] + 1
        if len(frame) < _FIELDS + (4 * count if Cmd(frame[0]).is_write else 0) + 1:
            return None
        self._frame = None
        return self._carry_out(bytes(frame))

    def _carry_out(self, frame):
        try:
            cmd, addr, count, data = decode_request(bytes([SYNC_REQ]) + frame)
        except ProtocolError:                # the length is right: only the CRC can fail
            return self._answer(frame, Status.BAD_CRC)
        step = 0 if cmd in (Cmd.READ_FIXED, Cmd.WRITE_FIXED) else 4
        words = []
        for i in range(count):
            at = 4 * addr + step * i
            try:
                if cmd.is_write:
                    self.backend.write32(at, data[i])
                else:
                    words.append(self.backend.read32(at))
            except (TransportError, ValueError):    # ERR, or no device at that address
                return self._answer(frame, Status.BUS_ERROR, i)
        return self._answer(frame, Status.OK, count - 1, words)

    def _answer(self, frame, status, arg=0, words=()):
        cmd = addr = count = None
        if frame:
            cmd = Cmd(frame[0]) if frame[0] in _COMMANDS else frame[0]
        if len(frame) >= _FIELDS:
            addr, count = int.from_bytes(frame[1:4], "little"), frame[4] + 1
        self.frames.append(BridgeFrame(cmd, addr, count, status))
        return encode_response(status, arg, words)

    # -- the tile's own clock --------------------------------------------------------------
    def _run_tile(self, now):
        if self.clock_hz is None:
            return
        if self._clock_origin is None:
            self._clock_origin = now
        due = int((now - self._clock_origin) * self.clock_hz) - self.cycles
        if due <= 0:
            return
        step = min(due, self.max_step)
        self.backend.wait_cycles(step)
        self.cycles += step
        if due > step:                       # behind: slow the clock, do not burst
            self._clock_origin = now - self.cycles / self.clock_hz


class UartBoard:
    """A board behind a pseudo-terminal: a thread serves a bridge on its master side.

    Parameters
    ----------
    bridge : BridgeModel or None
        What answers the line: an object with ``feed(data, now)`` and ``poll(now)``
        returning lists of ``bytes`` to send (and optionally ``deadline`` and
        ``close()``). ``None``: a :class:`BridgeModel` on the golden model. The board
        closes it.
    tick : float
        Seconds between calls of ``bridge.poll`` while the line is quiet.

    Attributes
    ----------
    port : str
        The slave side's device path, e.g. ``/dev/pts/3``.
    bridge
    frames : list of BridgeFrame
        The bridge's log of frames (a :class:`BridgeModel`'s ``frames``).
    dropped, garbled : int
        Responses dropped and garbled so far.
    failure : Exception or None
        What stopped the thread, if anything (re-raised by :meth:`close`).
    """

    def __init__(self, bridge=None, *, tick=0.002):
        _check_positive("tick", tick)
        if bridge is None:
            bridge = BridgeModel()
        if not (callable(getattr(bridge, "feed", None))
                and callable(getattr(bridge, "poll", None))):
            raise TypeError(f"bridge must have feed() and poll(), not {bridge!r}")
        self.bridge = bridge
        self.tick = tick
        self.dropped = self.garbled = 0
        self.failure = None
        self._lock = threading.Lock()
        self._skip = self._corrupt = self._drop = self._garble = 0
        self._master, self._slave = os.openpty()
        # The slave stays open here, so the master never reads EIO between two hosts.
        tty.setraw(self._slave)
        os.set_blocking(self._master, False)
        self.port = os.ttyname(self._slave)
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"fusetile-uart-board {self.port}")
        self._thread.start()

    def __repr__(self):
        return f"<UartBoard {self.port}>"

    @property
    def frames(self):
        return self.bridge.frames

    # -- faults ---------------------------------------------------------------------------
    def corrupt(self, count=1, *, skip=0):
        """Invert (XOR 0xFF) ``count`` bytes from the host as they arrive, after letting
        ``skip`` bytes through (``skip=6``, ``count=1``: the CRC of a read request)."""
        with self._lock:
            self._skip, self._corrupt = skip, count

    def drop(self, count=1):
        """Do not send the next ``count`` responses (the requests are carried out)."""
        with self._lock:
            self._drop = count

    def garble(self, count=1):
        """Send the next ``count`` responses with their CRC byte inverted."""
        with self._lock:
            self._garble = count

    def _corrupted(self, data):
        with self._lock:
            if not self._corrupt:
                return data
            data = bytearray(data)
            for i in range(len(data)):
                if self._skip:
                    self._skip -= 1
                elif self._corrupt:
                    self._corrupt -= 1
                    data[i] ^= 0xFF
            return bytes(data)

    def _send(self, responses):
        for response in responses:
            with self._lock:
                if self._drop:
                    self._drop -= 1
                    self.dropped += 1
                    continue
                if self._garble:
                    self._garble -= 1
                    self.garbled += 1
                    response = response[:-1] + bytes([response[-1] ^ 0xFF])
            while response:
                try:
                    response = response[os.write(self._master, response):]
                except BlockingIOError:
                    break                    # nobody reads: the host's buffer overflows

    # -- the thread -------------------------------------------------------------------------
    def _serve(self):
        looked = time.monotonic()            # when the line was last seen
        try:
            while not self._stop.is_set():
                timeout = self.tick
                deadline = getattr(self.bridge, "deadline", None)
                if deadline is not None:
                    timeout = max(0.0, min(timeout, deadline - time.monotonic()))
                ready, _, _ = select.select([self._master, self._wake_r], [], [], timeout)
                now = time.monotonic()
                data = b""
                if self._master in ready:
                    try:
                        data = os.read(self._master, 4096)
                    except BlockingIOError:
                        pass
                if data:
                    # Bytes found waiting may have come at any time since the line was
                    # last seen: take them as come right then, so that this thread being
                    # descheduled mid-frame does not time the frame out.
                    self._send(self.bridge.feed(self._corrupted(data), looked))
                else:
                    self._send(self.bridge.poll(now))     # a quiet line: time passes
                looked = now
        except Exception as e:               # surfaced by close(); the host sees silence
            self.failure = e

    def close(self):
        """Stop the thread, close the pseudo-terminal and the bridge. Raises what
        stopped the thread, if it failed."""
        if self._thread is None:
            return
        self._stop.set()
        os.write(self._wake_w, b"\0")
        self._thread.join()
        self._thread = None
        for fd in (self._master, self._slave, self._wake_r, self._wake_w):
            os.close(fd)
        close = getattr(self.bridge, "close", None)
        if close is not None:
            close()
        if self.failure is not None:
            raise self.failure

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
