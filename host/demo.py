"""The spine demo: a plan that moves a matrix through the scratchpad with DMA kernels.

A ``rows x cols``-word matrix in GMEM is copied to another GMEM region in row blocks:
each block is one CALL of a kernel that loads it into the slot's scratchpad partition
and stores it back with a different row stride (so the copy also re-lays the matrix
out). The result is checked against NumPy, and the tile's own counters and trace say
what it cost.
"""

import numpy as np

from ..kernels.isa import GmemBase
from ..kernels.program import call, done, mark, dma_load, dma_store, wait, ret


__all__ = ["run_dma_demo"]


def run_dma_demo(dev, *, inferences=4, rows=16, cols=8, block_rows=4, progress=None):
    """Run the demo plan ``inferences`` times on ``dev``; return counters and checks.

    Parameters
    ----------
    dev : Device
    inferences : int
        Plan runs (each one START ... DONE).
    rows, cols : int
        Matrix size in words.
    block_rows : int
        Rows per kernel call (what fits the partition).
    progress : callable or None
        Called with the number of finished inferences.
    """
    if rows % block_rows:
        raise ValueError(f"rows must be a multiple of block_rows ({block_rows}), not {rows!r}")
    cfg = dev.config
    wb = cfg.word_bytes
    src, dst, dst_stride = 0, rows * cols, cols + 2
    if (dst + rows * dst_stride) * wb > cfg.gmem_bytes:
        raise ValueError(f"a {rows}x{cols}-word demo does not fit {cfg.gmem_bytes} bytes of GMEM")

    rng = np.random.default_rng(0)
    matrix = rng.integers(0, 256, size=(rows, cols * wb), dtype=np.uint8)
    dev.write_window("GMEM", src * wb, matrix.tobytes())
    dev.write_window("GMEM", dst * wb, bytes(rows * dst_stride * wb))

    dev.set_partition(0, base=0, length=block_rows * cols)
    dev.load_kernel(0, [
        dma_load(gmem=0, spad=0, rows=block_rows, cols=cols, base=GmemBase.ARG0),
        wait(),
        dma_store(gmem=0, spad=0, rows=block_rows, cols=cols, gmem_stride=dst_stride,
                  base=GmemBase.ARG1),
        ret(),
    ], part=0)
    plan = []
    for block in range(rows // block_rows):
        plan += [mark(block), call(0, a=src + block * block_rows * cols,
                                   b=dst + block * block_rows * dst_stride)]
    plan.append(done())
    dev.load_plan(plan)

    dev.clear_counters()
    trace = []
    for i in range(inferences):
        dev.start()
        dev.wait_done(poll_cycles=32)
        trace = dev.read_trace()
        if progress is not None:
            progress(i + 1)

    out = np.frombuffer(dev.read_window("GMEM", dst * wb, rows * dst_stride * wb),
                        dtype=np.uint8).reshape(rows, dst_stride * wb)[:, :cols * wb]
    counters = dev.counters()
    return {
        "inferences": inferences,
        "matrix_words": [rows, cols],
        "correct": bool(np.array_equal(out, matrix)),
        "counters": counters,
        "cycles_per_inference": counters["active_cycles"] / inferences,
        "trace": [{"slot": int(r.slot), "pc": int(r.pc), "start": int(r.start),
                   "cycles": int(r.cycles), "dma_busy": int(r.dma_busy),
                   "bytes_in": int(r.bytes_in), "bytes_out": int(r.bytes_out)}
                  for r in trace],
    }
