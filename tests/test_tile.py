"""The spine's scenarios on the RTL in Amaranth's simulator (no external tools).

The same scenarios run under cocotb on Icarus and Verilator in ``tests/test_rtl.py``.
"""

from dataclasses import replace

import pytest

from fusetile.host import open_transport
from fusetile.host.device import Device
from fusetile.kernels.config import TileConfig

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


def test_memory_options_checked():
    from fusetile.hdl.tile import Tile
    from wb_helpers import raises_in_constructor

    raises_in_constructor(ValueError, r"gmem_ports must be one of dual, shared, single, "
                          r"not 'two'", Tile, CONFIG, gmem_ports="two")
    raises_in_constructor(ValueError, r"store_ports must be dual or shared, not 'single'",
                          Tile, CONFIG, store_ports="single")
    raises_in_constructor(ValueError, r"trace_width must be one of 256, 128, 64, not 32",
                          Tile, CONFIG, trace_width=32)
