"""The spine's scenarios on the RTL in Amaranth's simulator (no external tools).

The same scenarios run under cocotb on Icarus and Verilator in ``tests/test_rtl.py``.
"""

from dataclasses import replace

import pytest

from fusetile.hdl.regmap import DEBUG_COUNTERS, tile_memory_map
from fusetile.host import open_transport
from fusetile.host.device import Device, TileFault
from fusetile.host.transport import BusError
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import FaultCause
from fusetile.kernels.program import call, dma_load, done, mark, ret

from scenarios import SCENARIOS


# Small memories keep elaboration and simulation quick; the logic is the same.
CONFIG = TileConfig(gmem_bytes=4096, spad_bank_words=128, trace_depth=8)


@pytest.fixture
def dev():
    with open_transport("amaranth", config=CONFIG) as transport:
        yield Device(transport)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_scenario(dev, scenario):
    scenario(dev)


#: The scenarios that see what the units built for area (``compact``) do differently:
#: the instruction stores' host reads, the counters' read path, the trace records'
#: counts (against SLOT_CYCLES and the busy counters) and the vector unit.
COMPACT_SCENARIOS = ("gmem_round_trip", "dma_kernel", "bank_swap_is_atomic",
                     "counters_freeze_and_clear", "trace_fifo", "matmul_requant")


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.__name__ in COMPACT_SCENARIOS],
                         ids=lambda s: s.__name__)
def test_compact_scenario(scenario):
    config = replace(CONFIG, compact=True)
    with open_transport("amaranth", config=config) as transport:
        scenario(Device(transport))


#: The scenarios that see a tile without a trace FIFO, speculation, VCMP and VARGMAX,
#: an averaging VPOOL, VADD, VPOOL and VCLAMP, a DMA queue, slot version tags and a
#: watchdog (the iCEBreaker's): the TRACE registers' bus errors, the counters that go on
#: without it (CYCLES among the others in the counters' RAM), the calls that push no
#: record, ASSUME and COMMIT illegal, the DMA's stores straight into GMEM, its commands
#: straight into the engine, the instructions not built illegal and the flags and index
#: registers 0, WATCHDOG's bus errors and the host's abort stopping a long plan.
LEFT_OUT_SCENARIOS = ("dma_kernel", "partition_fault", "counters_freeze_and_clear",
                      "trace_fifo", "matmul_requant", "branch_jump_switch",
                      "speculation_hit_publishes", "vector_flags_steer_the_plan",
                      "watchdog", "abort")


@pytest.mark.parametrize("compact", [False, True], ids=["deep", "compact"])
@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.__name__ in LEFT_OUT_SCENARIOS],
                         ids=lambda s: s.__name__)
def test_scenario_with_parts_left_out(scenario, compact):
    config = replace(CONFIG, trace_depth=0, staging_words=0, decisions=False,
                     pool_average=False, dma_queue=0, slot_versions=False, word_ops=False,
                     watchdog=False, compact=compact)
    with open_transport("amaranth", config=config) as transport:
        dev = Device(transport)
        assert dev.config == config and not dev.config.traced and not dev.config.speculates
        scenario(dev)


@pytest.mark.parametrize("target", ["model", "amaranth"])
def test_a_tile_with_one_partition(target):
    """A tile with one partition (the iCEBreaker's) has it fixed, the whole scratchpad,
    with no table entry: PART[0]'s address answers a bus error, set_partition takes
    that layout alone, and from reset a load that ends at the scratchpad's last word
    runs and one a word further faults at the first word past it."""
    config = replace(CONFIG, partitions=1)
    words = config.spad_words
    with open_transport(target, config=config) as transport:
        dev = Device(transport)
        assert dev.config == config and "PART[0]" not in dev.regs
        part_0 = tile_memory_map(replace(config, partitions=2))["PART[0]"].addr
        with pytest.raises(BusError):
            transport.write32(part_0, 16 << 16)
        with pytest.raises(BusError):
            transport.read32(part_0)
        with pytest.raises(ValueError, match=f"this tile has one partition, the whole "
                                             f"scratchpad \\(base 0, length {words}\\), "
                                             f"not base 0, length 16"):
            dev.set_partition(0, base=0, length=16)
        dev.set_partition(0, base=0, length=words)
        dev.load_kernel(0, [dma_load(gmem=0, spad=words - 8, rows=1, cols=8), ret()], part=0)
        dev.load_kernel(1, [dma_load(gmem=0, spad=words - 7, rows=1, cols=8), ret()], part=0)
        dev.load_plan([call(0), done()])
        dev.start()
        dev.wait_done(timeout_cycles=2_000, poll_cycles=16)
        dev.load_plan([call(1), done()])
        dev.start()
        with pytest.raises(TileFault) as info:
            dev.wait_done(timeout_cycles=2_000, poll_cycles=16)
        assert (info.value.cause, info.value.part, info.value.addr) == \
            (FaultCause.PARTITION, 0, words)


