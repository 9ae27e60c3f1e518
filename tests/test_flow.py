"""Data-dependent networks (:class:`~fusetile.kernels.graph.Select`): the compiler runs
the ops only one input needs on its own path of a BRANCH (threshold: early exit) or a
SWITCH (argmax: mixture of experts); the tile's outputs equal the IR's reference and
only the chosen path runs."""

import numpy as np
import pytest

from fusetile.host import open_transport
from fusetile.host.adaptive import AdaptiveRunner
from fusetile.host.device import Device, TileFault
from fusetile.host.runner import infer, load_program
from fusetile.host.speculation import Predictor
from fusetile.kernels.compiler import POLICIES, CompileError, compile_graph
from fusetile.kernels.config import TileConfig
from fusetile.kernels.graph import Dense, Graph, QTensor, Select, run_reference
from fusetile.kernels.isa import FaultCause, PlanOp
from fusetile.kernels.program import PlanInstr, dma_load

from conftest import require_simulator
from test_compiler import _b, _reference, _rq, _run, _samples, _t, _w


def exit_net(seed, threshold=None, *, k=16, hidden=12, classes=10):
    """x -> head (the key, and path 0's result) | fc2 -> fc3 (path 1) -> Select.

    Without ``threshold`` it is the median over random samples of the head's largest
    output, so both paths run."""
    rng = np.random.default_rng(seed)
    T = {"x": _t("x", (k,), rng), "e": _t("e", (classes,), rng), "h": _t("h", (hidden,), rng)}
    T["r"] = QTensor("r", (classes,), T["e"].scale, T["e"].zero_point)
    T["y"] = QTensor("y", (classes,), T["e"].scale, T["e"].zero_point)
    ops = [Dense("head", "x", "e", _w(rng, (classes, k)), _b(rng, classes), _rq(rng, classes)),
           Dense("fc2", "x", "h", _w(rng, (hidden, k)), _b(rng, hidden), _rq(rng, hidden),
                 lo=T["h"].zero_point),
           Dense("fc3", "h", "r", _w(rng, (classes, hidden)), _b(rng, classes),
                 _rq(rng, classes)),
           Select("exit", "e", ("e", "r"), "y", "threshold", 0)]
    graph = Graph(f"exit{seed}", T, ops, "x", "y")
    if threshold is None:
        keys = [run_reference(graph, x)["e"].max() for x in _samples(graph, 32)]
        threshold = int(np.median(keys))
    ops[-1].threshold = threshold
    return graph


def moe_net(seed, *, k=16, experts=4, hidden=8, classes=6):
    """x -> gate (the key) | expert i: fc1 -> fc2 (path i) -> Select by argmax."""
    rng = np.random.default_rng(seed)
    T = {"x": _t("x", (k,), rng), "g": _t("g", (experts,), rng), "y": _t("y", (classes,), rng)}
    ops = [Dense("gate", "x", "g", _w(rng, (experts, k)), _b(rng, experts), _rq(rng, experts))]
    for i in range(experts):
        T[f"h{i}"] = _t(f"h{i}", (hidden,), rng)
        T[f"o{i}"] = QTensor(f"o{i}", (classes,), T["y"].scale, T["y"].zero_point)
        ops += [Dense(f"e{i}_fc1", "x", f"h{i}", _w(rng, (hidden, k)), _b(rng, hidden),
                      _rq(rng, hidden), lo=T[f"h{i}"].zero_point),
                Dense(f"e{i}_fc2", f"h{i}", f"o{i}", _w(rng, (classes, hidden)),
                      _b(rng, classes), _rq(rng, classes))]
    ops.append(Select("route", "g", tuple(f"o{i}" for i in range(experts)), "y", "argmax"))
    return Graph(f"moe{seed}", T, ops, "x", "y")


def _plan_ops(program):
    return [PlanInstr.from_bits(i).op for i in program.segments[0].plan]


