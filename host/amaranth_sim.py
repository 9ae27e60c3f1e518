"""The ``amaranth`` transport: the tile's RTL in Amaranth's own simulator, in-process.

No external tool is needed, which makes it the zero-install default target. The
simulator runs in a background thread; its async testbench serves the host's blocking
calls from a queue, one Wishbone classic transaction at a time. The simulated clock
only advances while the host asks it to (an access, or :meth:`wait_cycles`), so runs
are deterministic.
"""

import queue
import threading

from amaranth.hdl import Cat
from amaranth.sim import Simulator

from ..kernels.config import TileConfig
from ..hdl.regmap import tile_memory_map
from .transport import Transport, TransportError, register_transport


__all__ = ["AmaranthTransport"]


_STOP = object()


class _Answer(Exception):
    """An error to hand back to the caller; the simulation goes on."""

    def __init__(self, error):
        self.error = error


@register_transport("amaranth")
class AmaranthTransport(Transport):
    """Run a tile in Amaranth's simulator and talk to its bus.

    Parameters
    ----------
    config : TileConfig
        Configuration of the tile to build (ignored for elaboration when ``top`` is
        given, but still used to name regions in bus error messages).
    top : wiring.Component or None
        The design to simulate; by default ``fusetile.hdl.tile.Tile(config)``. It must
        have the tile's ports: ``bus`` (a Wishbone slave) and ``irq``, and use the
        ``sync`` clock domain.
    vcd : str or None
        Write a waveform of the whole session to this file (closed by :meth:`close`).
    bus_timeout : int
        Cycles to wait for ACK/ERR before an access fails with :exc:`TransportError`.

    Attributes
    ----------
    config : TileConfig
    top : wiring.Component
    cycles : int
        Clock cycles simulated so far.

    Raises
    ------
    TransportError
        If the tile cannot be built or the simulator stops.
    """

    def __init__(self, config=None, *, top=None, vcd=None, bus_timeout=64):
        if config is None:
            config = TileConfig()
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        if not isinstance(bus_timeout, int) or bus_timeout < 1:
            raise ValueError(f"bus_timeout must be a positive integer, not {bus_timeout!r}")
        if top is None:
            try:
                from ..hdl.tile import Tile
            except ImportError as e:
                raise TransportError(f"The tile RTL is not available: {e}") from e
            top = Tile(config)
        if not (hasattr(top, "bus") and hasattr(top, "irq")):
            raise TypeError(f"top must be a component with `bus` and `irq` ports, not {top!r}")
        super().__init__(addr_width=len(top.bus.adr) + 2, memory_map=tile_memory_map(config))
        self.config = config
        self.top = top
        self.cycles = 0
        self._bus_timeout = bus_timeout
        self._requests = queue.SimpleQueue()
        self._replies = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._failure = None

        bus = top.bus
        self._request = Cat(bus.adr, bus.we, bus.dat_w, bus.sel, bus.cyc, bus.stb)
        self._we_shift = len(bus.adr)
        self._dat_shift = self._we_shift + 1
        sel_shift = self._dat_shift + len(bus.dat_w)
        all_lanes = (1 << len(bus.sel)) - 1
        self._request_const = all_lanes << sel_shift | 0b11 << (sel_shift + len(bus.sel))
        self._idle = Cat(bus.cyc, bus.stb)
        self._answer = Cat(bus.ack, bus.err)
        self._dat_r = bus.dat_r

        self._sim = Simulator(top)
        self._sim.add_clock(1e-8)
        self._sim.add_testbench(self._testbench)
        self._thread = threading.Thread(target=self._run, args=(vcd,), daemon=True,
                                        name="fusetile-amaranth-sim")
        self._thread.start()

    # -- simulator thread -------------------------------------------------------------
    def _run(self, vcd):
        try:
            if vcd is not None:
                with self._sim.write_vcd(vcd):
                    self._sim.run()
            else:
                self._sim.run()
        except BaseException as e:
            error = TransportError(f"The Amaranth simulator stopped: {type(e).__name__}: {e}")
            error.__cause__ = e
            self._failure = error
            self._replies.put((False, error))

    async def _testbench(self, ctx):
        while True:
            request = self._requests.get()
            if request is _STOP:
                return
            op, args = request
            try:
                result = await getattr(self, f"_tb_{op}")(ctx, *args)
            except _Answer as answer:
                self._replies.put((False, answer.error))
            else:
                self._replies.put((True, result))

    async def _tick(self, ctx, n=1):
        await ctx.tick().repeat(n)
        self.cycles += n

    async def _access(self, ctx, addr, we, data, last=True):
        """One Wishbone classic access. Within a burst (``last=False``) the next request
        is presented in the cycle ACK is high, which the slave ignores (see
        :mod:`fusetile.hdl.wishbone`): two cycles and one settle of the design per word."""
        # Every ctx.set settles the whole design: drive all request signals in one.
        ctx.set(self._request, (addr >> 2) | we << self._we_shift | data << self._dat_shift
                | self._request_const)
        for _ in range(self._bus_timeout + 1):
            await self._tick(ctx)
            answer = ctx.get(self._answer)
            if answer:
                value = ctx.get(self._dat_r)
                if answer & 2:
                    await self._release(ctx)
                    raise _Answer(self._bus_error(addr, bool(we)))
                if last:
                    await self._release(ctx)
                return value
        await self._release(ctx)
        kind = "write to" if we else "read from"
        raise _Answer(TransportError(f"bus timeout: no ACK or ERR for a {kind} {addr:#010x} "
                                     f"within {self._bus_timeout} cycles"))

    async def _release(self, ctx):
        ctx.set(self._idle, 0)
        await self._tick(ctx)

    async def _tb_read(self, ctx, addr, count, step):
        return [await self._access(ctx, addr + step * i, 0, 0, i == count - 1)
                for i in range(count)]

    async def _tb_write(self, ctx, addr, values, step):
        for i, value in enumerate(values):
            await self._access(ctx, addr + step * i, 1, value, i == len(values) - 1)

    async def _tb_wait(self, ctx, n):
        if n:
            await self._tick(ctx, n)

    async def _tb_irq(self, ctx):
        return int(ctx.get(self.top.irq))

    # -- host side --------------------------------------------------------------------
    def _call(self, op, *args):
        with self._lock:
            self._check_open()
            if self._failure is not None:
                raise self._failure
            self._requests.put((op, args))
            while True:
                try:
                    ok, value = self._replies.get(timeout=1.0)
                    break
                except queue.Empty:
                    if not self._thread.is_alive():
                        raise self._failure or TransportError("The Amaranth simulator stopped")
            if not ok:
                raise value
            return value

    def _read32(self, addr):
        return self._call("read", addr, 1, 4)[0]

    def _write32(self, addr, value):
        self._call("write", addr, [value], 4)

    def _read_burst(self, addr, count, increment):
        return self._call("read", addr, count, 4 if increment else 0)

    def _write_burst(self, addr, values, increment):
        self._call("write", addr, values, 4 if increment else 0)

    def wait_cycles(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"Cycle count must be a non-negative integer, not {n!r}")
        self._call("wait", n)

    def irq(self):
        """The level of the tile's ``irq`` output (0 or 1)."""
        return self._call("irq")

    def close(self):
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._thread.is_alive():
                self._requests.put(_STOP)
                self._thread.join(timeout=30)
