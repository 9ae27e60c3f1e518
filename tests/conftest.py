"""Shared pytest set-up: the RTL regression's helpers and simulation models.

``tests/rtl/`` holds cocotb test modules and the harness's stand-in top; it is put on
``sys.path`` so that pytest (to elaborate the stand-in) and the simulators (to import
the cocotb modules, through ``PYTHONPATH``) find them by plain module name.
"""

import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
RTL_DIR = TESTS_DIR / "rtl"
if str(RTL_DIR) not in sys.path:
    sys.path.insert(0, str(RTL_DIR))


def require_simulator(sim):
    """Skip the calling test if ``sim`` is not installed; under CI (``CI`` set) fail
    instead, so a CI run without the simulators cannot pass by skipping them."""
    from fusetile.sim.build import simulator_available

    ok, why = simulator_available(sim)
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{sim} is required in CI: {why}")
        pytest.skip(why)


async def take_during_abort(ctx, unit, payload):
    """Offer the command ``payload`` (its bits) to ``unit`` (the compute unit or the
    DMA engine) in a cycle of its ``abort``: its ``ready`` must not wait for the abort;
    the caller checks that the command was dropped."""
    ctx.set(unit.cmd.valid, 1)
    ctx.set(unit.cmd.payload.as_value(), payload)
    ctx.set(unit.abort, 1)
    assert ctx.get(unit.cmd.ready)
    await ctx.tick()
    ctx.set(unit.cmd.valid, 0)
    ctx.set(unit.abort, 0)


@pytest.fixture(scope="session")
def rtl_model():
    """``rtl_model(sim, top="tile"|"standin", config=None)``: the built simulation
    model (:class:`fusetile.sim.build.BuildResult`), built at most once per session
    (and reused across sessions while the sources do not change)."""
    from fusetile.kernels.config import TileConfig
    from fusetile.sim.build import build
    from fusetile.sim.verilog import default_top
    from standin import standin_top

    tops = {"tile": default_top, "standin": standin_top}
    cache = {}

    def get(sim, top="tile", config=None):
        require_simulator(sim)
        config = TileConfig() if config is None else config
        key = (sim, top, config)
        if key not in cache:
            cache[key] = build(sim, config, top=tops[top])
        return cache[key]

    return get
