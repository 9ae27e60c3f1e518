"""The adaptive runtime: it merges units the static rules do not, while the tile runs,
with no lost, repeated or changed output; it splits a merge that does not pay and does
not thrash; the kernel cache warm-starts a second run and never serves another tile."""

import sqlite3

import numpy as np
import pytest

from fusetile.host import open_transport
from fusetile.host.adaptive import AdaptiveRunner, SlotTable
from fusetile.host.bench import _workload, workload_suite
from fusetile.host.cache import KernelCache
from fusetile.host.device import Device
from fusetile.host.fusion import FusionEngine
from fusetile.host.profiler import Profiler, Run
from fusetile.kernels.compiler import POLICIES, CompileError, compile_graph, static_groups
from fusetile.kernels.config import TileConfig
from fusetile.kernels.graph import run_reference

from conftest import require_simulator


@pytest.fixture(scope="module")
def cnn():
    return _workload("cnn")


def _samples(graph, n, seed=3):
    rng = np.random.default_rng(seed)
    return rng.integers(-128, 128, (n,) + tuple(graph.tensors[graph.input].shape)).astype(
        np.int8)


def _adaptive(graph, xs, target="model", config=TileConfig(), **kwargs):
    with open_transport(target, config=config) as transport:
        runner = AdaptiveRunner(Device(transport), graph, **kwargs)
        y, stats = runner.run(xs)
    return runner, y, stats


def test_adaptive_beats_static_beats_none_on_every_workload():
    results = workload_suite(Device(open_transport("model")), samples=128, target="model")
    by = {(r["workload"], r["policy"]): r for r in results if r["stream"] == "shuffled"}
    for name in ("mlp", "cnn", "rescnn"):
        none, static, adaptive = (by[name, p] for p in ("none", "static", "adaptive"))
        assert adaptive["cycles_per_inference"] < static["cycles_per_inference"] < \
            none["cycles_per_inference"]
        assert adaptive["swap_idle_cycles"] == 0
        assert all(by[name, p]["output_mismatches"] == 0 for p in ("static", "adaptive"))
        assert adaptive["roofline_cycles"] < adaptive["cycles_per_inference"]
    # the CNNs: merges beyond the static rules'; the MLP, which the static rules already
    # run as one kernel: its weights kept in the scratchpad between runs
    assert by["cnn", "adaptive"]["fusions"] >= 1 and by["rescnn", "adaptive"]["fusions"] >= 1
    assert not by["cnn", "adaptive"]["resident_constants"]
    mlp = by["mlp", "adaptive"]
    assert mlp["fusions"] == 0 and mlp["resident_constants"]
    assert mlp["gmem_bytes_per_inference"] < by["mlp", "static"]["gmem_bytes_per_inference"]
    # the data-dependent networks: speculation, on the shuffled and the class-sorted
    # stream, never changes an output
    for name in ("exit", "moe"):
        static, adaptive = by[name, "static"], by[name, "adaptive"]
        assert adaptive["cycles_per_inference"] < static["cycles_per_inference"]
        spec = adaptive["speculation"]
        assert spec["hits"] > 0 and spec["rollbacks"] == spec["misses"]
        assert 0 < spec["rollback_cycles"] <= 8 and spec["predictor_accuracy"] > 0.5
        assert static["speculation"]["hits"] == static["speculation"]["misses"] == 0
        (shifted,) = [r for r in results if r["workload"] == name and
                      r["stream"] == "class-sorted"]
        assert shifted["speculation"]["windows"] and shifted["output_mismatches"] == 0
        assert all(by[name, p]["output_mismatches"] == 0 for p in ("static", "adaptive"))
        (routes,) = adaptive["routes"].values()          # the profiler's, per path
        assert sum(routes.values()) == 128
    # the tile's branch counters count the early exits the same
    assert by["exit", "static"]["routes"] == by["exit", "adaptive"]["routes"]


@pytest.mark.parametrize("target", ["model", pytest.param("verilator",
                                                          marks=pytest.mark.cocotb)])
