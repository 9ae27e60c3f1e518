"""The UART (``hdl/uart.py``) and the UART <-> Wishbone register bridge
(``hdl/uart_bridge.py``), bit-serially on their pins, against ``host/uart_protocol``.

The bridge runs with a divisor of 4 (40 cycles a byte) so that the 64-word bursts stay
fast in ``amaranth.sim``. Its bus goes to :class:`Target`, a Python Wishbone slave with
a RAM, an ERR window, a window that never answers and a FIFO-like register.
"""

import random

import pytest
from amaranth.back import verilog
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.sim import Simulator

from fusetile.hdl.uart import UartRx, UartTx
from fusetile.hdl.uart_bridge import UartBridge, crc8_next
from fusetile.host.uart_protocol import (SYNC_REQ, SYNC_RESP, MAX_WORDS,
                                         FRAME_TIMEOUT_BYTES, Cmd, Status, crc8,
                                         encode_request, decode_response,
                                         response_length)

from wb_helpers import raises_in_constructor


DIV = 4
AW = 10                     # the bridge's bus: 1024 words

# The target's address map (word addresses).
ERR_LO, ERR_HI = 0x100, 0x140        # answers ERR
SILENT_LO, SILENT_HI = 0x1C0, 0x200  # never answers
FIFO = 0x180                         # reads pop a counter, writes push a list
# Everything else is RAM.


# -- line helpers ------------------------------------------------------------------------

def _bits(byte, stop=1):
    return [0] + [byte >> i & 1 for i in range(8)] + [stop]


async def send_line(ctx, pin, data, divisor=DIV, *, stop=1):
    """Drive ``data`` on ``pin``, 8N1, ``divisor`` cycles a bit, back to back."""
    for byte in data:
        for bit in _bits(byte, stop):
            ctx.set(pin, bit)
            await ctx.tick().repeat(divisor)
    ctx.set(pin, 1)


