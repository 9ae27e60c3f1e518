"""The spine's scenarios (``tests/scenarios.py``) under cocotb, on the tile.

Each scenario is blocking host code over a :class:`fusetile.host.device.Device`; it
runs in a thread beside cocotb's coroutines (``run_host``: cocotb's bridge/resume), so
the RTL is held to the same specification on Icarus and Verilator as on Amaranth's
simulator. Launched by ``tests/test_rtl.py``.
"""

import cocotb

from fusetile.sim.tb import TB, run_host

from scenarios import SCENARIOS


@cocotb.test()
@cocotb.parametrize(scenario=SCENARIOS)
async def spine(dut, scenario):
    tb = TB(dut)
    await tb.reset()
    await run_host(tb, scenario)
