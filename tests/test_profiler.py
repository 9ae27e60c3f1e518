"""The profiler: per-unit profiles from the trace FIFO add up to the tile's own
counters; it names every unit of the plan, sees which ran back to back, counts its own
bus reads and the records a full FIFO dropped."""

import numpy as np
import pytest

from fusetile.host import open_transport
from fusetile.host.device import Device
from fusetile.host.onnx_import import load_model
from fusetile.host.profiler import Profiler
from fusetile.host.runner import infer, load_program
from fusetile.hdl.regmap import TRACE_WORDS
from fusetile.kernels.compiler import compile_graph
from fusetile.kernels.config import TileConfig
from fusetile.workloads import digits

from conftest import require_simulator


@pytest.fixture(scope="module")
def cnn():
    from pathlib import Path
    return load_model(str(Path(digits.__file__).with_name("digits_cnn.onnx")))


def _profile(target, graph, policy, n=16, config=TileConfig(), every=8):
    xs = np.random.default_rng(2).integers(-128, 128, (n,) + graph.tensors[
        graph.input].shape).astype(np.int8)
    with open_transport(target, config=config) as transport:
        dev = Device(transport)
        program = compile_graph(graph, config, policy=policy)
        load_program(dev, program)
        profiler = Profiler(every=every)
        _, stats = infer(dev, program, xs, profiler=profiler)
        counters = dev.counters()
    return program, profiler, stats, counters


def _check_totals(program, profiler, stats, counters):
    profiles = profiler.profiles()
    assert list(profiles) == ["+".join(g) for g in program.groups]   # every unit, in order
    assert sum(p.calls for p in profiles.values()) == counters["kernel_calls"]
    assert sum(p.bytes_in for p in profiles.values()) == counters["dma_bytes_in"]
    assert sum(p.bytes_out for p in profiles.values()) == counters["dma_bytes_out"]
    assert sum(p.cycles for p in profiles.values()) <= counters["active_cycles"]
    assert all(p.samples == stats.samples for p in profiles.values())


@pytest.mark.parametrize("policy", ["none", "static"])
def test_profiles_add_up_to_the_counters(cnn, policy):
    program, profiler, stats, counters = _profile("model", cnn, policy)
    _check_totals(program, profiler, stats, counters)
    assert profiler.dropped == 0
    units = [u for u in program.segments[0].units]
    runs = stats.runs
    # the units that ran back to back, once per run, in plan order
    expected = {(a, b) for a, b in zip(units, units[1:]) if a != b}
    assert set(profiler.successions()) == expected
    assert all(count == runs for count in profiler.successions().values())
    # its own cost: per run one status read, the records, one dropped-count read, and a
    # FIFO-level read at every 8th poll while the run is under way
    floor = runs * 2 + counters["kernel_calls"] * TRACE_WORDS
    polls = counters["active_cycles"] // 64 + runs
    assert floor <= profiler.register_reads <= floor + polls // 8 + 2 * runs
    bounds = {u: p.bound for u, p in profiler.profiles().items()}
    assert set(bounds.values()) <= {"compute", "memory"}


def test_a_short_fifo_is_drained_while_the_plan_runs(cnn):
    config = TileConfig(trace_depth=4)
    program, profiler, stats, counters = _profile("model", cnn, "none", n=8, config=config,
                                                  every=1)
    assert counters["kernel_calls"] == program.calls > 4
    assert profiler.dropped == 0
    assert sum(p.calls for p in profiler.profiles().values()) == program.calls


def test_a_full_fifo_is_counted(cnn):
    config = TileConfig(trace_depth=4)
    program, profiler, stats, counters = _profile("model", cnn, "none", n=8, config=config,
                                                  every=10**9)      # never drained mid-run
    assert counters["kernel_calls"] == program.calls > 4
    assert profiler.dropped == program.calls - 4
    assert sum(p.calls for p in profiler.profiles().values()) == 4


@pytest.mark.cocotb
def test_profiles_on_the_rtl(cnn):
    require_simulator("verilator")
    program, profiler, stats, counters = _profile("verilator", cnn, "static", n=8)
    _check_totals(program, profiler, stats, counters)
    profiles = profiler.profiles()
    assert profiles["conv2+pool2"].mac_busy > 0 and profiles["fc"].mac_busy > 0


def test_value_ranges_of_what_the_host_reads():
    profiler = Profiler()
    profiler.observe("y", np.array([[-128, 5], [127, 3]], dtype=np.int8))
    profiler.observe("y", np.array([[0, -7]], dtype=np.int8))
    r = profiler.ranges["y"]
    assert (r["min"], r["max"], r["count"], r["saturated"]) == (-128, 127, 6, 2)
    assert r["mean"] == pytest.approx((-128 + 5 + 127 + 3 + 0 - 7) / 6)
