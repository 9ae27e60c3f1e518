"""The ISA benchmark: tiled matmuls, checked against NumPy, utilisation from counters;
the workloads suite on a configuration some workloads do not fit."""

from dataclasses import replace

import pytest

from fusetile.hdl.board import BOARDS
from fusetile.host import open_transport
from fusetile.host.bench import run_matmul, workload_suite
from fusetile.host.device import Device
from fusetile.kernels.compiler import CompileError
from fusetile.kernels.config import TileConfig
from fusetile.kernels.matmul import MatmulProblem, tiled_matmul

from conftest import require_simulator


@pytest.mark.parametrize("double_buffer", [False, True])
@pytest.mark.parametrize("m,n,k", [(8, 8, 1), (16, 24, 40), (32, 64, 256)])
def test_matmul_on_the_model(m, n, k, double_buffer):
    with open_transport("model") as transport:
        result = run_matmul(Device(transport), MatmulProblem(m=m, n=n, k=k, zp=-5),
                            double_buffer=double_buffer, seed=k)
    assert result["correct"]
    assert result["macs"] == m * n * k


@pytest.mark.cocotb
def test_double_buffering_sustains_the_array_on_rtl():
    """On the RTL, a K=256 matmul streaming its weights from GMEM keeps the 8x8 array
    >= 90 % busy in steady state with double-buffering (the tile's own counters)."""
    require_simulator("verilator")
    with open_transport("verilator") as transport:
        dev = Device(transport)
        problem = MatmulProblem(m=32, n=64, k=256)
        buffered = run_matmul(dev, problem, double_buffer=True)
        plain = run_matmul(dev, problem, double_buffer=False)
    assert buffered["correct"] and plain["correct"]
    assert buffered["steady_mac_utilization"] >= 0.90
    assert buffered["cycles"] < plain["cycles"]


def test_problem_checks():
    cfg = TileConfig()
    with pytest.raises(ValueError, match="m must be a positive multiple of 8 and n of 8"):
        tiled_matmul(cfg, MatmulProblem(m=12, n=8, k=4))
    with pytest.raises(ValueError, match="scratchpad words"):
        tiled_matmul(cfg, MatmulProblem(m=64, n=8, k=1024))


@pytest.mark.parametrize("built, reason", [
    (False, "which this tile does not build"),
    (True, "the tile has 4 slots"),
], ids=["icebreaker", "with-decisions"])
def test_workloads_that_do_not_fit_are_skipped_with_their_reason(built, reason):
    """On the iCEBreaker's configuration a data-dependent network does not compile: the
    tile builds no VCMP or VARGMAX (nor the VADD its residual needs), and with them its
    plan would not fit in 4 kernel slots. The suite leaves it out, saying why, and runs
    the others; asked with no list to report it in (one workload, as the digits demo
    asks), it raises."""
    config = replace(BOARDS["icebreaker"].config, decisions=built, word_ops=built)
    with open_transport("model", config=config) as transport:
        dev = Device(transport)
        skipped = []
        results = workload_suite(dev, names=("mlp", "exit"), samples=2, target="model",
                                 skipped=skipped)
        assert [(r["workload"], r["policy"]) for r in results] == [
            ("mlp", "none"), ("mlp", "static"), ("mlp", "adaptive")]
        assert all(r["output_mismatches"] == 0 for r in results)
        assert [s["workload"] for s in skipped] == ["exit"]
        assert reason in skipped[0]["reason"]
        with pytest.raises(CompileError, match="node 'exit_where' \\(Select\\)"):
            workload_suite(dev, names=("exit",), samples=2, target="model")
