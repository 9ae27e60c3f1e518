"""cocotb regression of the simulation harness: TB, the Wishbone master, the bridge.

Runs against the real tile and against the stand-in (``FUSETILE_TOP=standin``,
see ``standin.py``); tests that need the stand-in's extra addresses are skipped on
the tile. Launched by ``tests/test_rtl.py`` (one simulator run for all tests).
"""

import os

import cocotb
from cocotb.task import bridge
from cocotb.simtime import get_sim_time
from cocotb.triggers import ClockCycles

from fusetile.hdl.regmap import MAGIC, GMEM_BASE, tile_memory_map
from fusetile.host.transport import BusError
from fusetile.sim.cocotb_transport import TBTransport
from fusetile.sim.tb import TB, BusTimeout, config_from_env, run_host

STANDIN = os.environ.get("FUSETILE_TOP") == "standin"


def _unmapped_addr():
    # An address between the CSR block and the plan banks: decoded by nobody on the
    # tile (answered with ERR), and outside the stand-in's few registers too.
    mm = tile_memory_map(config_from_env())
    addr = 0x8000
    assert mm.lookup(addr) is None
    return addr


@cocotb.test()
async def reset_and_id(dut):
    tb = TB(dut)
    await tb.reset()
    assert await tb.read32(0x0) == MAGIC
    assert tb.irq == 0


@cocotb.test()
async def write_read_roundtrip(dut):
    tb = TB(dut)
    await tb.reset()
    base = GMEM_BASE + 0x40
    await tb.write32(base, 0xDEADBEEF)
    await tb.write32(base + 4, 0x01234567)
    assert await tb.read32(base) == 0xDEADBEEF
    assert await tb.read32(base + 4) == 0x01234567


@cocotb.test()
async def bursts(dut):
    tb = TB(dut)
    await tb.reset()
    values = [(0x9E3779B9 * (i + 1)) & 0xFFFFFFFF for i in range(64)]
    await tb.write_burst(GMEM_BASE, values)
    assert await tb.read_burst(GMEM_BASE, len(values)) == values
    assert await tb.read_burst(GMEM_BASE + 8, 5, increment=False) == [values[2]] * 5
    await tb.write_burst(GMEM_BASE + 12, [1, 2, 3], increment=False)
    assert await tb.read_burst(GMEM_BASE + 8, 3) == [values[2], 3, values[4]]


@cocotb.test(skip=not STANDIN)
async def burst_timing(dut):
    """A burst costs two clock cycles per word (registered answer, no idle cycle)."""
    tb = TB(dut)
    await tb.reset()
    start = get_sim_time("ns")
    await tb.read_burst(GMEM_BASE, 32)
    cycles = (get_sim_time("ns") - start) / 10
    assert cycles <= 2 * 32 + 3, cycles


@cocotb.test()
async def bus_error(dut):
    tb = TB(dut)
    await tb.reset()
    addr = _unmapped_addr()
    try:
        await tb.read32(addr)
    except BusError as e:
        assert (e.addr, e.write) == (addr, False)
    else:
        assert False, "read of an unmapped address did not raise BusError"
    try:
        await tb.write32(addr, 1)
    except BusError as e:
        assert (e.addr, e.write) == (addr, True)
    else:
        assert False, "write to an unmapped address did not raise BusError"
    # The bus works on after an error.
    assert await tb.read32(0x0) == MAGIC


@cocotb.test(skip=not STANDIN)
async def bus_error_in_burst(dut):
    from standin import RAM_BASE, RAM_WORDS
    tb = TB(dut)
    await tb.reset()
    end = RAM_BASE + 4 * RAM_WORDS
    try:
        await tb.read_burst(end - 8, 4)
    except BusError as e:
        assert (e.addr, e.write) == (end, False)
    else:
        assert False, "burst past the RAM did not raise BusError"
    try:
        await tb.write32(0x0, 1)       # the stand-in's ID refuses writes
    except BusError as e:
        assert (e.addr, e.write) == (0x0, True)
    else:
        assert False, "write to ID did not raise BusError"


@cocotb.test(skip=not STANDIN)
async def byte_lanes_and_irq(dut):
    from standin import SCRATCH_ADDR
    tb = TB(dut)
    await tb.reset()
    await tb.write32(SCRATCH_ADDR, 0x11223344)
    await tb.write32(SCRATCH_ADDR, 0xAABBCCDD, sel=0b0110)
    assert await tb.read32(SCRATCH_ADDR) == 0x11BBCC44
    await tb.write32(SCRATCH_ADDR, 0x1)
    await tb.cycles(1)
    assert tb.irq == 1


@cocotb.test(skip=not STANDIN)
async def bus_timeout(dut):
    from standin import SILENT_ADDR
    tb = TB(dut, bus_timeout=20)
    await tb.reset()
    try:
        await tb.read32(SILENT_ADDR)
    except BusTimeout as e:
        assert f"{SILENT_ADDR:#010x}" in str(e)
    else:
        assert False, "an unanswered access did not time out"
    assert await tb.read32(0x0) == MAGIC


@cocotb.test()
async def concurrent_callers(dut):
    """Accesses from several coroutines are serialised by the driver's queue."""
    tb = TB(dut)
    await tb.reset()

    async def worker(k):
        for i in range(8):
            await tb.write32(GMEM_BASE + 0x100 * k + 4 * i, k << 8 | i)
        return await tb.read_burst(GMEM_BASE + 0x100 * k, 8)

    tasks = [cocotb.start_soon(worker(k)) for k in range(3)]
    for k, task in enumerate(tasks):
        assert await task == [k << 8 | i for i in range(8)]


@cocotb.test()
async def host_transport_in_process(dut):
    """Blocking host code drives the bus through bridge/resume (TBTransport)."""
    tb = TB(dut)
    await tb.reset()
    addr = _unmapped_addr()

    def host(transport):
        assert transport.read32(0x0) == MAGIC
        transport.write_burst(GMEM_BASE, list(range(16)))
        assert transport.read_burst(GMEM_BASE, 16) == list(range(16))
        transport.write32(GMEM_BASE, 77)
        assert transport.read32(GMEM_BASE) == 77
        transport.wait_cycles(10)
        try:
            transport.read32(addr)
        except BusError as e:
            assert e.addr == addr and not e.write
        else:
            raise AssertionError("no BusError")
        return "done"

    start = get_sim_time("ns")
    assert await bridge(host)(TBTransport(tb)) == "done"
    assert get_sim_time("ns") - start >= 100


def _device_available():
    try:
        import fusetile.host.device     # noqa: F401
    except ImportError:
        return False
    return True


@cocotb.test(skip=not _device_available())
async def run_host_device(dut):
    """``run_host`` hands a blocking scenario a Device over the simulated tile."""
    tb = TB(dut)
    await tb.reset()

    def scenario(device):
        assert device.transport.read32(0x0) == MAGIC
        return 42

    assert await run_host(tb, scenario) == 42
    await ClockCycles(dut.clk, 2)