def _chosen(graph, xs):
    sel = next(op for op in graph.ops if isinstance(op, Select))
    return [sel.choose(run_reference(graph, x)[sel.key]) for x in xs]


@pytest.mark.parametrize("policy", POLICIES)
def test_early_exit_matches_reference(policy):
    graph = exit_net(1)
    xs = _samples(graph, 24)
    assert 0 < sum(c == 0 for c in _chosen(graph, xs)) < len(xs)   # both paths taken
    y, stats = _run("model", graph, xs, policy)
    assert np.array_equal(y, _reference(graph, xs))
    assert stats.runs == len(xs)                # one sample per run


def test_early_exit_plan_branches_over_the_late_path():
    program = compile_graph(exit_net(1), TileConfig())
    assert program.lanes == 1 and len(program.segments) == 1
    ops = _plan_ops(program)
    assert ops.count(PlanOp.BRANCH) == 1 and ops.count(PlanOp.JUMP) == 1
    assert ops[-1] == PlanOp.DONE


@pytest.mark.parametrize("threshold", [-200, -128, 127, 128, 500])
def test_thresholds_beyond_int8_are_always_or_never_reached(threshold):
    graph = exit_net(2, threshold)
    xs = _samples(graph, 9)
    y, _ = _run("model", graph, xs, "none")
    assert np.array_equal(y, _reference(graph, xs))


@pytest.mark.parametrize("policy", POLICIES)
def test_mixture_of_experts_matches_reference(policy):
    graph = moe_net(3)
    xs = _samples(graph, 40)
    assert len(set(_chosen(graph, xs))) >= 3
    y, _ = _run("model", graph, xs, policy)
    assert np.array_equal(y, _reference(graph, xs))


def test_moe_plan_switches_over_a_jump_table():
    program = compile_graph(moe_net(3), TileConfig())
    ops = _plan_ops(program)
    assert ops.count(PlanOp.SWITCH) == 1 and ops.count(PlanOp.JUMP) == 4 + 3


def test_lanes_other_than_one_are_refused():
    with pytest.raises(CompileError, match="lanes must be 1"):
        compile_graph(exit_net(1), TileConfig(), lanes=8)


def test_a_path_result_read_after_the_choice_is_refused():
    graph = moe_net(4)
    graph.tensors["z"] = QTensor("z", (6,), 0.1, 0)
    graph.ops.append(Dense("late", "o1", "z", np.ones((6, 6), np.int8),
                           np.zeros(6, np.int32), _rq(np.random.default_rng(0), 6)))
    graph.output = "z"
    with pytest.raises(CompileError, match="reads what only path 1"):
        compile_graph(graph, TileConfig())


@pytest.mark.parametrize("guess", [0, 1])
def test_speculative_exit_matches_reference_on_hits_and_misses(guess):
    graph = exit_net(1)
    xs = _samples(graph, 24)
    chosen = _chosen(graph, xs)
    with open_transport("model", config=TileConfig()) as transport:
        dev = Device(transport)
        program = compile_graph(graph, TileConfig(), speculate=guess, stable_layout=True)
        load_program(dev, program)
        y, _ = infer(dev, program, xs)
        counters = dev.counters()
    assert np.array_equal(y, _reference(graph, xs))
    assert counters["spec_hits"] == sum(c == guess for c in chosen)
    assert counters["spec_misses"] == sum(c != guess for c in chosen)


# -- fault injection: outputs equal the unspeculated plan's, nothing hangs, all counted -----

TARGETS = ["model", pytest.param("verilator", marks=pytest.mark.cocotb)]
RESERVED_MICRO_OP = 63         # a micro-instruction whose opcode is reserved (illegal)


