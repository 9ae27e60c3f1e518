"""A tiled int8 matmul with requantisation: the kernels and plan, and the data layout.

This is the first kernel of the library: it computes ``Y = requantize(W^T X)`` for
``W`` of shape (K, N) and ``X`` of shape (M, K) on the R x C MAC array, output-stationary:
each MATMUL accumulates one R x C tile of Y over all of K in the array's accumulators.

Layout in GMEM (words of ``word_bytes`` int8 lanes):

* ``W`` as N/R *n-tiles* of K words; word t of n-tile j holds W[t, jR .. jR+R-1];
* ``X`` as M/C *m-tiles* of K words; word t of m-tile i holds X[iC .. iC+C-1, t];
* ``Y`` as N/R n-tiles of (M/C) x R words; word r of the block (j, i) holds
  Y[jR + r, iC .. iC+C-1].

All of X stays in the scratchpad; the n-tiles of W stream through it. With
``double_buffer`` each kernel call prefetches the next n-tile into the other half of a
double buffer, and stores the previous n-tile's outputs from the other half of a second
one, while the MAC array works on this one (the DMA queue runs beside the compute
unit), so DMA time hides behind compute; without it, each call loads its n-tile,
computes, and stores.
"""

from dataclasses import dataclass

import numpy as np

from .config import TileConfig
from .isa import GmemBase, VectorCfg
from .program import call, done, dma_load, dma_store, wait, ret, matmul, requant, vcfg
from . import arith


__all__ = ["MatmulProblem", "MatmulProgram", "tiled_matmul", "layout_operands", "reference"]


@dataclass(frozen=True)
class MatmulProblem:
    """Sizes and requantisation of ``Y = requantize(W^T X)``.

    ``m`` must be a multiple of the array's columns and ``n`` of its rows.
    """
    m: int
    n: int
    k: int
    mult: int = 1 << 30
    shift: int = 8
    zp: int = 0


@dataclass
class MatmulProgram:
    """What to load: GMEM addresses (words), kernels per slot, the plan, the partition."""
    w_at: int
    x_at: int
    y_at: int
    kernels: dict
    plan: list
    partition_words: int
    tile_slots: tuple


