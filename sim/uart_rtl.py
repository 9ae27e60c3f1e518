"""The UART register bridge and the tile as RTL, behind :class:`~fusetile.sim.uart_board.UartBoard`.

:class:`RtlBridge` has the interface ``UartBoard`` serves a line with (``feed``, ``poll``,
``deadline``, ``frames``, ``close``), but the bytes go to the gateware: the top
:func:`fusetile.sim.uart_top.uart_top` (``Tile`` + ``UartBridge``) is built with Verilator
(once, cached like every model, :func:`fusetile.sim.build.build`) and run under cocotb
in a child process. That process runs this module's cocotb test :func:`serve_uart`: it
starts the clock, resets, and serves requests from a Unix socket, each "bit-bang these
bytes onto ``rx`` at the divisor, then run until the responses expected have come out
of ``tx`` (or a cycle limit)"; a coroutine decodes ``tx`` all along. The simulator runs
only on demand, so runs are deterministic::

    >>> with UartBoard(RtlBridge(config)) as board:
    ...     dev = Device(open_transport(f"serial:{board.port}@3000000"))

The responses to expect are known on the host side: :class:`RtlBridge` follows the
request bytes with the bridge's parser (hunt for ``SYNC_REQ``, ``CMD``, ``ADDR``,
``COUNT - 1``, data, ``CRC``) and, for each frame it completes, asks for one response
of 4 bytes, plus ``4 * COUNT`` if it is an OK answer to a read. Wall-clock time does
not exist for the RTL: a frame left unfinished for ``frame_timeout`` seconds makes
:meth:`RtlBridge.poll` run the simulator for the bridge's frame timeout in cycles, so
the bridge itself answers ``TIMEOUT``.

Wire format (little-endian). Request: ``op u8, pad u24, limit u32, ndata u32,
nexpect u32``, then ``ndata`` bytes for ``rx`` and ``nexpect`` u32: for each response
to wait for, the data bytes it has if its status is OK. Reply: ``cycles u32, nbytes
u32`` then the ``nbytes`` bytes decoded from ``tx`` since the last reply. RESET
(``op`` 3, the rest 0) resets the top and answers ``cycles, 0``; SHUTDOWN (``op`` 2)
ends the test.

The simulator runs only on demand and the host's ``wait_cycles`` sleeps, so the tile's
clock moves only while bytes are on the line or a response is awaited: polling over
the bus (``wait_done``) works, a count of cycles between two host calls does not.
"""

import os
import socket
import struct
import threading
import time

import cocotb
from cocotb.clock import Clock
from cocotb.task import bridge, resume
from cocotb.triggers import ClockCycles, FallingEdge, Timer

from ..host.transport import TransportError
from ..host.uart_protocol import SYNC_REQ, MAX_WORDS, FRAME_TIMEOUT_BYTES, Cmd, Status
from ..kernels.config import TileConfig
from .process import SimulatorProcess, recv_exact
from .uart_board import BridgeFrame
from .uart_top import BUS_TIMEOUT, DIVISOR


__all__ = ["RtlBridge", "SERVER_MODULE", "serve_uart"]


#: The cocotb test module the simulator runs for an :class:`RtlBridge`.
SERVER_MODULE = __name__

OP_EXCHANGE, OP_SHUTDOWN, OP_RESET = 1, 2, 3
REQUEST = struct.Struct("<BxxxIII")
REPLY = struct.Struct("<II")
PERIOD_NS = 10
_BYTE_CYCLES = 10 * DIVISOR
_FIELDS = 5                    # CMD, ADDR[3], COUNT - 1
_COMMANDS = frozenset(Cmd)


def _split(buf, expects):
    """Complete responses at the start of ``buf`` given the OK data lengths
    ``expects``: ``(responses, bytes used)``."""
    responses, at = [], 0
    for data in expects:
        if len(buf) < at + 3:
            break
        length = 4 + (data if buf[at + 1] == Status.OK else 0)
        if len(buf) < at + length:
            break
        responses.append(bytes(buf[at:at + length]))
        at += length
    return responses, at