def test_a_fusion_is_split_when_the_input_stream_changes(target):
    """The early-exit network with the fusion engine: the static rules merge the late
    path's two layers; on 8s (which seldom exit) they run in most inferences and stay
    merged; when the stream changes to 0s and 4s (which mostly exit) the merged unit
    runs seldom and is split; when the 8s come back, the engine merges it again."""
    if target != "model":
        require_simulator(target)
    from fusetile.workloads.digits import load_split
    graph = _workload("exit")
    _, _, x, y = load_split()
    x = graph.quantize_input(x.reshape((-1,) + tuple(graph.tensors[graph.input].shape)))
    stream = np.concatenate([x[y == 8], x[y == 0], x[y == 4], x[y == 8]])
    runner, out, stats = _adaptive(graph, stream, target, speculate=False)
    assert np.array_equal(out, np.stack([run_reference(graph, s)[graph.output]
                                         for s in stream]))
    assert ("fc2", "fc3") in runner.engine.groups
    defuse, fuse = runner.engine.log
    assert (defuse["action"], defuse["units"]) == ("defuse", "fc2+fc3")
    assert defuse["reason"].startswith("ran in")
    eights, others = np.sum(y == 8), np.sum((y == 0) | (y == 4))
    assert eights < defuse["run"] < eights + others < fuse["run"]
    assert (fuse["action"], fuse["units"]) == ("fuse", "fc2+fc3")
    assert stats.fusions == stats.defusions == 1


def test_swap_while_running_loses_no_sample(cnn):
    xs = _samples(cnn, 8 * 12 + 3)                     # the last run carries 3 samples
    runner, y, stats = _adaptive(cnn, xs)
    assert np.array_equal(y, np.stack([run_reference(cnn, x)[cnn.output] for x in xs]))
    assert stats.swaps == 1 and stats.fusions == 1 and stats.jit_compiles == 1
    plans = [r["plan"] for r in stats.runs_log]
    assert plans == sorted(plans) and plans[0] == 0 and plans[-1] == 1
    assert sum(r["samples"] for r in stats.runs_log) == len(xs)
    cycles = {p: {r["active_cycles"] for r in stats.runs_log[:-1] if r["plan"] == p}
              for p in (0, 1)}
    # every run on a plan took the same cycles, the one the swap happened in included
    assert len(cycles[0]) == 1 and len(cycles[1]) == 1
    assert cycles[1].pop() < cycles[0].pop()
    assert runner.program.groups[-1] == ("conv2", "pool2", "fc")


@pytest.mark.parametrize("target", ["model", pytest.param("verilator",
                                                          marks=pytest.mark.cocotb)])
def test_a_one_kernel_program_keeps_its_weights_in_the_scratchpad(target):
    """The MLP, one kernel under the static rules: the runtime swaps to the variant that
    does not load its constants, after a run that did; a new stream loads them again."""
    if target != "model":
        require_simulator(target)
    mlp = _workload("mlp")
    xs = _samples(mlp, 8 * 12 + 3)
    reference = np.stack([run_reference(mlp, x)[mlp.output] for x in xs])
    with open_transport(target) as transport:
        runner = AdaptiveRunner(Device(transport), mlp)
        y, stats = runner.run(xs)
        assert np.array_equal(y, reference)
        assert [e["action"] for e in runner.engine.log] == ["resident"]
        assert runner.program.resident and stats.swaps == 1 and stats.jit_compiles == 0
        full = [r for r in stats.runs_log if r["samples"] == 8]
        cold = {r["dma_bytes_in"] for r in full if r["plan"] == 0}
        warm = {r["dma_bytes_in"] for r in full if r["plan"] == 1}
        constants = runner.program.constant_words * TileConfig().word_bytes
        assert len(cold) == len(warm) == 1 and cold.pop() - warm.pop() == constants
        assert max(r["active_cycles"] for r in full if r["plan"] == 1) < \
            min(r["active_cycles"] for r in full if r["plan"] == 0)
        y, again = runner.run(xs)                 # starts from the loading variant
        assert np.array_equal(y, reference)
        assert again.runs_log[0]["dma_bytes_in"] == stats.runs_log[0]["dma_bytes_in"]