def _speculative_run(target, graph, xs, guess, *, inject=None, watchdog=None):
    """Run ``xs`` on the speculative program for ``guess`` (its kernel changed by
    ``inject(body, partition)``); returns (outputs, counters)."""
    if target != "model":
        require_simulator(target)
    program = compile_graph(graph, TileConfig(), speculate=guess, stable_layout=True)
    segment = program.segments[0]
    if inject is not None:
        spec = max(segment.kernels)                   # the speculative kernel's slot
        segment.kernels[spec] = inject(segment.kernels[spec], program.partition)
    with open_transport(target, config=TileConfig()) as transport:
        dev = Device(transport)
        load_program(dev, program)
        if watchdog is not None:
            dev.regs.WATCHDOG.write(limit=watchdog)
        y, _ = infer(dev, program, xs)
        return y, dev.counters()


@pytest.mark.parametrize("target", TARGETS)
def test_forced_mispredictions_roll_back_in_a_few_cycles(target):
    graph = exit_net(1, threshold=128)              # never exits: every guess of 0 misses
    xs = _samples(graph, 6)
    y, counters = _speculative_run(target, graph, xs, 0)
    assert np.array_equal(y, _reference(graph, xs))
    assert (counters["spec_hits"], counters["spec_misses"]) == (0, len(xs))
    assert counters["spec_faults"] == 0 and counters["faults"] == 0
    assert counters["rollback_cycles"] <= 8 * len(xs)   # a handful per miss, no host


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fault", ["partition", "illegal"])
def test_a_fault_inside_the_region_is_a_miss(target, fault):
    """A scratchpad access beyond the partition, or a reserved micro-instruction, in the
    speculative kernel: each run rolls back to the fallback, which gives the outputs."""
    def inject(body, partition):
        bad = dma_load(gmem=0, spad=partition[1] + 4) if fault == "partition" else \
            RESERVED_MICRO_OP
        return body[:3] + [bad] + body[3:]

    graph = exit_net(1)
    xs = _samples(graph, 6)
    y, counters = _speculative_run(target, graph, xs, 0, inject=inject)
    assert np.array_equal(y, _reference(graph, xs))
    assert counters["spec_misses"] == counters["spec_faults"] == len(xs)
    assert counters["spec_hits"] == 0 and counters["faults"] == 0


@pytest.mark.parametrize("target", TARGETS)
def test_watchdog_inside_the_region_stops_the_tile(target):
    """The watchdog is not a miss (the guess did not cause it): the tile stops with the
    cause, the host raises, and after clear_fault the same program runs correctly."""
    if target != "model":
        require_simulator(target)
    graph = exit_net(1)
    xs = _samples(graph, 3)
    program = compile_graph(graph, TileConfig(), speculate=1, stable_layout=True)
    with open_transport(target, config=TileConfig()) as transport:
        dev = Device(transport)
        load_program(dev, program)
        dev.regs.WATCHDOG.write(limit=40)
        with pytest.raises(TileFault) as info:
            infer(dev, program, xs[:1])
        assert info.value.cause == FaultCause.WATCHDOG
        assert int(dev.counter("faults")) == 1 and int(dev.counter("spec_misses")) == 0
        dev.clear_fault()
        dev.regs.WATCHDOG.write(limit=0)
        y, _ = infer(dev, program, xs)
    assert np.array_equal(y, _reference(graph, xs))


# -- the speculation manager ------------------------------------------------------------------

def test_predictor_uses_the_data_when_it_beats_history():
    """Samples from two clusters in random order: history is right about half the
    time, the nearest samples always; the tournament picks the data predictor."""
    rng = np.random.default_rng(0)
    p = Predictor(2)
    centres = rng.integers(-100, 100, (2, 16))
    right = []
    for path in rng.integers(0, 2, 120):
        x = centres[path] + rng.integers(-5, 5, 16)
        guess, confidence, guesses = p.predict(x)
        right.append(guess == path)
        p.learn(x, path, guesses)
    assert p.accuracy("data") > 0.95 and p.accuracy("history") < 0.7
    assert all(right[-40:])


