"""Benchmarks measured by the tile's own counters.

``isa_suite`` runs the tiled matmul (``kernels/matmul.py``) for growing K, with and
without double-buffering, checks every output against NumPy, and reports MAC-array
utilisation = MACs / (cycles x R x C) from the counters: over the whole plan run, and in
steady state (the n-tile kernel calls only, from their trace records; None on a tile
without a trace FIFO).
"""

import numpy as np

from ..kernels.matmul import MatmulProblem, tiled_matmul, layout_operands, read_result, \
    reference


__all__ = ["ISA_SIZES", "run_matmul", "isa_suite"]


#: (m, n, k) of the ISA suite: K grows, M and N keep X resident and W streaming.
ISA_SIZES = ((32, 64, 32), (32, 64, 64), (32, 64, 128), (32, 64, 256))


def run_matmul(dev, problem, *, double_buffer, seed=0):
    """Run one tiled matmul on ``dev``; return its measurements (all from counters)."""
    cfg = dev.config
    program = tiled_matmul(cfg, problem, double_buffer=double_buffer)
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, size=(problem.k, problem.n), dtype=np.int8)
    x = rng.integers(-128, 128, size=(problem.m, problem.k), dtype=np.int8)
    w_image, x_image = layout_operands(cfg, w, x)
    wb = cfg.word_bytes
    dev.write_window("GMEM", program.w_at * wb, w_image)
    dev.write_window("GMEM", program.x_at * wb, x_image)

    dev.set_partition(0, base=0, length=program.partition_words)
    for slot, body in program.kernels.items():
        dev.load_kernel(slot, body, part=0)
    dev.load_plan(program.plan)
    dev.read_trace()
    dev.clear_counters()
    dev.start()
    dev.wait_done(timeout_cycles=10_000_000, poll_cycles=1024)
    counters = dev.counters()
    trace = dev.read_trace()

    out_words = problem.n * problem.m // cfg.cols
    got = read_result(cfg, problem, dev.read_window("GMEM", program.y_at * wb, out_words * wb))
    correct = bool(np.array_equal(got, reference(problem, w, x)))

    array = cfg.rows * cfg.cols
    tiles = [r for r in trace if r.slot in program.tile_slots]
    tile_cycles = sum(int(r.cycles) for r in tiles)
    tile_macs = len(tiles) * (problem.m // cfg.cols) * problem.k * array
    return {
        "m": problem.m, "n": problem.n, "k": problem.k,
        "double_buffer": double_buffer,
        "correct": correct,
        "cycles": counters["active_cycles"],
        "macs": counters["macs"],
        "mac_utilization": counters["macs"] / (counters["active_cycles"] * array),
        # (None on a tile without a trace FIFO: no calls to tell apart.)
        "steady_mac_utilization": (tile_macs / (tile_cycles * array) if tile_cycles else 0.0)
                                  if cfg.traced else None,
        "dma_bytes_in": counters["dma_bytes_in"],
        "dma_bytes_out": counters["dma_bytes_out"],
        "stall_dma": counters["stall_dma"],
        "stall_compute": counters["stall_compute"],
        "bank_conflicts": counters["bank_conflicts"],
        "trace_dropped": dev.trace_dropped(),
    }


def isa_suite(dev, *, sizes=ISA_SIZES, progress=None):
    """The ISA benchmark: every size with and without double-buffering."""
    results = []
    for m, n, k in sizes:
        for double_buffer in (False, True):
            results.append(run_matmul(dev, MatmulProblem(m=m, n=n, k=k),
                                      double_buffer=double_buffer))
            if progress is not None:
                progress(len(results))
    return results


# -- workloads under the three policies -------------------------------------------------

#: The shipped workloads the ``workloads`` suite runs (``workloads/digits_<name>.onnx``).
WORKLOADS = ("mlp", "cnn", "rescnn", "exit", "moe")

#: The counters of a speculative region (the ``speculation`` object of a row).
_SPEC = ("spec_hits", "spec_misses", "rollback_cycles")

#: The clock the warm-up figure converts host compile time at (issue 7's goal for the
#: ULX3S build): the tile keeps running while the host compiles, so the compile costs
#: no tile cycles; this says how many inferences' savings a host second is worth.
CLOCK_HZ = 100e6


def _workload(name):
    from pathlib import Path
    from ..workloads import digits
    from .onnx_import import load_model
    return load_model(str(Path(digits.__file__).with_name(f"digits_{name}.onnx")))


def _row(name, policy, target, samples, totals, program, cfg):
    """One result row from counter totals over ``samples`` inferences."""
    array = cfg.rows * cfg.cols
    n = max(samples, 1)
    cycles = totals["active_cycles"] / n
    macs = totals["macs"] / n
    # compulsory traffic per inference: the input and output maps, and every weight
    # and table once per run of ``lanes`` samples
    words = program.input.words + program.output.words + program.constant_words
    return {
        "workload": name, "policy": policy, "target": target, "inferences": samples,
        "cycles_per_inference": cycles,
        "gmem_bytes_per_inference": (totals["dma_bytes_in"] + totals["dma_bytes_out"]) / n,
        "macs_per_inference": macs,
        "mac_utilization": totals["macs"] / (totals["active_cycles"] * array)
        if totals["active_cycles"] else 0.0,
        "roofline_cycles": max(macs / array, words / program.lanes),
        "fusions": 0, "defusions": 0, "swap_idle_cycles": 0,
        "resident_constants": program.resident,
    }


def _speculation(counters, stats=None):
    """A row's ``speculation`` object: hits, misses and rollback latency from the
    tile's counters; the predictor's accuracy (adaptive only)."""
    if stats is not None:
        return stats.summary() | {"windows": stats.windows(), "log": stats.log}
    misses = counters["spec_misses"]
    return {"hits": counters["spec_hits"], "misses": misses, "rollbacks": misses,
            "rollback_cycles": counters["rollback_cycles"] / misses if misses else 0,
            "predictor_accuracy": None, "speculated_runs": 0}


def _routes(dev, graph):
    """How often each path of the graph's choice ran, from the tile's branch counters
    (a threshold's BRANCH tests flag 0 and is taken to path 0); None for a SWITCH (no
    counter: the adaptive runtime's profiler counts those) and on a tile without
    branch counters."""
    from ..kernels.graph import Select
    sel = next(op for op in graph.ops if isinstance(op, Select))
    branches = dev.branch_counters()
    if sel.mode != "threshold" or not branches:
        return None
    flag0 = branches[0]
    return {sel.name: {"0": int(flag0["taken"]), "1": int(flag0["not_taken"])}}


def _is_flow(graph):
    from ..kernels.graph import Select
    return any(isinstance(op, Select) for op in graph.ops)


def workload_suite(dev, x_by_name=None, *, names=WORKLOADS, samples=256, target="?",
                   cache=None, progress=None, skipped=None):
    """Every shipped workload under ``none``, ``static`` and ``adaptive`` on ``dev``:
    rows of the ``fusetile bench`` JSON (see docs/performance.md). A workload that
    does not compile for the tile's configuration (a small board's: too few kernel
    slots for a data-dependent network's plan) raises its
    :class:`~fusetile.kernels.compiler.CompileError`, or, given a list ``skipped``, is
    left out and appended to it as ``{"workload", "reason"}``. ``adaptive``'s cycle
    figures are its steady state: the runs on the plan it settled on (with speculation,
    all the runs: only the same samples compare), and its row carries the trace of its
    last run (``trace``, for ``fusetile report``). The data-dependent workloads' rows carry
    ``speculation``; they also run ``adaptive`` on the same digits sorted by class (a
    distribution shift), a row with ``stream`` ``"class-sorted"`` whose speculation
    has per-window figures."""
    from ..kernels.compiler import CompileError, compile_graph
    from ..workloads.digits import load_split
    from .adaptive import AdaptiveRunner
    from .runner import infer, load_program

    cfg = dev.config
    if x_by_name is None:
        _, _, x_test, y_test = load_split()
        x_test, y_test = x_test[:samples], y_test[:samples]
    results, done = [], 0

    def mismatches(y, ref):
        return int(np.sum(np.any((y != ref).reshape(len(y), -1), axis=1)))

    def adaptive(name, graph, x, ref, stream):
        runner = AdaptiveRunner(dev, graph, cache=cache)
        y, stats = runner.run(x)
        steady = stats.steady()
        row = _row(name, "adaptive", target, steady["samples"], steady, runner.program, cfg)
        row["inferences"] = len(x)
        row.update(stream=stream, fusions=stats.fusions, defusions=stats.defusions,
                   swap_idle_cycles=stats.swap_idle_cycles, jit_compiles=stats.jit_compiles,
                   output_mismatches=mismatches(y, ref), fusion_log=runner.engine.log,
                   trace=runner.profiler.last_trace,
                   profiler_reads_per_inference=runner.profiler.reads_per_inference())
        static = next(r for r in results if r["workload"] == name and r["policy"] == "static")
        saved = static["cycles_per_inference"] - row["cycles_per_inference"]
        seconds = runner.compile_seconds
        if runner.speculator is not None:
            row["speculation"] = _speculation(None, stats.speculation)
            row["routes"] = {k: {str(p): n for p, n in sorted(v.items())}
                             for k, v in runner.profiler.routes.items()}
            first = len(x) // 4
            seconds += runner.speculator.compile_seconds
        else:
            first = sum(r["samples"] for r in stats.runs_log
                        if r["plan"] < stats.runs_log[-1]["plan"])
        row["warmup_inferences"] = (first + int(np.ceil(seconds * CLOCK_HZ / saved))) \
            if saved > 0 else None
        return row

    for name in names:
        graph = _workload(name)
        flow = _is_flow(graph)
        shape = tuple(graph.tensors[graph.input].shape)
        x = graph.quantize_input(x_test.reshape((len(x_test),) + shape)) \
            if x_by_name is None else x_by_name[name]
        outputs = {}
        try:
            programs = {policy: compile_graph(graph, cfg, policy=policy)
                        for policy in ("none", "static")}
        except CompileError as e:
            if skipped is None:
                raise
            skipped.append({"workload": name, "reason": str(e)})
            done += 3
            if progress:
                progress(done)
            continue
        for policy, program in programs.items():
            load_program(dev, program)
            outputs[policy], stats = infer(dev, program, x)
            totals = {c: getattr(stats, c) for c in ("active_cycles", "dma_bytes_in",
                                                     "dma_bytes_out", "macs")}
            row = _row(name, policy, target, len(x), totals, program, cfg)
            row["stream"] = "shuffled"
            row["output_mismatches"] = mismatches(outputs[policy], outputs["none"])
            row["warmup_inferences"] = 0
            if flow:
                counters = dev.counters()
                row["speculation"] = _speculation({c: int(counters[c]) for c in _SPEC})
                row["routes"] = _routes(dev, graph)
            results.append(row)
            done += 1
            if progress:
                progress(done)
        results.append(adaptive(name, graph, x, outputs["none"], "shuffled"))
        if flow and x_by_name is None:
            order = np.argsort(y_test, kind="stable")
            results.append(adaptive(name, graph, x[order], outputs["none"][order],
                                    "class-sorted"))
        done += 1
        if progress:
            progress(done)
    return results