def test_slots_of_the_running_plan_are_never_overwritten(cnn):
    table = SlotTable(4)
    static = compile_graph(cnn, TileConfig(), policy="static", stable_layout=True)
    fused = compile_graph(cnn, TileConfig(), groups=[("conv1", "pool1"),
                                                     ("conv2", "pool2", "fc")],
                          stable_layout=True)
    first, loads = table.place(static.segments[0])
    table.commit(loads)
    busy = set(first.kernels)
    second, loads = table.place(fused.segments[0], busy)
    assert not set(loads) & busy                       # new kernels into free slots only
    assert first.kernels[0] == second.kernels[0]       # conv1+pool1 is reused, not reloaded
    table.commit(loads)
    with pytest.raises(CompileError, match="kernel slots"):
        SlotTable(3).place(fused.segments[0], busy={0, 1})


def test_warm_start_from_the_cache(cnn, tmp_path):
    xs = _samples(cnn, 8 * 10)
    cache = KernelCache(tmp_path / "cache.sqlite")
    _, y1, first = _adaptive(cnn, xs, cache=cache)
    assert first.jit_compiles >= 1
    cache.close()
    cache = KernelCache(tmp_path / "cache.sqlite")           # a second process, say
    runner, y2, second = _adaptive(cnn, xs, cache=cache)
    assert second.jit_compiles == 0 and cache.hits >= 1
    measured = cache.unit_profile(cnn, TileConfig(), ("conv2", "pool2", "fc"))
    assert measured["calls"] > 0 and measured["cycles"] > 0       # the profile database
    assert runner.program.groups[-1] == ("conv2", "pool2", "fc")   # starts adapted
    assert np.array_equal(y1, y2)
    # already adapted from the first run on: every run is as fast as the first run's best
    assert max(r["active_cycles"] for r in second.runs_log) == \
        min(r["active_cycles"] for r in first.runs_log)


def test_another_hardware_profile_gets_no_stale_hit(cnn, tmp_path):
    xs = _samples(cnn, 8 * 6)
    cache = KernelCache(tmp_path / "cache.sqlite")
    _adaptive(cnn, xs, cache=cache)
    other = TileConfig(kernel_slots=6)
    assert other.profile_hash != TileConfig().profile_hash
    assert cache.best_groups(cnn, other) is None
    runner, y, stats = _adaptive(cnn, xs, config=other, cache=cache)
    assert cache.hits == 0 and stats.jit_compiles >= 1      # compiled anew for this tile


def test_another_compiler_gets_no_stale_hit(cnn, tmp_path, monkeypatch):
    from fusetile.host import cache as cache_module
    xs = _samples(cnn, 8 * 6)
    cache = KernelCache(tmp_path / "cache.sqlite")
    _adaptive(cnn, xs, cache=cache)
    assert cache.program(cnn, TileConfig(), [("conv1", "pool1"), ("conv2", "pool2", "fc")])
    monkeypatch.setattr(cache_module, "COMPILER", "a-newer-one")
    hits, misses = cache.hits, cache.misses
    runner, y, _ = _adaptive(cnn, xs, cache=cache)
    assert cache.hits == hits and cache.misses > misses     # recompiled, not served
    assert runner.program.groups[-1] == ("conv2", "pool2", "fc")   # what was learnt stays
    assert np.array_equal(y, np.stack([run_reference(cnn, x)[cnn.output] for x in xs]))


@pytest.mark.parametrize("damage", ["corrupt", "locked"])
def test_a_bad_cache_is_reported_and_the_run_goes_on(cnn, tmp_path, damage):
    path = tmp_path / "cache.sqlite"
    holder = None
    if damage == "corrupt":
        path.write_bytes(b"this is not an SQLite database" * 100)
    else:
        KernelCache(path).close()
        holder = sqlite3.connect(path)
        holder.execute("BEGIN EXCLUSIVE")               # another process holds the lock
    xs = _samples(cnn, 8 * 6)
    with pytest.warns(RuntimeWarning, match="running without it"):
        cache = KernelCache(path)
        runner, y, stats = _adaptive(cnn, xs, cache=cache)
    assert not cache.enabled and "cache.sqlite" in cache.error
    assert np.array_equal(y, np.stack([run_reference(cnn, x)[cnn.output] for x in xs]))
    assert stats.fusions == 1
    if holder is not None:
        holder.rollback()
        holder.close()


# -- the engine's decisions on measured profiles ------------------------------------------

def _record(cycles, calls=1, dma=0, mac=0, bytes_out=0):
    return {"cycles": cycles, "dma_busy": dma, "mac_busy": mac, "vec_busy": 0,
            "bytes_in": 0, "bytes_out": bytes_out}