class LineMonitor:
    """Decodes a UART line into :attr:`bytes` (mid-bit sampling after each falling
    edge); a byte with a low stop bit counts in :attr:`frame_errors`."""

    def __init__(self, pin, divisor=DIV):
        self.pin = pin
        self.divisor = divisor
        self.bytes = bytearray()
        self.frame_errors = 0

    async def run(self, ctx):
        # Plain ticks, not ``tick().repeat()``: this testbench is still waiting when the
        # simulation ends, and a ``repeat`` closed then warns.
        async def ticks(n):
            for _ in range(n):
                await ctx.tick()

        d = self.divisor
        while True:
            await ctx.negedge(self.pin)
            await ticks(d // 2)
            if ctx.get(self.pin):
                continue
            value = 0
            for i in range(8):
                await ticks(d)
                value |= ctx.get(self.pin) << i
            await ticks(d)
            if ctx.get(self.pin):
                self.bytes.append(value)
            else:
                self.frame_errors += 1

    async def take(self, ctx, n, *, within):
        """The next ``n`` bytes, which must all have come within ``within`` cycles."""
        step = 5 * self.divisor
        waited = 0
        while len(self.bytes) < n:
            if waited >= within:
                raise TimeoutError(f"{len(self.bytes)} of {n} bytes within {within} "
                                   f"cycles: {bytes(self.bytes).hex()}")
            await ctx.tick().repeat(step)
            waited += step
        out = bytes(self.bytes[:n])
        del self.bytes[:n]
        return out


# -- the bus target ----------------------------------------------------------------------

class Target:
    """A Wishbone slave in Python, registered like a block RAM: an access seen at a clock
    edge is answered (ack or err, for one cycle) from the next one."""

    def __init__(self, bus):
        self.bus = bus
        self.ram = {}
        self.log = []               # (we, adr, dat_w or None) of every access seen
        self.fifo_pops = 0
        self.fifo_writes = []

    def fifo_value(self, n):
        return (0xF1F00000 + n * 0x1111) & 0xFFFFFFFF

    async def run(self, ctx):
        bus = self.bus
        answered = False        # the target answers in this cycle
        in_access = False       # an access is on the bus and was seen (logged)
        async for _, _, cyc, stb, we, adr, dat_w, sel in ctx.tick().sample(
                bus.cyc, bus.stb, bus.we, bus.adr, bus.dat_w, bus.sel):
            ack = err = False
            if answered or not (cyc and stb):
                in_access = False   # the initiator took the answer at this edge
            elif not in_access:
                in_access = True
                assert sel == 0xF
                self.log.append((we, adr, dat_w if we else None))
                if ERR_LO <= adr < ERR_HI:
                    err = True
                elif SILENT_LO <= adr < SILENT_HI:
                    pass
                elif adr == FIFO:
                    ack = True
                    if we:
                        self.fifo_writes.append(dat_w)
                    else:
                        ctx.set(bus.dat_r, self.fifo_value(self.fifo_pops))
                        self.fifo_pops += 1
                else:
                    ack = True
                    if we:
                        self.ram[adr] = dat_w
                    else:
                        ctx.set(bus.dat_r, self.ram.get(adr, 0))
            ctx.set(bus.ack, ack)
            ctx.set(bus.err, err)
            answered = ack or err


# -- the bridge harness ------------------------------------------------------------------

class Bridge:
    """A :class:`UartBridge` with its line monitor and bus target, simulated."""

    def __init__(self, *, timeout_cycles=256, compact=False):
        self.dut = UartBridge(DIV, addr_width=AW, timeout_cycles=timeout_cycles,
                              compact=compact)
        self.mon = LineMonitor(self.dut.tx)
        self.target = Target(self.dut.bus)

    async def request(self, ctx, frame, cmd, count):
        """Send ``frame`` and return the decoded response ``(status, arg, data)``."""
        await send_line(ctx, self.dut.rx, frame)
        return await self.response(ctx, cmd, count)

    async def response(self, ctx, cmd, count, *, within=None):
        within = 20 * 10 * DIV + 2 * self.dut.timeout_cycles if within is None else within
        head = await self.mon.take(ctx, 3, within=within)
        assert head[0] == SYNC_RESP
        n = response_length(cmd, count, Status(head[1]))
        rest = await self.mon.take(ctx, n - 3, within=(n + 2) * 10 * DIV)
        return decode_response(head + rest)

    async def write(self, ctx, addr, data, cmd=Cmd.WRITE):
        frame = encode_request(cmd, addr, data=data)
        return await self.request(ctx, frame, cmd, len(data))

    async def read(self, ctx, addr, count, cmd=Cmd.READ):
        return await self.request(ctx, encode_request(cmd, addr, count), cmd, count)

    async def quiet(self, ctx, cycles=30 * DIV):
        """Nothing more comes on the line, and the bus is idle."""
        await ctx.tick().repeat(cycles)
        assert not self.mon.bytes and not self.mon.frame_errors
        assert not ctx.get(self.dut.bus.cyc) and not ctx.get(self.dut.bus.stb)

    def run(self, bench):
        sim = Simulator(self.dut)
        sim.add_clock(1e-6)
        sim.add_process(self.target.run)
        sim.add_testbench(self.mon.run, background=True)

        async def main(ctx):
            await ctx.tick().repeat(4)
            await bench(ctx)
            await self.quiet(ctx)

        sim.add_testbench(main)
        sim.run()


def words(n, seed):
    rng = random.Random(seed)
    return [rng.getrandbits(32) for _ in range(n)]


# -- UartTx / UartRx ---------------------------------------------------------------------

class Loopback(Elaboratable):
    def __init__(self, divisor, compact=False):
        self.tx = UartTx(divisor)
        self.rx = UartRx(divisor, compact=compact)

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx = self.tx
        m.submodules.rx = self.rx
        m.d.comb += self.rx.rx.eq(self.tx.tx)
        return m


@pytest.mark.parametrize("compact", [False, True], ids=["deep", "compact"])
@pytest.mark.parametrize("divisor", [4, 7])
def test_loopback_all_bytes(divisor, compact):
    dut = Loopback(divisor, compact)
    got = []
    values = list(range(256))

    async def consumer(ctx):
        async for _, _, valid, payload, ferr in ctx.tick().sample(
                dut.rx.data.valid, dut.rx.data.payload, dut.rx.frame_error):
            assert not ferr
            if valid:
                got.append(payload)

    async def producer(ctx):
        ctx.set(dut.tx.data.valid, 1)
        for value in values:
            ctx.set(dut.tx.data.payload, value)
            await ctx.tick().until(dut.tx.data.ready)
        ctx.set(dut.tx.data.valid, 0)
        await ctx.tick().repeat(12 * divisor)
        assert got == values

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(consumer)
    sim.add_testbench(producer)
    sim.run()


def test_tx_waveform():
    """Each bit exactly ``divisor`` cycles, LSB first, back-to-back bytes with no gap."""
    divisor = 5
    dut = UartTx(divisor)
    data = [0x35, 0xCA]

    async def bench(ctx):
        assert ctx.get(dut.tx) == 1 and ctx.get(dut.data.ready)
        line = []           # tx after each clock edge
        ctx.set(dut.data.valid, 1)
        for value in data:
            ctx.set(dut.data.payload, value)
            while True:
                taken = ctx.get(dut.data.ready)
                await ctx.tick()
                line.append(ctx.get(dut.tx))
                if taken:
                    break
        ctx.set(dut.data.valid, 0)
        for _ in range(10 * divisor + 2):
            await ctx.tick()
            line.append(ctx.get(dut.tx))
        # The start bit from the edge that took the first byte.
        expect = [b for v in data for b in _bits(v) for _ in range(divisor)]
        expect += [1] * (len(line) - len(expect))
        assert line == expect

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("compact", [False, True], ids=["deep", "compact"])
def test_rx_framing_error_and_glitch(compact):
    divisor = 4
    dut = UartRx(divisor, compact=compact)
    got, errors = [], []

    async def consumer(ctx):
        async for _, _, valid, payload, ferr in ctx.tick().sample(
                dut.data.valid, dut.data.payload, dut.frame_error):
            if valid:
                got.append(payload)
            if ferr:
                errors.append(len(got))

    async def bench(ctx):
        await ctx.tick().repeat(8)
        await send_line(ctx, dut.rx, [0x81])
        await send_line(ctx, dut.rx, [0x5A], stop=0)      # dropped, framing error
        await ctx.tick().repeat(2 * divisor)
        await send_line(ctx, dut.rx, [0x3C])
        # A one-cycle low glitch is not a start bit.
        ctx.set(dut.rx, 0)
        await ctx.tick()
        ctx.set(dut.rx, 1)
        await ctx.tick().repeat(12 * divisor)
        await send_line(ctx, dut.rx, [0xF0])
        # A break (line held low) is one framing error, not a stream of zeros.
        ctx.set(dut.rx, 0)
        await ctx.tick().repeat(40 * divisor)
        ctx.set(dut.rx, 1)
        await ctx.tick().repeat(4 * divisor)
        await send_line(ctx, dut.rx, [0x00])
        await ctx.tick().repeat(4 * divisor)
        assert got == [0x81, 0x3C, 0xF0, 0x00]
        assert errors == [1, 3]

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(consumer)
    sim.add_testbench(bench)
    sim.run()


def test_uart_parameters():
    raises_in_constructor(ValueError, "at least 4", UartRx, 3)
    raises_in_constructor(TypeError, "integer", UartRx, 4.0)
    raises_in_constructor(ValueError, "at least 1", UartTx, 0)
    raises_in_constructor(ValueError, "at least 4", UartBridge, 3, addr_width=8)
    raises_in_constructor(TypeError, "addr_width", UartBridge, 4, addr_width=None)
    raises_in_constructor(ValueError, "timeout_cycles", UartBridge, 4, addr_width=8,
                          timeout_cycles=0)


def test_crc8_next_matches_protocol():
    crc, byte, out = Signal(8), Signal(8), Signal(8)
    m = Module()
    m.d.comb += out.eq(crc8_next(crc, byte))

    async def bench(ctx):
        rng = random.Random(1)
        for _ in range(300):
            c, b = rng.getrandbits(8), rng.getrandbits(8)
            ctx.set(crc, c)
            ctx.set(byte, b)
            assert ctx.get(out) == crc8([b], c)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


# -- the bridge --------------------------------------------------------------------------

#: The bridge's tests run on both builds: built for area, the bridge keeps its words in
#: the burst buffers alone (a write's bytes in their lanes, a read's word written at its
#: ack, both sent from the read ports), times the frame's silence and the bus's wait with
#: one counter and parses with fewer registers, to the same cycles on the line and bus.
BUILDS = pytest.mark.parametrize("compact", [False, True], ids=["deep", "compact"])


@BUILDS
def test_single_write_then_read(compact):
    h = Bridge(compact=compact)

    async def bench(ctx):
        assert await h.write(ctx, 0x2A, [0xDEADBEEF]) == (Status.OK, 0, [])
        assert h.target.ram == {0x2A: 0xDEADBEEF}
        assert await h.read(ctx, 0x2A, 1) == (Status.OK, 0, [0xDEADBEEF])
        assert h.target.log == [(1, 0x2A, 0xDEADBEEF), (0, 0x2A, None)]

    h.run(bench)


@BUILDS
def test_full_bursts(compact):
    h = Bridge(compact=compact)
    data = words(MAX_WORDS, seed=2)
    base = 0x300

    async def bench(ctx):
        assert await h.write(ctx, base, data) == (Status.OK, MAX_WORDS - 1, [])
        assert [h.target.ram[base + i] for i in range(MAX_WORDS)] == data
        assert await h.read(ctx, base, MAX_WORDS) == (Status.OK, MAX_WORDS - 1, data)
        assert [a for _, a, _ in h.target.log] == list(range(base, base + MAX_WORDS)) * 2
        # A shorter burst after a longer one.
        assert await h.read(ctx, base + 5, 3) == (Status.OK, 2, data[5:8])

    h.run(bench)


@BUILDS
def test_fixed_commands_hit_one_address(compact):
    h = Bridge(compact=compact)
    data = words(5, seed=3)

    async def bench(ctx):
        assert await h.write(ctx, FIFO, data, Cmd.WRITE_FIXED) == (Status.OK, 4, [])
        assert h.target.fifo_writes == data
        status, arg, got = await h.read(ctx, FIFO, 6, Cmd.READ_FIXED)
        assert (status, arg) == (Status.OK, 5)
        assert got == [h.target.fifo_value(n) for n in range(6)]
        assert [(we, a) for we, a, _ in h.target.log] == [(1, FIFO)] * 5 + [(0, FIFO)] * 6
        assert h.target.ram == {}

    h.run(bench)


@BUILDS
def test_bad_crc_does_nothing(compact):
    h = Bridge(compact=compact)

    async def bench(ctx):
        assert await h.write(ctx, 0x10, [1, 2]) == (Status.OK, 1, [])
        log = list(h.target.log)
        frame = bytearray(encode_request(Cmd.WRITE, 0x10, data=[7, 8]))
        frame[-1] ^= 0x40                                   # the CRC
        assert await h.request(ctx, frame, Cmd.WRITE, 2) == (Status.BAD_CRC, 0, [])
        frame = bytearray(encode_request(Cmd.WRITE, 0x10, data=[7, 8]))
        frame[7] ^= 0x01                                    # a data byte
        assert await h.request(ctx, frame, Cmd.WRITE, 2) == (Status.BAD_CRC, 0, [])
        frame = bytearray(encode_request(Cmd.READ, 0x10, 2))
        frame[2] ^= 0x01                                    # an address byte
        assert await h.request(ctx, frame, Cmd.READ, 2) == (Status.BAD_CRC, 0, [])
        assert h.target.log == log                          # no access at all
        assert h.target.ram == {0x10: 1, 0x11: 2}
        assert await h.read(ctx, 0x10, 2) == (Status.OK, 1, [1, 2])

    h.run(bench)


@BUILDS
def test_bad_command_answered_at_once(compact):
    h = Bridge(compact=compact)

    async def bench(ctx):
        # Only SYNC and CMD: the answer comes without the rest of the frame.
        await send_line(ctx, h.dut.rx, [SYNC_REQ, 0x03])
        assert await h.response(ctx, Cmd.WRITE, 1) == (Status.BAD_COMMAND, 0, [])
        # A whole frame with a bad command (its tail has no SYNC_REQ): one answer.
        body = bytes([0x21, 0x10, 0, 0, 0])
        await send_line(ctx, h.dut.rx, bytes([SYNC_REQ]) + body + bytes([crc8(body)]))
        assert await h.response(ctx, Cmd.WRITE, 1) == (Status.BAD_COMMAND, 0, [])
        await h.quiet(ctx, FRAME_TIMEOUT_BYTES * 10 * DIV + 100)
        assert await h.write(ctx, 0x20, [0x12345678]) == (Status.OK, 0, [])
        assert await h.read(ctx, 0x20, 1) == (Status.OK, 0, [0x12345678])
        assert h.target.log == [(1, 0x20, 0x12345678), (0, 0x20, None)]

    h.run(bench)


@BUILDS
def test_count_beyond_max_words_refused(compact):
    """COUNT - 1 >= MAX_WORDS cannot come from a host; the bridge refuses it at once
    with BAD_COMMAND rather than truncating it."""
    h = Bridge(compact=compact)

    async def bench(ctx):
        body = bytes([Cmd.READ, 0x10, 0, 0, MAX_WORDS])
        await send_line(ctx, h.dut.rx, bytes([SYNC_REQ]) + body + bytes([crc8(body)]))
        assert await h.response(ctx, Cmd.READ, 1) == (Status.BAD_COMMAND, 0, [])
        await h.quiet(ctx)
        assert h.target.log == []
        assert await h.read(ctx, 0x10, 1) == (Status.OK, 0, [0])

    h.run(bench)


@BUILDS
def test_garbage_before_sync_ignored(compact):
    h = Bridge(compact=compact)

    async def bench(ctx):
        frame = bytes([0x00, 0xFF, SYNC_RESP, 0x13, 0x02]) + encode_request(
            Cmd.WRITE, 0x33, data=[0xCAFEF00D])
        assert await h.request(ctx, frame, Cmd.WRITE, 1) == (Status.OK, 0, [])
        assert h.target.ram == {0x33: 0xCAFEF00D}

    h.run(bench)


@BUILDS
def test_truncated_frame_times_out(compact):
    h = Bridge(compact=compact)
    limit = FRAME_TIMEOUT_BYTES * 10 * DIV
    assert h.dut.frame_timeout_cycles == limit

    async def bench(ctx):
        frame = encode_request(Cmd.WRITE, 0x40, data=[1, 2, 3])
        await send_line(ctx, h.dut.rx, frame[:9])           # stops in the data
        # Not a bit sent before the frame timeout (the last byte was taken at the
        # middle of its stop bit, half a bit and the synchroniser before this) ...
        for _ in range(limit - 4):
            assert ctx.get(h.dut.tx)
            await ctx.tick()
        assert not h.mon.bytes
        # ... then TIMEOUT, and nothing written.
        assert await h.response(ctx, Cmd.WRITE, 3, within=20 + 4 * 10 * DIV) == \
            (Status.TIMEOUT, 0, [])
        assert h.target.log == []
        # Stopped right after SYNC.
        await send_line(ctx, h.dut.rx, [SYNC_REQ])
        assert await h.response(ctx, Cmd.WRITE, 3, within=limit + 5 * 10 * DIV) == \
            (Status.TIMEOUT, 0, [])
        assert await h.write(ctx, 0x40, [1, 2, 3]) == (Status.OK, 2, [])
        assert await h.read(ctx, 0x40, 3) == (Status.OK, 2, [1, 2, 3])

    h.run(bench)


@BUILDS
def test_err_mid_burst(compact):
    h = Bridge(compact=compact)
    data = words(4, seed=4)

    async def bench(ctx):
        # Words ERR_LO - 2, ERR_LO - 1 are RAM; ERR_LO refuses.
        assert await h.write(ctx, ERR_LO - 2, data) == (Status.BUS_ERROR, 2, [])
        assert h.target.ram == {ERR_LO - 2: data[0], ERR_LO - 1: data[1]}
        assert [a for _, a, _ in h.target.log] == [ERR_LO - 2, ERR_LO - 1, ERR_LO]
        # A read that fails sends no data.
        assert await h.read(ctx, ERR_LO - 1, 3) == (Status.BUS_ERROR, 1, [])
        assert await h.read(ctx, ERR_LO + 3, 1, Cmd.READ_FIXED) == \
            (Status.BUS_ERROR, 0, [])
        assert await h.read(ctx, ERR_LO - 2, 2) == (Status.OK, 1, data[:2])

    h.run(bench)


@BUILDS
def test_no_answer_is_bus_error(compact):
    h = Bridge(timeout_cycles=256, compact=compact)

    async def bench(ctx):
        assert await h.read(ctx, SILENT_LO, 1) == (Status.BUS_ERROR, 0, [])
        assert not ctx.get(h.dut.bus.cyc)
        assert await h.write(ctx, SILENT_LO - 1, [5, 6, 7]) == (Status.BUS_ERROR, 1, [])
        assert h.target.ram == {SILENT_LO - 1: 5}
        assert [a for _, a, _ in h.target.log] == [SILENT_LO, SILENT_LO - 1, SILENT_LO]
        assert await h.read(ctx, SILENT_LO - 1, 1) == (Status.OK, 0, [5])

    h.run(bench)


@BUILDS
def test_bus_timeout_length(compact):
    """The access is held for exactly ``timeout_cycles`` cycles, then withdrawn."""
    h = Bridge(timeout_cycles=37, compact=compact)
    held = []

    async def bench(ctx):
        await send_line(ctx, h.dut.rx, encode_request(Cmd.READ, SILENT_LO, 1))
        n = 0
        for _ in range(20 * DIV):
            await ctx.tick()
            if ctx.get(h.dut.bus.stb):
                break
        while ctx.get(h.dut.bus.stb):
            assert ctx.get(h.dut.bus.cyc)
            n += 1
            await ctx.tick()
        held.append(n)
        assert await h.response(ctx, Cmd.READ, 1) == (Status.BUS_ERROR, 0, [])

    h.run(bench)
    assert held == [37]


@BUILDS
def test_address_beyond_bus(compact):
    h = Bridge(compact=compact)
    top = (1 << AW) - 2

    async def bench(ctx):
        assert await h.write(ctx, 1 << AW, [1]) == (Status.BUS_ERROR, 0, [])
        assert await h.read(ctx, 0xFFFFFF, 2) == (Status.BUS_ERROR, 0, [])
        assert await h.read(ctx, 0x800 | 0x10, 1, Cmd.READ_FIXED) == \
            (Status.BUS_ERROR, 0, [])
        assert h.target.log == []           # never on the bus, not aliased
        # A burst that runs off the end stops there.
        assert await h.write(ctx, top, [1, 2, 3, 4]) == (Status.BUS_ERROR, 2, [])
        assert h.target.ram == {top: 1, top + 1: 2}
        assert [a for _, a, _ in h.target.log] == [top, top + 1]
        assert h.target.ram.get(0) is None

    h.run(bench)


@BUILDS
def test_requests_back_to_back(compact):
    """The next request starts the moment the response has come: nothing is lost."""
    h = Bridge(compact=compact)

    async def bench(ctx):
        for i in range(4):
            assert await h.write(ctx, 0x50 + i, [i * 3]) == (Status.OK, 0, [])
        assert await h.read(ctx, 0x50, 4) == (Status.OK, 3, [0, 3, 6, 9])

    h.run(bench)


def test_compact_build_same_cycles():
    """Both builds put the same bits on the line and the same accesses on the bus, in
    the same cycles."""
    traces = []
    for compact in (False, True):
        h = Bridge(compact=compact)
        trace = []

        async def watch(ctx, h=h, trace=trace):
            bus = h.dut.bus
            async for _, _, *values in ctx.tick().sample(h.dut.tx, bus.cyc, bus.stb,
                                                         bus.we, bus.adr, bus.dat_w):
                trace.append(tuple(values) if values[1] else (values[0],))

        async def bench(ctx, h=h):
            data = words(5, seed=7)
            await h.write(ctx, ERR_LO - 3, data)                # ends in ERR at word 3
            await h.read(ctx, ERR_LO - 3, 3)
            await h.read(ctx, FIFO, 2, Cmd.READ_FIXED)
            frame = bytearray(encode_request(Cmd.WRITE, 0x10, data=[7]))
            frame[-1] ^= 1
            await h.request(ctx, frame, Cmd.WRITE, 1)           # BAD_CRC
            await send_line(ctx, h.dut.rx, [SYNC_REQ, 0x07])    # BAD_COMMAND
            await h.response(ctx, Cmd.WRITE, 1)
            await send_line(ctx, h.dut.rx, encode_request(Cmd.READ, 0x20, 1)[:4])
            await h.response(ctx, Cmd.READ, 1, within=2 * h.dut.frame_timeout_cycles)

        sim = Simulator(h.dut)
        sim.add_clock(1e-6)
        sim.add_process(h.target.run)
        sim.add_process(watch)
        sim.add_testbench(h.mon.run, background=True)

        async def main(ctx, h=h, bench=bench):
            await ctx.tick().repeat(4)
            await bench(ctx)
            await h.quiet(ctx)

        sim.add_testbench(main)
        sim.run()
        traces.append(trace)
    assert traces[0] == traces[1]


def test_verilog():
    text = verilog.convert(UartBridge(DIV, addr_width=AW), name="uart_bridge")
    assert "module uart_bridge" in text
    for port in ("rx", "tx", "bus__cyc", "bus__adr", "bus__dat_r", "bus__err"):
        assert port in text