def _digits(name, n, *, sort=False):
    from fusetile.workloads.digits import load_split
    graph = _shipped(name)
    _, _, x, y = load_split()
    order = np.argsort(y[:n], kind="stable") if sort else np.arange(n)
    shape = (n,) + tuple(graph.tensors[graph.input].shape)
    return graph, graph.quantize_input(x[:n].reshape(shape))[order]


def _shipped(name):
    from importlib.resources import files
    from fusetile.host.onnx_import import load_model
    return load_model(str(files("fusetile.workloads") / f"digits_{name}.onnx"))


def _adaptive(target, graph, xs):
    with open_transport(target, config=TileConfig()) as transport:
        dev = Device(transport)
        runner = AdaptiveRunner(dev, graph)
        y, stats = runner.run(xs)
        return y, stats, runner


@pytest.mark.parametrize("name", ["exit", "moe"])
def test_adaptive_speculation_beats_the_static_plan(name):
    """The shipped early-exit and mixture-of-experts networks on shuffled digits:
    outputs equal the reference, every guess is a counted hit or miss, a miss rolls back
    in a few cycles, and the steady state takes fewer cycles than the static plan."""
    graph, xs = _digits(name, 200)
    y, stats, runner = _adaptive("model", graph, xs)
    assert np.array_equal(y, _reference(graph, xs))
    spec = stats.speculation
    assert spec.hits > spec.misses > 0
    assert spec.hits + spec.misses == spec.speculated
    assert spec.rollback_cycles <= 8 * spec.misses
    _, static = _run("model", graph, xs, "static")
    steady = stats.steady()
    assert steady["active_cycles"] / steady["samples"] < static.active_cycles / len(xs)
    assert sum(runner.profiler.routes[runner.speculator.select.name].values()) == len(xs)


def test_threshold_follows_the_measurements_on_a_class_sorted_stream():
    graph, xs = _digits("exit", 200, sort=True)
    y, stats, runner = _adaptive("model", graph, xs)
    assert np.array_equal(y, _reference(graph, xs))
    spec = runner.speculator
    # measured: an exit hit saves little and a miss costs the head again, so guessing
    # "exit" needs more confidence than guessing "continue"
    assert spec.threshold(0) > spec.threshold(1)
    assert spec.threshold(0) != spec.prior
    windows = stats.speculation.windows(50)
    assert len({tuple(w["thresholds"]) for w in windows}) > 1
    assert sum(sum(w["paths"].values()) for w in windows) == len(xs)


@pytest.mark.cocotb
def test_adaptive_speculation_on_verilator_matches_the_model():
    require_simulator("verilator")
    graph, xs = _digits("moe", 40)
    y_model, model_stats, _ = _adaptive("model", graph, xs)
    y_rtl, stats, _ = _adaptive("verilator", graph, xs)
    assert np.array_equal(y_rtl, y_model)
    assert np.array_equal(y_rtl, _reference(graph, xs))
    spec = stats.speculation
    assert spec.hits > 0 and spec.hits + spec.misses == spec.speculated
    assert spec.rollback_cycles <= 8 * spec.misses


def test_a_path_without_a_speculative_unit_runs_unspeculated():
    """On a tile whose staging buffer cannot hold the result, no speculative plan
    compiles: the runtime says so once per path and runs the fallback, correctly."""
    config = TileConfig(staging_words=8)
    graph = exit_net(1)
    xs = _samples(graph, 30)
    with open_transport("model", config=config) as transport:
        runner = AdaptiveRunner(Device(transport), graph)
        y, stats = runner.run(xs)
    assert np.array_equal(y, _reference(graph, xs))
    assert stats.speculation.speculated == 0 and stats.speculation.hits == 0
    retired = [e for e in stats.speculation.log if e["action"] == "retire"]
    assert retired and all("staging buffer holds 8" in e["why"] for e in retired)