def _window(profiler, units, runs=8, samples=8):
    """Synthetic runs: ``units`` = [(name, record), ...] in call order."""
    profiler.runs.clear()
    for _ in range(runs):
        profiler.runs.append(Run(samples, list(units)))


def _cnn_static_window():
    """Measured-looking calls of the CNN's static units, one run of 8 samples."""
    return [("conv1+pool1", _record(4000, 4, dma=800, mac=1000, bytes_out=512)),
            ("conv2+pool2", _record(5000, 2, dma=1500, mac=2500, bytes_out=256)),
            ("fc", _record(400, 1, dma=200, mac=100))]


def test_a_merge_that_does_not_pay_is_split_and_not_retried(cnn):
    config = TileConfig()
    groups = [tuple(g) for g in compile_graph(cnn, config, policy="static").groups]
    compiled = lambda g: compile_graph(cnn, config, groups=g)         # noqa: E731
    engine = FusionEngine(cnn, config, groups, compiled, max_refusions=2)
    profiler = Profiler()
    parts = _cnn_static_window()
    for attempt in range(2):
        _window(profiler, parts)
        program = compiled(engine.groups)
        new = engine.step(program, profiler, run=10 * attempt)
        assert new is not None and ("conv2", "pool2", "fc") in new
        assert engine.log[-1]["action"] == "fuse"
        # measured: the merged unit is slower than its parts were (5,400 cycles)
        _window(profiler, [parts[0], ("conv2+pool2+fc", _record(6000, 1, mac=2600))])
        split = engine.step(compiled(engine.groups), profiler, run=10 * attempt + 5)
        assert split == groups and engine.log[-1]["action"] == "defuse"
        assert "slower than its parts" in engine.log[-1]["reason"]
    # split twice: never merged again (no thrashing)
    _window(profiler, parts)
    assert engine.step(compiled(engine.groups), profiler, run=30) is None
    assert [e["action"] for e in engine.log] == ["fuse", "defuse", "fuse", "defuse"]


@pytest.mark.parametrize("paid, direction", [(0.25, "up"), (2.0, "down")])
def test_the_threshold_adapts_to_measured_gains(cnn, paid, direction):
    """A merge that pays less than half its prediction raises the threshold; one that
    pays as predicted lowers it."""
    config = TileConfig()
    groups = [tuple(g) for g in static_groups(cnn, config)] + [("fc",)]
    compiled = lambda g: compile_graph(cnn, config, groups=g)         # noqa: E731
    engine = FusionEngine(cnn, config, groups, compiled, threshold=0.01)
    profiler = Profiler()
    parts = _cnn_static_window()
    _window(profiler, parts)
    assert engine.step(compiled(engine.groups), profiler, run=0) is not None
    predicted = engine.log[-1]["predicted_cycles_saved"] * 8          # per run of 8
    _window(profiler, [parts[0], ("conv2+pool2+fc", _record(5400 - paid * predicted, 1))])
    assert engine.step(compiled(engine.groups), profiler, run=5) is None   # it pays: kept
    assert engine.fused[("conv2", "pool2", "fc")].measured > 0
    assert (engine.threshold > 0.01) if direction == "up" else (engine.threshold < 0.01)


def test_a_rare_merged_unit_is_split(cnn):
    config = TileConfig()
    compiled = lambda g: compile_graph(cnn, config, groups=g)         # noqa: E731
    engine = FusionEngine(cnn, config, compiled(static_groups(cnn, config)).groups,
                          compiled, rare=0.5)
    profiler = Profiler()
    parts = _cnn_static_window()
    _window(profiler, parts)
    engine.step(compiled(engine.groups), profiler, run=0)
    # the stream changes: the merged unit now runs in 2 of 8 runs (and pays when it does)
    profiler.runs.clear()
    for i in range(8):
        calls = [parts[0]] + ([("conv2+pool2+fc", _record(5000, 1))] if i < 2 else [])
        profiler.runs.append(Run(8, calls))
    assert engine.step(compiled(engine.groups), profiler, run=5) is not None
    assert engine.log[-1]["action"] == "defuse" and "ran in 2 of 8" in engine.log[-1]["reason"]