def _marked_run(dev):
    """Run a plan with MARKs between its calls on ``dev``, with a host write refused
    while it runs; return the bank it ran from and the run's counters."""
    dev.set_partition(0, base=0, length=64)
    # A slow kernel, so the plan is still running when the host writes.
    dev.load_kernel(0, [dma_load(gmem=0, spad=0, rows=1, cols=64), ret()], part=0)
    bank = dev.load_plan([call(0), mark(5), call(0), mark(6), done()])
    dev.clear_counters()
    dev.start()
    assert int(dev.status().running)
    active = dev.memory_map[f"PLAN[{bank}]"].addr
    with pytest.raises(BusError) as refused:
        dev.transport.write32(active, 0)
    assert refused.value.write and refused.value.addr == active
    assert int(dev.wait_done(timeout_cycles=20_000, poll_cycles=16).done)
    return bank, dev.counters()


@pytest.mark.parametrize("target", ["model", "amaranth"])
def test_a_tile_without_debug_regs(target):
    """A tile without the debugging registers (the iCEBreaker's) has no MARK and no
    REFUSED_ADDR: their addresses answer a bus error both ways; MARK runs as a NOP, in
    the cycles it takes where it writes the register, and a refused host write still
    answers its error."""
    config = replace(CONFIG, debug_regs=False)
    with_them = replace(config, debug_regs=True)
    with open_transport(target, config=config) as transport:
        dev = Device(transport)
        assert dev.config == config
        for name in ("MARK", "REFUSED_ADDR"):
            assert name not in dev.regs
            # (where the register is on a tile that has it)
            addr = tile_memory_map(with_them)[name].addr
            with pytest.raises(BusError):
                dev.transport.read32(addr)
            with pytest.raises(BusError):
                dev.transport.write32(addr, 0)
        _, run = _marked_run(dev)
        for name in DEBUG_COUNTERS:
            assert name.upper() not in dev.regs and name not in run
    assert run["kernel_calls"] == 2 and run["inferences"] == 1

    with open_transport(target, config=with_them) as transport:
        dev = Device(transport)
        bank, run_with_them = _marked_run(dev)
        assert int(dev.regs.MARK.read().value) == 6
        assert int(dev.regs.REFUSED_ADDR.read().addr) == dev.memory_map[f"PLAN[{bank}]"].addr
    assert (run_with_them["plan_retired"], run_with_them["refused_writes"]) == (5, 1)
    # (CYCLES, since the clear, counts the host's accesses too: the comparison is of
    # what the plan did.)
    assert {name: value for name, value in run.items() if name != "cycles"} == \
        {name: value for name, value in run_with_them.items() if name in run and name != "cycles"}


def test_memory_options_checked():
    from fusetile.hdl.tile import Tile
    from wb_helpers import raises_in_constructor

    raises_in_constructor(ValueError, r"gmem_ports must be one of dual, shared, single, "
                          r"not 'two'", Tile, CONFIG, gmem_ports="two")
    raises_in_constructor(ValueError, r"store_ports must be dual or shared, not 'single'",
                          Tile, CONFIG, store_ports="single")
    raises_in_constructor(ValueError, r"trace_width must be one of 256, 128, 64, not 32",
                          Tile, CONFIG, trace_width=32)
