"""Running a compiled graph (:mod:`fusetile.kernels.compiler`) on a :class:`Device`.

Every number this module reports comes from the tile's counters (on the ``model``
target, from the golden model's estimate of them).
"""

from dataclasses import dataclass

import numpy as np


__all__ = ["RunStats", "load_program", "infer"]


#: Counters summed over a run.
_COUNTED = ("active_cycles", "dma_bytes_in", "dma_bytes_out", "macs", "kernel_calls")


@dataclass
class RunStats:
    """Totals over ``samples`` inferences, from the tile's counters."""
    samples: int
    runs: int                  # plan runs: one per segment per group of lanes
    active_cycles: int
    dma_bytes_in: int
    dma_bytes_out: int
    macs: int
    kernel_calls: int
    array: int                 # R x C

    def per_inference(self):
        n = max(self.samples, 1)
        cycles = self.active_cycles / n
        return {
            "cycles_per_inference": cycles,
            "gmem_bytes_per_inference": (self.dma_bytes_in + self.dma_bytes_out) / n,
            "macs_per_inference": self.macs / n,
            "kernel_calls_per_inference": self.kernel_calls / n,
            "mac_utilization": self.macs / (self.active_cycles * self.array)
            if self.active_cycles else 0.0,
        }


def load_program(dev, program):
    """Write the program's GMEM image and partition; load its kernels and plan if it
    has one segment (else :func:`infer` loads each segment in turn)."""
    cfg = dev.config
    if program.config != cfg:
        raise ValueError("the program was compiled for another hardware profile")
    dev.write_window("GMEM", 0, program.gmem)
    base, length = program.partition
    dev.set_partition(0, base=base, length=length)
    if len(program.segments) == 1:
        _load_segment(dev, program.segments[0])


def _load_segment(dev, segment):
    """Kernels, then the plan into the inactive bank and a swap to it; a speculative
    plan's fallback goes first, so that it ends up in the other bank."""
    for slot, body in segment.kernels.items():
        dev.load_kernel(slot, body, part=0)
    if segment.fallback is not None:
        dev.load_plan(segment.fallback)
    dev.load_plan(segment.plan)


def infer(dev, program, x, *, progress=None, profiler=None, timeout_cycles=50_000_000):
    """Run ``x`` (int8, ``(N, *input shape)``) through ``program``, ``program.lanes``
    samples per plan run. Returns ``(y int8 (N, *output shape), RunStats)``.

    ``progress(done, total)`` is called after each group of samples; a
    :class:`~fusetile.host.profiler.Profiler` collects the trace of every run.
    """
    cfg = dev.config
    wb = cfg.word_bytes
    graph = program.graph
    x = np.asarray(x, dtype=np.int8)
    n = len(x)
    in_shape = graph.tensors[graph.input].shape
    out_shape = graph.tensors[graph.output].shape
    if x.shape[1:] != tuple(in_shape):
        raise ValueError(f"samples must have shape {tuple(in_shape)}, not {x.shape[1:]}")
    ys = []
    if profiler is not None:
        profiler.reset(dev)
    dev.clear_counters()
    runs = 0
    for start in range(0, n, program.lanes):
        group = x[start:start + program.lanes]
        dev.write_window("GMEM", program.input.at * wb, program.input.image(group, wb))
        for segment in program.segments:
            if len(program.segments) > 1:
                _load_segment(dev, segment)
            dev.start()
            dev.wait_done(timeout_cycles=timeout_cycles,
                          on_poll=profiler and (lambda: profiler.poll(dev)))
            runs += 1
            if profiler is not None:
                profiler.collect(dev, segment, len(group))
        raw = dev.read_window("GMEM", program.output.at * wb, program.output.words * wb)
        ys.append(program.output.samples(raw, len(group), wb).reshape((len(group),) +
                                                                      tuple(out_shape)))
        if progress:
            progress(min(start + program.lanes, n), n)
    counters = dev.counters()
    stats = RunStats(n, runs, *(int(counters[c]) for c in _COUNTED),
                     array=cfg.rows * cfg.cols)
    y = np.concatenate(ys) if ys else np.zeros((0,) + tuple(out_shape), dtype=np.int8)
    return y, stats