# -- the simulator's side ----------------------------------------------------------------

class _Line:
    """The pins of the UART top: bytes bit-banged onto ``rx``, bytes decoded from ``tx``."""

    def __init__(self, dut):
        self.dut = dut
        self.received = bytearray()
        self.framing_errors = 0

    async def decode(self):
        """Forever: decode 8N1 bytes from ``tx``, sampled mid-bit."""
        tx = self.dut.tx
        half, bit = Timer(DIVISOR // 2 * PERIOD_NS, unit="ns"), Timer(DIVISOR * PERIOD_NS, unit="ns")
        while True:
            await FallingEdge(tx)
            await half
            if int(tx.value):
                continue                     # a glitch, not a start bit
            byte = 0
            for i in range(8):
                await bit
                byte |= int(tx.value) << i
            await bit
            if not int(tx.value):
                self.framing_errors += 1
                continue
            self.received.append(byte)

    async def reset(self, cycles=4):
        """Reset the top (``rst`` high ``cycles`` cycles), idle the line, forget what
        came from ``tx``."""
        dut = self.dut
        await FallingEdge(dut.clk)
        dut.rx.value = 1
        dut.rst.value = 1
        await ClockCycles(dut.clk, cycles)
        await FallingEdge(dut.clk)
        dut.rst.value = 0
        await Timer(2 * _BYTE_CYCLES * PERIOD_NS, unit="ns")    # a byte cut short ends
        self.received.clear()
        return cycles + 2 * _BYTE_CYCLES

    async def exchange(self, data, expects, limit):
        """Send ``data`` on ``rx``, then run until ``expects`` responses have come (at
        most ``limit`` cycles more); return ``(cycles run, bytes decoded)``."""
        rx = self.dut.rx
        await FallingEdge(self.dut.clk)      # every change from here on a falling edge
        cycles = 1
        bits = []
        for byte in data:
            bits += [0] + [byte >> i & 1 for i in range(8)] + [1]
        i = 0
        while i < len(bits):
            j = i
            while j < len(bits) and bits[j] == bits[i]:
                j += 1
            rx.value = bits[i]
            await Timer((j - i) * DIVISOR * PERIOD_NS, unit="ns")
            cycles += (j - i) * DIVISOR
            i = j
        rx.value = 1
        ran = 0
        step = Timer(_BYTE_CYCLES * PERIOD_NS, unit="ns")
        while len(_split(self.received, expects)[0]) < len(expects) and ran < limit:
            await step
            ran += _BYTE_CYCLES
        out = bytes(self.received)
        self.received.clear()
        return cycles + ran, out


def _serve(line, path):
    exchange = resume(line.exchange)
    reset = resume(line.reset)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        while True:
            try:
                header = recv_exact(sock, REQUEST.size)
                if header is None:
                    return "host closed the connection"
                op, limit, ndata, nexpect = REQUEST.unpack(header)
                if op == OP_SHUTDOWN:
                    sock.sendall(REPLY.pack(0, 0))
                    return "shutdown"
                if op == OP_RESET:
                    sock.sendall(REPLY.pack(reset(), 0))
                    continue
                data = recv_exact(sock, ndata) if ndata else b""
                expects = (struct.unpack(f"<{nexpect}I", recv_exact(sock, 4 * nexpect))
                           if nexpect else ())
                cycles, out = exchange(data, list(expects), limit)
                sock.sendall(REPLY.pack(cycles, len(out)) + out)
            except OSError as e:
                return f"connection lost ({e})"


@cocotb.test()
async def serve_uart(dut):
    """Serve the UART pins of ``dut`` to the host at ``FUSETILE_SOCKET`` until it leaves."""
    Clock(dut.clk, PERIOD_NS, unit="ns").start()
    line = _Line(dut)
    cocotb.start_soon(line.decode())
    await line.reset()
    why = await bridge(_serve)(line, os.environ["FUSETILE_SOCKET"])
    dut._log.info("UART server stopped: %s (framing errors on tx: %d)", why,
                  line.framing_errors)


# -- the host's side -----------------------------------------------------------------------

class RtlBridge:
    """The gateware UART bridge and tile under cocotb, as a line for :class:`UartBoard`.

    Parameters
    ----------
    config : TileConfig, optional
        The tile's configuration (default ``TileConfig()``).
    sim : {"verilator", "icarus"}
    build_root : path-like, optional
        Where models are built (default ``build/sim`` of the checkout).
    frame_timeout : float
        Seconds a frame may stay unfinished on the host's side before :meth:`poll`
        lets the bridge time it out (running ``frame_timeout_cycles``).
    timeout : float
        Seconds to wait for the simulator's answer to one exchange.
    start_timeout : float
        Seconds the simulator may take to start and connect.

    Attributes
    ----------
    model : fusetile.sim.build.BuildResult
    frames : list of BridgeFrame
        Every frame answered so far (the status is read from the RTL's response).
    cycles : int
        Clock cycles simulated so far.
    workdir : Path
        The simulator's working directory (``sim.log``); kept if something failed.

    Raises
    ------
    TransportError
        If the simulator is missing, the model does not build or does not start.
    """

    def __init__(self, config=None, *, sim="verilator", build_root=None, frame_timeout=0.05,
                 timeout=120.0, start_timeout=120.0):
        from .build import BuildError, SimulatorMissing, build
        from .uart_top import uart_top

        config = TileConfig() if config is None else config
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        self.config = config
        self.frame_timeout = frame_timeout
        self.timeout = float(timeout)
        self.frames = []
        self.cycles = 0
        self._frame = None            # bytes after SYNC_REQ of the frame in progress
        self._last_byte = None
        self._pending = []            # frames sent whose response has not come: (frame, ok data)
        self._buffer = bytearray()    # bytes from tx not yet returned
        self._lock = threading.Lock()
        try:
            self.model = build(sim, config, top=uart_top, build_root=build_root)
        except (SimulatorMissing, BuildError, ImportError) as e:
            raise TransportError(f"The UART RTL is not available: {e}") from e
        self.sim_process = SimulatorProcess(self.model, SERVER_MODULE,
                                            name="UART RTL: the simulator",
                                            start_timeout=start_timeout)
        self._conn = self.sim_process.conn
        self._conn.settimeout(self.timeout)

    @property
    def workdir(self):
        """The simulator's working directory (its log is ``sim.log``)."""
        return self.sim_process.workdir

    def __repr__(self):
        return f"<RtlBridge {self.model.sim} pid {self.sim_process.pid}>"

    @property
    def frame_timeout_cycles(self):
        """Cycles of silence inside a frame after which the bridge drops it."""
        return FRAME_TIMEOUT_BYTES * _BYTE_CYCLES

    @property
    def deadline(self):
        """When the frame in progress is timed out (``time.monotonic()`` seconds), or
        ``None`` outside a frame."""
        return None if self._frame is None else self._last_byte + self.frame_timeout

    # -- the line ---------------------------------------------------------------------
    def feed(self, data, now=None):
        """Bytes from the host at ``now``: sent to the bridge's ``rx``; returns the
        responses they complete (the simulator runs until they have come out)."""
        now = time.monotonic() if now is None else now
        responses = self.poll(now)
        data = bytes(data)
        for byte in data:
            self._take(byte)
        if data:
            self._last_byte = now
            responses += self._exchange(data)
        return responses

    def poll(self, now=None):
        """A frame unfinished for ``frame_timeout`` seconds: run the bridge until it
        answers ``TIMEOUT`` (returned, in a list). Otherwise nothing happens: the RTL
        only runs when there is something to wait for."""
        now = time.monotonic() if now is None else now
        if self._frame is None or now - self._last_byte < self.frame_timeout:
            return []
        frame, self._frame = self._frame, None
        self._pending.append((bytes(frame), 0))
        return self._exchange(b"", extra=self.frame_timeout_cycles)

    def _take(self, byte):
        if self._frame is None:
            if byte == SYNC_REQ:
                self._frame = bytearray()
            return
        frame = self._frame
        frame.append(byte)
        if (len(frame) == 1 and byte not in _COMMANDS) or \
                (len(frame) == _FIELDS and frame[4] >= MAX_WORDS):
            self._frame = None                  # BAD_COMMAND at once
            self._pending.append((bytes(frame), 0))
            return
        if len(frame) < _FIELDS:
            return
        cmd, count = Cmd(frame[0]), frame[4] + 1
        if len(frame) < _FIELDS + (4 * count if cmd.is_write else 0) + 1:
            return
        self._frame = None
        self._pending.append((bytes(frame), 0 if cmd.is_write else 4 * count))

    def _limit(self, extra):
        """Cycles to run after the bytes: enough for every pending response."""
        cycles = extra + 8 * _BYTE_CYCLES
        for frame, data in self._pending:
            count = frame[4] + 1 if len(frame) >= _FIELDS else 1
            cycles += count * (BUS_TIMEOUT + 8) + (4 + data) * _BYTE_CYCLES
        return cycles

    def reset(self):
        """Reset the tile and the bridge (both under ``rst``); a frame in progress and
        responses not yet returned are forgotten. For a quiet line, between tests."""
        with self._lock:
            self._frame = None
            self._pending.clear()
            self._buffer.clear()
            try:
                self._conn.sendall(REQUEST.pack(OP_RESET, 0, 0, 0))
                cycles, _ = REPLY.unpack(self._recv(REPLY.size))
            except (OSError, ConnectionError) as e:
                self._fail(f"lost the simulator: {e}")
            self.cycles += cycles

    def _exchange(self, data, extra=0):
        with self._lock:
            return self._exchange_locked(data, extra)

    def _exchange_locked(self, data, extra):
        expects = [d for _, d in self._pending]
        request = (REQUEST.pack(OP_EXCHANGE, self._limit(extra), len(data), len(expects))
                   + data + struct.pack(f"<{len(expects)}I", *expects))
        try:
            self._conn.sendall(request)
            cycles, n = REPLY.unpack(self._recv(REPLY.size))
            self._buffer += self._recv(n) if n else b""
        except (OSError, ConnectionError) as e:
            self._fail(f"lost the simulator: {e}")
        self.cycles += cycles
        # The bridge's responses in order, one per frame sent; status from the RTL.
        responses, used = _split(self._buffer, expects)
        del self._buffer[:used]
        for (frame, _), response in zip(self._pending, responses):
            self.frames.append(self._record(frame, Status(response[1])
                                            if response[1] in set(Status) else response[1]))
        del self._pending[:len(responses)]
        if self._buffer and not self._pending:      # bytes no frame asked for: pass on
            responses.append(bytes(self._buffer))
            self._buffer.clear()
        return responses

    @staticmethod
    def _record(frame, status):
        cmd = addr = count = None
        if frame:
            cmd = Cmd(frame[0]) if frame[0] in _COMMANDS else frame[0]
        if len(frame) >= _FIELDS:
            addr, count = int.from_bytes(frame[1:4], "little"), frame[4] + 1
        return BridgeFrame(cmd, addr, count, status)

    def _recv(self, n):
        data = recv_exact(self._conn, n)
        if data is None:
            raise ConnectionError("the simulator closed the connection")
        return data

    # -- the process --------------------------------------------------------------------
    def _fail(self, message):
        self.sim_process.fail(f"UART RTL: {message}")

    @property
    def alive(self):
        """Whether the simulator process is running."""
        return self.sim_process.alive

    def close(self):
        """Stop the simulator (its cocotb test ends) and wait for it."""
        self.sim_process.shutdown(REQUEST.pack(OP_SHUTDOWN, 0, 0, 0), REPLY.size)
