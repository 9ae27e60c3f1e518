"""RTL regression under cocotb, on Icarus and Verilator.

Each (simulator, top) pair is one simulator run of all its cocotb modules in
``tests/rtl/``; the model is built once (see ``rtl_model`` in conftest.py) and reused
while the gateware does not change. The host-side tests drive the same models
through :class:`VerilatorTransport` / :class:`IcarusTransport`.

To add RTL tests: put ``@cocotb.test()`` functions in a ``tests/rtl/cocotb_*.py``
module and list it below. A host-level scenario ``scenario(device)`` (blocking code
over :class:`fusetile.host.device.Device`) runs under cocotb with::

    @cocotb.test()
    async def my_scenario(dut):
        tb = TB(dut)
        await tb.reset()
        await run_host(tb, scenario)
"""

import os
import shutil
import signal
import time

import pytest

from fusetile.hdl.regmap import MAGIC, GMEM_BASE
from fusetile.host.transport import BusError, TransportError
from fusetile.kernels.config import TileConfig
from fusetile.sim.build import build, run_tests
from fusetile.sim.cocotb_transport import VerilatorTransport, IcarusTransport

from conftest import RTL_DIR, TESTS_DIR, require_simulator


#: cocotb modules run against the stand-in top and the tile.
HARNESS_MODULES = ["cocotb_harness"]
#: cocotb modules run against the tile only.
TILE_MODULES = ["cocotb_spine"]

SIMS = ["icarus", "verilator"]
TRANSPORTS = {"icarus": IcarusTransport, "verilator": VerilatorTransport}

pytestmark = pytest.mark.cocotb


@pytest.mark.parametrize("top", ["standin", "tile"])
@pytest.mark.parametrize("sim", SIMS)
def test_cocotb_regression(rtl_model, sim, top):
    model = rtl_model(sim, top)
    modules = HARNESS_MODULES + (TILE_MODULES if top == "tile" else [])
    result = run_tests(sim, test_module=modules, model=model, python_path=[RTL_DIR, TESTS_DIR],
                       extra_env={"FUSETILE_TOP": top}, timeout=1200)
    assert result.passed, result.summary()


@pytest.mark.parametrize("sim", SIMS)
def test_build_is_reused(rtl_model, sim):
    first = rtl_model(sim, "standin")
    again = build(sim, first.config, top=_standin_top())
    assert not again.rebuilt
    assert again.build_dir == first.build_dir


def _standin_top():
    from standin import standin_top
    return standin_top


@pytest.mark.parametrize("sim", SIMS)
def test_socket_transport(rtl_model, sim):
    from standin import RAM_BASE, RAM_WORDS, SCRATCH_ADDR, ERR_ADDR, SILENT_ADDR
    rtl_model(sim, "standin")
    with TRANSPORTS[sim](top=_standin_top(), bus_timeout=32) as t:
        pid = t.pid
        assert t.read32(0x0) == MAGIC
        t.write32(RAM_BASE + 8, 0xCAFEF00D)
        assert t.read32(RAM_BASE + 8) == 0xCAFEF00D
        values = [(i * 0x01010101) & 0xFFFFFFFF for i in range(RAM_WORDS)]
        t.write_burst(RAM_BASE, values)
        assert t.read_burst(RAM_BASE, RAM_WORDS) == values
        assert t.read_burst(RAM_BASE + 4, 3, increment=False) == [values[1]] * 3
        t.write_burst(SCRATCH_ADDR, [5, 6, 1], increment=False)
        t.wait_cycles(3)
        assert t.irq() == 1
        with pytest.raises(BusError) as info:
            t.read32(ERR_ADDR)
        assert (info.value.addr, info.value.write) == (ERR_ADDR, False)
        with pytest.raises(BusError) as info:
            t.write_burst(RAM_BASE + 4 * RAM_WORDS - 4, [1, 2])
        assert (info.value.addr, info.value.write) == (RAM_BASE + 4 * RAM_WORDS, True)
        with pytest.raises(TransportError, match="bus timeout"):
            t.read32(SILENT_ADDR)
        # The bus goes on after an error.
        assert t.read32(RAM_BASE + 8) == values[2]
    assert t.closed and not t.alive
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)     # reaped: no zombie left behind
    with pytest.raises(TransportError):
        t.read32(0x0)


@pytest.mark.parametrize("sim", SIMS)
def test_socket_transport_simulator_dies(rtl_model, sim):
    rtl_model(sim, "standin")
    t = TRANSPORTS[sim](top=_standin_top(), timeout=10)
    try:
        os.kill(t.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(TransportError, match="simulator (was killed|exited)"):
            t.read32(0x0)
        assert time.monotonic() - start < 5
        assert not t.alive
        with pytest.raises(TransportError):
            t.read32(0x0)
    finally:
        t.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(t.pid, os.WNOHANG)
    # A failed transport keeps its directory for the log; this failure was on purpose.
    assert (t.workdir / "sim.log").is_file()
    shutil.rmtree(t.workdir)


@pytest.mark.parametrize("sim", SIMS)
def test_socket_transport_tile(rtl_model, sim):
    from fusetile.host.device import Device
    rtl_model(sim, "tile")
    with Device(TRANSPORTS[sim](TileConfig())) as device:
        assert device.config == TileConfig()
        device.transport.write32(GMEM_BASE, 0x5A5A1234)
        assert device.transport.read32(GMEM_BASE) == 0x5A5A1234


@pytest.mark.parametrize("sim", SIMS)
def test_socket_transport_no_answer(rtl_model, sim):
    from standin import SILENT_ADDR
    rtl_model(sim, "standin")
    t = TRANSPORTS[sim](top=_standin_top(), bus_timeout=1 << 30, timeout=2)
    start = time.monotonic()
    with pytest.raises(TransportError, match="did not answer within"):
        t.read32(SILENT_ADDR)
    assert time.monotonic() - start < 6
    assert not t.alive and t.closed
    with pytest.raises(ChildProcessError):
        os.waitpid(t.pid, os.WNOHANG)
    shutil.rmtree(t.workdir)