def tiled_matmul(config, problem, *, double_buffer=True, gmem_base=0):
    """Build the kernels and plan for ``problem`` on a tile with ``config``.

    Raises
    ------
    ValueError
        If the sizes do not tile the array or the data does not fit the scratchpad,
        GMEM, a kernel slot or a plan bank.
    """
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")
    R, C, K = config.rows, config.cols, problem.k
    if problem.m % C or problem.n % R or problem.m <= 0 or problem.n <= 0:
        raise ValueError(f"m must be a positive multiple of {C} and n of {R}, "
                         f"not m={problem.m}, n={problem.n}")
    if not 1 <= K <= 4095:
        raise ValueError(f"k must be from 1 to 4095, not {K!r}")
    m_tiles, n_tiles = problem.m // C, problem.n // R

    # Scratchpad: X, then two W buffers offset by one word so that a MATMUL's two
    # operand streams never share a bank, then two output buffers.
    x_spad = 0
    w_spad = (m_tiles * K + 1, m_tiles * K + 1 + K)
    y_block = m_tiles * R
    y_spad = (w_spad[1] + K, w_spad[1] + K + y_block)
    partition_words = y_spad[1] + y_block
    if partition_words > config.spad_words:
        raise ValueError(f"m={problem.m}, k={K} needs {partition_words} scratchpad words, "
                         f"the tile has {config.spad_words}")

    w_at = gmem_base
    x_at = w_at + n_tiles * K
    y_at = x_at + m_tiles * K
    scratch_at = y_at + n_tiles * y_block       # where the first call "stores" nothing
    if (scratch_at + y_block) * config.word_bytes > config.gmem_bytes:
        raise ValueError("the operands do not fit GMEM")

    def compute(buf):
        body = []
        for i in range(m_tiles):
            body += [matmul(a=w_spad[buf], b=x_spad + i * K, k=K),
                     requant(out=y_spad[buf] + i * R)]
        return body

    def store(buf, base):
        return dma_store(gmem=0, spad=y_spad[buf], cols=y_block, base=base)

    kernels = {0: [dma_load(gmem=0, spad=x_spad, cols=m_tiles * K, base=GmemBase.ARG0),
                   dma_load(gmem=0, spad=w_spad[0], cols=K, base=GmemBase.ARG1),
                   vcfg(VectorCfg.MULT_A, problem.mult), vcfg(VectorCfg.SHIFT, problem.shift),
                   vcfg(VectorCfg.ZP_OUT, problem.zp), vcfg(VectorCfg.LO, -128),
                   vcfg(VectorCfg.HI, 127), ret()]}
    plan = [call(0, a=x_at, b=w_at)]
    if double_buffer:
        # Call j computes n-tile j from one W buffer while the DMA, in the background,
        # fetches n-tile j+1 into the other (CALL argument a) and stores n-tile j-1's
        # outputs (argument b); a last call stores n-tile N-1's.
        for buf in (0, 1):
            kernels[1 + buf] = [
                dma_load(gmem=0, spad=w_spad[1 - buf], cols=K, base=GmemBase.ARG0, token=1),
                store(1 - buf, GmemBase.ARG1),
            ] + compute(buf) + [ret()]
        for j in range(n_tiles):
            nxt = w_at + ((j + 1) % n_tiles) * K       # the last call reloads n-tile 0
            prev = y_at + (j - 1) * y_block if j else scratch_at
            plan.append(call(1 + j % 2, a=nxt, b=prev))
        last = (n_tiles - 1) % 2
        kernels[3] = [store(last, GmemBase.ARG1), ret()]
        plan.append(call(3, b=y_at + (n_tiles - 1) * y_block))
        tile_slots = (1, 2)
    else:
        kernels[1] = [dma_load(gmem=0, spad=w_spad[0], cols=K, base=GmemBase.ARG0),
                      wait()] + compute(0) + [store(0, GmemBase.ARG1), ret()]
        for j in range(n_tiles):
            plan.append(call(1, a=w_at + j * K, b=y_at + j * y_block))
        tile_slots = (1,)
    plan.append(done())

    for slot, body in kernels.items():
        if len(body) > config.slot_depth or slot >= config.kernel_slots:
            raise ValueError(f"kernel {slot} ({len(body)} instructions) does not fit the "
                             f"tile's kernel slots")
    if len(plan) > config.plan_depth:
        raise ValueError(f"the plan ({len(plan)} instructions) does not fit a plan bank")
    return MatmulProgram(w_at, x_at, y_at, kernels, plan, partition_words, tile_slots)


def layout_operands(config, w, x):
    """GMEM images (bytes) of ``w`` (K, N) and ``x`` (M, K) in the tiled layout."""
    R, C, wb = config.rows, config.cols, config.word_bytes
    k, n = w.shape
    m = x.shape[0]
    w_tiles = np.zeros((n // R, k, wb), dtype=np.int8)
    w_tiles[:, :, :R] = w.reshape(k, n // R, R).transpose(1, 0, 2)
    x_tiles = np.zeros((m // C, k, wb), dtype=np.int8)
    x_tiles[:, :, :C] = x.reshape(m // C, C, k).transpose(0, 2, 1)
    return w_tiles.tobytes(), x_tiles.tobytes()


def read_result(config, problem, raw):
    """Y (N, M) from the GMEM image of the output blocks."""
    R, C, wb = config.rows, config.cols, config.word_bytes
    m_tiles, n_tiles = problem.m // C, problem.n // R
    blocks = np.frombuffer(raw, dtype=np.int8).reshape(n_tiles, m_tiles, R, wb)[..., :C]
    return blocks.transpose(0, 2, 1, 3).reshape(problem.n, problem.m)


def reference(problem, w, x):
    """Y = requantize(W^T X^T) as the tile computes it: (N, M) int8."""
    acc = w.astype(np.int64).T @ x.astype(np.int64).T
    acc = ((acc + 2**31) % 2**32 - 2**31).astype(np.int32)
    y, _ = arith.requantize(acc, problem.mult, problem.shift, problem.zp, -128, 127)
    return y
