"""Benchmarks measured by the tile's own counters.

``isa_suite`` runs the tiled matmul (``kernels/matmul.py``) for growing K, with and
without double-buffering, checks every output against NumPy, and reports MAC-array
utilisation = MACs / (cycles x R x C) from the counters: over the whole plan run, and in
steady state (the n-tile kernel calls only, from their trace records).
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
        "steady_mac_utilization": tile_macs / (tile_cycles * array) if tile_cycles else 0.0,
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