@pytest.mark.cocotb
def test_adaptive_on_verilator_matches_the_model(cnn):
    """Kernels and plan loaded while the RTL runs; the swap at DONE; outputs and the
    cycles of the adapted plan from the RTL's counters."""
    require_simulator("verilator")
    xs = _samples(cnn, 8 * 10)
    _, y_model, _ = _adaptive(cnn, xs)
    runner, y_rtl, stats = _adaptive(cnn, xs, target="verilator")
    assert np.array_equal(y_rtl, y_model)
    assert stats.swaps == 1 and stats.swap_idle_cycles == 0
    runs = stats.runs_log
    assert runs[-1]["active_cycles"] < runs[0]["active_cycles"]


def test_splitting_a_merge_of_a_merge_restores_the_inner_one():
    """res_add+pool1 merged first, then res2 into it; when the outer merge is split, the
    inner one is a merged unit again (and can itself be split later)."""
    graph = _workload("rescnn")
    config = TileConfig()
    compiled = lambda g: compile_graph(graph, config, groups=g)       # noqa: E731
    engine = FusionEngine(graph, config, compiled(static_groups(graph, config)).groups,
                          compiled)
    profiler = Profiler()
    base = [("conv1", _record(2000, 8, dma=400, mac=500)),
            ("res1", _record(6000, 8, dma=1500, mac=1500)),
            ("res2", _record(6000, 8, dma=1500, mac=1500, bytes_out=4096)),
            ("res_add", _record(3000, 8, dma=1500, bytes_out=4096)),
            ("pool1", _record(1500, 4, dma=600, bytes_out=1024)),
            ("conv2+pool2", _record(5000, 2, dma=1500, mac=2500, bytes_out=256)),
            ("fc", _record(400, 1, dma=200, mac=100))]
    _window(profiler, base)
    engine.groups = compiled([("conv2", "pool2")]).groups
    assert ("res_add", "pool1") in engine.step(compiled(engine.groups), profiler, 0)
    merged = [u for u in base if u[0] not in ("res_add", "pool1")]
    merged.insert(3, ("res_add+pool1", _record(2500, 4, dma=900, bytes_out=1024)))
    _window(profiler, merged)
    engine.threshold = 10.0                  # measure only: no new merge this step
    assert engine.step(compiled(engine.groups), profiler, 4) is None
    engine.threshold = 0.001
    new = engine.step(compiled(engine.groups), profiler, 8)
    assert ("res2", "res_add", "pool1") in new and ("res_add", "pool1") not in engine.fused
    outer = [u for u in merged if u[0] not in ("res2", "res_add+pool1")]
    outer.insert(2, ("res2+res_add+pool1", _record(99999, 4)))       # much slower
    _window(profiler, outer)
    split = engine.step(compiled(engine.groups), profiler, 12)
    assert ("res2",) in split and ("res_add", "pool1") in split
    assert ("res_add", "pool1") in engine.fused             # the inner merge is back


def test_a_program_beyond_one_bank_runs_static(cnn):
    """Fewer kernel slots than the static program has kernels: it runs in segments,
    which the adaptive runner cannot swap between; it says so and runs them, correctly."""
    config = TileConfig(kernel_slots=2)
    xs = _samples(cnn, 8 * 2)
    runner, y, stats = _adaptive(cnn, xs, config=config)
    assert runner.fallback is not None and stats.fusions == 0
    assert runner.speculator is None        # what the benchmark asks (step 55's crash)
    assert runner.engine.log[0]["action"] == "static" and "plan bank" in \
        runner.engine.log[0]["reason"]
    assert np.array_equal(y, np.stack([run_reference(cnn, x)[cnn.output] for x in xs]))


def test_a_tile_without_speculation_runs_the_choice_unspeculated():
    """On a tile without speculation (staging_words 0) the early-exit network runs its
    unspeculated plan, with the fusion engine on either side of the choice, and the
    compiler refuses a speculative plan for it, naming the Select."""
    graph = _workload("exit")
    config = TileConfig(staging_words=0)
    xs = _samples(graph, 8 * 3)
    runner, y, stats = _adaptive(graph, xs, config=config)
    assert runner.speculator is None and stats.speculation is None
    assert np.array_equal(y, np.stack([run_reference(graph, x)[graph.output] for x in xs]))
    with pytest.raises(CompileError, match="node 'exit_where' \\(Select\\): the tile has no "
                                           "speculation"):
        compile_graph(graph, config, speculate=0)
    compile_graph(graph, TileConfig(), speculate=0)


def test_a_tile_without_decisions_refuses_a_data_dependent_network():
    """On a tile without VCMP and VARGMAX (decisions False) the compiler refuses the
    early-exit network under every policy, speculated or not, naming its Select."""
    graph = _workload("exit")
    config = TileConfig(decisions=False)
    message = ("node 'exit_where' \\(Select\\): a data-dependent choice is made by VCMP or "
               "VARGMAX, which this tile does not build")
    for kwargs in [{"policy": p} for p in POLICIES] + [{"speculate": 0}]:
        with pytest.raises(CompileError, match=message):
            compile_graph(graph, config, **kwargs)
    compile_graph(graph, TileConfig())


def test_a_tile_without_word_ops_refuses_a_convolutional_network():
    """On a tile without VADD, VPOOL and VCLAMP (word_ops False) the compiler refuses a
    network with a MaxPool under every policy, naming the node; the MLP (Gemms
    alone) compiles."""
    config = TileConfig(word_ops=False)
    graph = _workload("cnn")
    pool = next(op for op in graph.ops if type(op).__name__ == "MaxPool")
    message = (f"node '{pool.name}' \\(MaxPool\\): an Add, MaxPool or Clamp is made by "
               "VADD, VPOOL or VCLAMP, which this tile does not build")
    for policy in POLICIES:
        with pytest.raises(CompileError, match=message):
            compile_graph(graph, config, policy=policy)
    compile_graph(_workload("mlp"), config)


def test_a_tile_without_a_trace_keeps_the_first_plan(cnn):
    """On a tile without a trace FIFO the profiler has runs but no unit profiles, in
    which every unit would look as if it never ran: the runner keeps the static
    policy's program, says why, and the outputs are right. (Asking the engine, it split
    the static rules' merges, "ran in 0 of 1 runs".)"""
    config = TileConfig(trace_depth=0)
    xs = _samples(cnn, 8 * 3)
    runner, y, stats = _adaptive(cnn, xs, config=config)
    assert np.array_equal(y, np.stack([run_reference(cnn, x)[cnn.output] for x in xs]))
    assert runner.profiler.profiles() == {} and len(runner.profiler.runs) == 3
    assert runner.profiler.cycles_per_inference() > 0
    assert [r["plan"] for r in stats.runs_log] == [0, 0, 0]
    assert stats.fusions == stats.defusions == 0
    assert [(e["action"], e["reason"]) for e in runner.engine.log] == [
        ("static", "the tile has no trace FIFO: no unit profiles to adapt on")]
    assert runner.program.groups == compile_graph(cnn, config, policy="static").groups


def test_a_short_stream_adapts_within_it(cnn):
    """Three runs: decide after the first, swap at the end of the second, the third runs
    the merged plan."""
    xs = _samples(cnn, 8 * 3)
    _, y, stats = _adaptive(cnn, xs)
    assert np.array_equal(y, np.stack([run_reference(cnn, x)[cnn.output] for x in xs]))
    assert [r["plan"] for r in stats.runs_log] == [0, 0, 1]
    assert stats.runs_log[2]["active_cycles"] < stats.runs_log[0]["active_cycles"]


def test_the_graph_hash_ignores_names_and_sees_weights(cnn):
    import copy
    import dataclasses
    from fusetile.host.cache import graph_hash
    renamed = copy.deepcopy(cnn)
    new = {n: "t_" + n for n in renamed.tensors}
    renamed.tensors = {new[n]: dataclasses.replace(t, name=new[n])
                       for n, t in renamed.tensors.items()}
    for op in renamed.ops:
        op.name = "op_" + op.name
        for field in ("x", "y", "a", "b"):
            if hasattr(op, field):
                setattr(op, field, new[getattr(op, field)])
    renamed.input, renamed.output = new[renamed.input], new[renamed.output]
    assert graph_hash(renamed) == graph_hash(cnn)
    changed = copy.deepcopy(cnn)
    changed.ops[0].weight = changed.ops[0].weight.copy()
    changed.ops[0].weight.flat[0] ^= 1
    assert graph_hash(changed) != graph_hash(cnn)
