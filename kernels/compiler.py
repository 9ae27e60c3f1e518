"""The kernel compiler: an integer graph (:mod:`fusetile.kernels.graph`) -> kernels,
plans and a GMEM image for one tile configuration.

**Lanes carry samples.** A word holds one value of up to ``word_bytes`` samples, one
per lane, so a run of the compiled plan infers ``lanes`` samples at once and every
tensor element is one word. The MAC array's ``a`` operand is a word of R output
channels (weights), its ``b`` operand a word of C samples (activations): a MATMUL
over a contraction of k words gives R output channels for C samples, and REQUANT
writes them as R words, one per channel, which is again the activation layout. No
operator needs to shift bytes inside a word, so every access pattern is a word
address pattern the DMA and the MATMUL generate. (The cost: with one sample, 1/C of
the array works. Putting output positions in lanes instead needs a byte-granular
im2col in the DMA, left for later.)

**Feature maps** ``(C, H, W)`` live in GMEM in HWC order, word ``(h, w, c)`` at
``at + ((h + t) * Wp + w + l) * C + c`` inside a *ring* of ``t, l, b, r`` words
(``Wp = W + l + r``) that holds the padding value of its consumers (the input zero
point for a convolution, -128 for a max-pool). Vectors ``(K,)`` are ``(K, 1, 1)``.

**Operators -> kernels.** Conv, Dense (a convolution whose window is its whole input
map, weights permuted to HWC order, so Flatten moves nothing) and AvgPool (a
convolution with one-hot weights, exact in int32) run as one *convolution kernel*: per
call a chunk of output pixels of one row: the DMA gathers each pixel's window (kh
rows of kw x Ci consecutive words) into a contiguous patch (a word-level im2col),
then per pixel and per group of R output channels ACC_BIAS, one MATMUL over the
patch, REQUANT with a per-channel table into a row buffer, stored by the DMA. MaxPool
pools whole rows with VPOOL (a horizontal then a vertical pass), Add is VADD, Clamp is
VCLAMP, row by row.

**Policies.** ``none``: one kernel per operator, every intermediate through GMEM.
``static``: a fixed rule set like TVM's FuseOps: a convolution whose only consumer
is an unpadded max-pool is fused with it into one kernel that computes the conv rows
of a pooled row into the scratchpad, pools them there and stores only the pooled row
(bias, requantisation and a ReLU are part of every convolution kernel in both
policies).

**Tiling.** A convolution whose weights do not fit the scratchpad beside its input
windows runs in *passes* over groups of R output channels (each pass its own kernel,
storing its channels with a strided DMA); one whose weights do not fit even one group
at a time *streams* them: per call one output pixel, the contraction cut into chunks,
each group's weight chunks double-buffered so the DMA loads the next while the MAC
array works on the current one, the partial sums kept in the accumulators. A max-pool
takes as many output pixels of a row per call as fit. The choices are recorded in
``Program.tilings``.

Kernels address the scratchpad at fixed offsets and GMEM relative to the CALL's
arguments, so one kernel body serves every chunk of an operator; the plan is the
sequence of CALLs. A program longer than a plan bank, or with more distinct kernels
than slots, is cut into *segments* run one after the other.
"""

from dataclasses import dataclass, replace

import numpy as np

from .config import TileConfig
from .graph import (Add, AvgPool, Clamp, Conv, Dense, Flatten, Graph, GraphError, MaxPool,
                    Requant, Select, avgpool_requant, op_inputs)
from .isa import CmpOp, GmemBase, PlanInstr, PlanOp, VectorCfg
from .program import (acc_bias, assume, branch, call, commit, dma_load, dma_store, done,
                      jump, matmul, requant, ret, switch, vadd, vargmax, vcfg, vclamp, vcmp,
                      vpool, wait)


__all__ = ["POLICIES", "Buffer", "Tiling", "Segment", "Program", "CompileError", "compile_graph",
           "resident"]


POLICIES = ("none", "static")

_MAX_COLS = 4095          # DMA rows / cols fields
_MAX_K = 2**16 - 1        # MATMUL k field
_MAX_WINDOW = 15          # VPOOL window field

#: Before a DMA stores what compute instructions wrote: the compute unit runs beside
#: the sequencer, so without it the store could read the words before they are
#: written (a race the golden model, which completes compute at issue, cannot see).
_DRAIN = wait(compute=True)

_SELECT_FLAG = 0          # the flag a threshold Select's kernel sets (1: path 0)
_SELECT_INDEX = 0         # the index register an argmax Select's kernel sets
_GUARD_FLAG = 1           # the flag a speculative argmax sets (1: the guess was right)
_VECTOR_OPS = (Dense, Add, Clamp)     # what a speculative unit runs


class CompileError(GraphError):
    """A graph the compiler cannot fit on this tile configuration."""


@dataclass
class Buffer:
    """A feature map in GMEM (see the module docstring for the layout)."""
    name: str
    shape: tuple              # (C, H, W)
    at: int = 0               # word address of the first word of the ring
    ring: tuple = (0, 0, 0, 0)
    pad_value: int = None     # the ring's value, None while no consumer pads

    @property
    def C(self):
        return self.shape[0]

    @property
    def Hp(self):
        return self.shape[1] + self.ring[0] + self.ring[2]

    @property
    def Wp(self):
        return self.shape[2] + self.ring[1] + self.ring[3]

    @property
    def words(self):
        return self.Hp * self.Wp * self.C

    def word(self, h, w, c=0):
        """Address of element (c, h, w); h, w may reach into the ring."""
        return self.at + ((h + self.ring[0]) * self.Wp + w + self.ring[1]) * self.C + c

    def image(self, samples, word_bytes):
        """GMEM bytes of the buffer holding int8 ``samples`` (N <= lanes, C, H, W)."""
        lanes = np.full((self.Hp, self.Wp, self.C, word_bytes), self.pad_value or 0,
                        dtype=np.int8)
        t, l = self.ring[0], self.ring[1]
        H, W = self.shape[1:]
        s = np.asarray(samples, dtype=np.int8).reshape((-1,) + tuple(self.shape))
        lanes[t:t + H, l:l + W, :, :len(s)] = s.transpose(2, 3, 1, 0)
        return lanes.tobytes()

    def samples(self, raw, count, word_bytes):
        """int8 ``(count, C, H, W)`` from the buffer's GMEM bytes."""
        lanes = np.frombuffer(raw, dtype=np.int8).reshape(self.Hp, self.Wp, self.C, word_bytes)
        t, l = self.ring[0], self.ring[1]
        H, W = self.shape[1:]
        return lanes[t:t + H, l:l + W, :, :count].transpose(3, 2, 0, 1).copy()


@dataclass
class Tiling:
    """How a convolution kernel (Conv, Dense, AvgPool) was cut to fit the tile."""
    passes: int               # passes over groups of R output channels
    pixels: int               # output pixels per call
    streamed: bool = False    # weights streamed in chunks (they do not fit resident)
    chunks: int = 1           # chunks of the contraction per group (streamed)


@dataclass
class Segment:
    """Kernels to load (slot -> micro-instructions) and a plan to run; ``units[pc]``
    names the unit (an op, or ops fused into one kernel, joined by ``+``) that the
    CALL at plan pc ``pc`` runs part of.

    A speculative plan comes with its ``fallback``: the plan the other bank must hold
    (an ASSUME's miss continues there), with its ``fallback_units``; ``kernels`` are
    those both plans call."""
    kernels: dict
    plan: list
    units: list
    fallback: list = None
    fallback_units: list = None


@dataclass
class Program:
    """A compiled graph: load ``gmem`` (bytes from word 0) and the partition, then per
    run of ``lanes`` samples write the input buffer, run every segment, read the
    output buffer."""
    config: TileConfig
    graph: Graph
    policy: str
    segments: list
    gmem: bytes
    input: Buffer
    output: Buffer
    partition: tuple           # (base, length) of partition 0, used by every kernel
    lanes: int
    calls: int = 0
    tilings: dict = None      # convolution-kernel op name -> Tiling
    groups: list = None       # the units, each a tuple of op names
    constant_words: int = 0   # weights, biases and tables in the GMEM image
    speculation: tuple = None  # (Select op name, the path its plan assumes)
    #: The micro-instructions that load constants the kernel keeps resident in the
    #: scratchpad (weights, biases, tables): what :func:`resident` leaves out.
    constant_loads: frozenset = frozenset()
    resident: bool = False    # constants left in the scratchpad by the runs before


# -- the convolution kernel -----------------------------------------------------------------

@dataclass
class _ConvSpec:
    """A convolution as the kernel runs it (Dense and AvgPool lowered to it)."""
    name: str
    x: str
    y: str
    weight: np.ndarray        # (Co, Ci, KH, KW) int8 (int16: see _ConvConsts)
    bias: np.ndarray          # (Co,) int32, the input zero point folded in
    requants: list            # requantisation tables (Requant), usually one
    stride: tuple
    pads: tuple
    lo: int
    hi: int
    op: str
    table_of: np.ndarray = None   # (OH, OW): each output pixel's table, if not all 0

    def table(self, oh, ow):
        return 0 if self.table_of is None else int(self.table_of[oh, ow])


def _conv_spec(op, tensors, x_name, x_shape):
    zx = tensors[x_name].zero_point
    if isinstance(op, Dense):
        C, H, W = x_shape
        weight = _weights(op).reshape(-1, C, H, W)
        return _ConvSpec(op.name, x_name, op.y, weight, _fold(op.bias, weight, zx),
                         [op.requant], (1, 1), (0, 0, 0, 0), op.lo, op.hi, "Dense")
    if isinstance(op, Conv):
        weight = _weights(op)
        return _ConvSpec(op.name, op.x, op.y, weight, _fold(op.bias, weight, zx),
                         [op.requant], tuple(op.stride), tuple(op.pads), op.lo, op.hi, "Conv")
    # AvgPool: one-hot weights sum each channel's window exactly; the padding is the
    # zero point, which adds nothing. The divisor is the window's size, or without
    # count_include_pad the number of its elements inside the map: one requantisation
    # table per distinct count, each output pixel using its own.
    C, H, W = x_shape
    kh, kw = op.kernel
    sh, sw = op.stride
    t, l, b, r = op.pads
    if kh * kw * C > 2**16 - 1:
        raise CompileError(op.name, "AvgPool", "window too large")
    weight = np.zeros((C, C, kh, kw), dtype=np.int8)
    weight[np.arange(C), np.arange(C)] = 1
    OH, OW = (H + t + b - kh) // sh + 1, (W + l + r - kw) // sw + 1
    rows = [min(H, oh * sh - t + kh) - max(0, oh * sh - t) for oh in range(OH)]
    cols = [min(W, ow * sw - l + kw) - max(0, ow * sw - l) for ow in range(OW)]
    counts = np.outer(rows, cols) if any(op.pads) and not op.count_include_pad else \
        np.full((OH, OW), kh * kw)
    distinct = sorted(set(counts.reshape(-1).tolist()))
    requants = []
    for count in distinct:
        rq = avgpool_requant(op, tensors[op.x].scale, tensors[op.y].scale, count)
        requants.append(Requant(np.repeat(rq.multiplier, C), np.repeat(rq.shift, C)))
    table_of = np.vectorize(distinct.index)(counts) if len(distinct) > 1 else None
    return _ConvSpec(op.name, op.x, op.y, weight, _fold(np.zeros(C, np.int32), weight, zx),
                     requants, tuple(op.stride), tuple(op.pads), op.lo, op.hi, "AvgPool",
                     table_of)


def _weights(op):
    """An op's weights: int8, or int16 within -255..255 (split into planes)."""
    w = np.asarray(op.weight)
    if w.dtype == np.int8:
        return w
    if w.size and (w.min() < -255 or w.max() > 255):
        raise CompileError(op.name, type(op).__name__, f"weights span {w.min()}..{w.max()}; "
                           "the tile takes -255..255 (two int8 planes)")
    return w.astype(np.int16)


def _fold(bias, weight, zx):
    """bias - zx * sum(w): the input zero point of sum w * (x - zx), as int32."""
    total = np.asarray(bias, dtype=np.int64) - zx * weight.reshape(len(weight), -1).astype(
        np.int64).sum(axis=1)
    return ((total + 2**31) % 2**32 - 2**31).astype(np.int32)


@dataclass
class _ConvConsts:
    """A convolution's constants in GMEM from word ``at``: per group of R output
    channels a block of ``planes`` x ``Kp`` weight words (word t = (kh, kw, ci), R
    channels in its lanes; Kp = K rounded up to even, so every plane starts on an even
    word), the int32 biases and the requantisation table (together ``tables`` words).

    Weights are int8, one plane. A weight zero point that the importer folds into the
    weights can leave them beyond int8 (w - zp spans up to -255..255): they are then
    split into int8 planes that sum to them, and each pixel's MATMUL runs once per plane
    over the same window (the accumulators add them up exactly)."""
    Co: int
    K: int
    Kp: int
    G: int
    bias_words: int
    table_words: int
    block: int
    planes: int = 1
    n_tables: int = 1
    at: int = None

    @classmethod
    def layout(cls, spec, R, word_bytes):
        Co, Ci, KH, KW = spec.weight.shape
        K = KH * KW * Ci
        Kp = K + (K & 1)
        lo, hi = (int(spec.weight.min()), int(spec.weight.max())) if spec.weight.size else (0, 0)
        planes = max(1, -(-(-lo) // 128), -(-hi // 127))
        bias_words, table_words = -(-4 * R // word_bytes), -(-8 * R // word_bytes)
        n_tables = len(spec.requants)
        block = planes * Kp + bias_words + n_tables * table_words
        return cls(Co, K, Kp, -(-Co // R), bias_words, table_words, block + (block & 1),
                   planes, n_tables)

    def weights(self, w, plane=0):
        """Address of plane ``plane`` of the group whose block starts at ``w``."""
        return w + plane * self.Kp

    def bias(self, w):
        return w + self.planes * self.Kp

    def table(self, w, i=0):
        """Address of requantisation table ``i`` of the group whose block is at ``w``."""
        return self.bias(w) + self.bias_words + i * self.table_words

    @property
    def tables(self):
        """Words of a group's biases and tables (consecutive)."""
        return self.bias_words + self.n_tables * self.table_words

    def group(self, g):
        """GMEM word address of group ``g``'s block."""
        return self.at + g * self.block


def _window_chunks(KH, row, limit):
    """Cut a window of ``KH`` rows of ``row`` words into chunks of at most ``limit``
    words: (first patch word, words, window row, first word in it, rows) -- whole rows
    while a row fits, else pieces of one row."""
    if row <= limit:
        per = limit // row
        return [(kh * row, min(per, KH - kh) * row, kh, 0, min(per, KH - kh))
                for kh in range(0, KH, per)]
    return [(kh * row + s, min(limit, row - s), kh, s, 1)
            for kh in range(KH) for s in range(0, row, limit)]


class _Compiler:
    def __init__(self, graph, config, policy, lanes):
        self.g, self.cfg, self.policy, self.lanes = graph, config, policy, lanes
        self.R, self.C, self.wb = config.rows, config.cols, config.word_bytes
        self.T = graph.tensors
        self.const = []            # (word address, bytes) of constants
        self.top = 0               # next free GMEM word
        self.buffers = {}
        self.calls = []            # (kernel body as a tuple, a, b, unit name)
        self.unit = None           # the unit being compiled
        self.tilings = {}
        self.placed = {}           # op name -> its constants (_ConvConsts) in GMEM
        self.const_loads = set()   # the DMA loads of resident constants (load_const)

    def map_shape(self, name):
        """A tensor's shape as a feature map: vectors (K,) are (K, 1, 1)."""
        s = self.T[name].shape
        return tuple(s) if len(s) == 3 else (int(np.prod(s)), 1, 1)

    # -- GMEM -------------------------------------------------------------------------
    def alloc(self, words):
        at = self.top
        self.top += words
        return at

    def constant(self, data):
        """Place ``data`` (bytes, a whole number of words) in GMEM; its word address."""
        at = self.alloc(len(data) // self.wb)
        self.const.append((at, data))
        return at

    def words(self, lanes_rows):
        """Bytes of words given as rows of int8 lanes (fewer lanes are zero-filled)."""
        rows = np.asarray(lanes_rows, dtype=np.int8)
        out = np.zeros((len(rows), self.wb), dtype=np.int8)
        out[:, :rows.shape[1]] = rows
        return out.tobytes()

    # -- kernels ----------------------------------------------------------------------
    def emit(self, body, a=0, b=0):
        if len(body) > self.cfg.slot_depth:
            raise AssertionError("kernel longer than a slot")   # chunking guarantees it
        self.calls.append((tuple(body), a, b, self.unit))

    def load_const(self, spad, at, words, token=0):
        """DMA loads of ``words`` constant words from GMEM ``at`` (absolute)."""
        body = []
        for i in range(0, words, _MAX_COLS):
            n = min(_MAX_COLS, words - i)
            body.append(dma_load(gmem=at + i, spad=spad + i, cols=n, token=token))
        self.const_loads.update(body)
        return body

    def conv_constants(self, spec):
        """Place ``spec``'s constants in GMEM (see :class:`_ConvConsts`), once."""
        if spec.name in self.placed:
            return self.placed[spec.name]
        R, wb = self.R, self.wb
        k = _ConvConsts.layout(spec, R, wb)
        data = bytearray()
        for g in range(k.G):
            co = np.arange(g * R, min(k.Co, (g + 1) * R))
            # word t = (kh, kw, ci): the patch order of the im2col below
            rest = spec.weight[co].transpose(2, 3, 1, 0).reshape(k.K, len(co)).astype(np.int64)
            for _ in range(k.planes):
                part = np.clip(rest, -128, 127)
                rest = rest - part
                lanes = np.zeros((k.Kp, R), dtype=np.int8)
                lanes[:k.K, :len(co)] = part
                data += self.words(lanes)
            bias = np.zeros(k.bias_words * wb, dtype=np.uint8)
            b = np.zeros(R, dtype="<i4")
            b[:len(co)] = spec.bias[co]
            bias[:4 * R] = np.frombuffer(b.tobytes(), dtype=np.uint8)
            data += bias.tobytes()
            for rq in spec.requants:
                table = np.zeros((k.table_words * wb,), dtype=np.uint8)
                for r, c in enumerate(co):
                    m, s = rq.channel(c)
                    table[8 * r:8 * r + 4] = np.frombuffer(int(m).to_bytes(4, "little"),
                                                           np.uint8)
                    table[8 * r + 4] = s
                data += table.tobytes()
            data += bytes((k.block - k.planes * k.Kp - k.tables) * wb)
        k.at = self.constant(bytes(data))
        self.placed[spec.name] = k
        return k

    def conv_rows_body(self, spec, xb, P, rows, row_buf, *, patch, consts, groups, pitch,
                       w0=0, row0=0, tables=None, gmem0=0):
        """Micro-instructions computing ``rows`` output rows' chunk of ``P`` pixels each
        (row r: input rows from GMEM relative to ARG0 + gmem0 + (row0 + r) * row step) into
        ``row_buf`` (row r at row_buf + r * P * pitch), for the channel ``groups`` whose
        constants are loaded from word ``w0`` on; pixel p of row r requantises with table
        ``tables[r][p]`` (default 0)."""
        k = consts
        Co, Ci, KH, KW = spec.weight.shape
        sh, sw = spec.stride
        body = []
        for r in range(rows):
            for kh in range(KH):
                body.append(dma_load(
                    gmem=gmem0 + ((row0 + r) * sh + kh) * xb.Wp * Ci,
                    spad=patch + r * P * k.Kp + kh * KW * Ci,
                    rows=P, cols=KW * Ci, gmem_stride=sw * Ci, spad_stride=k.Kp,
                    base=GmemBase.ARG0))
        body.append(wait())
        for r in range(rows):
            for p in range(P):
                for i, _ in enumerate(groups):
                    body += self.dot(k, w0 + i * k.block, patch + (r * P + p) * k.Kp,
                                     row_buf + (r * P + p) * pitch + i * self.R,
                                     tables[r][p] if tables else 0)
        return body

    def dot(self, k, w, b, out, table=0):
        """One group of R output channels over one window: ACC_BIAS, a MATMUL per
        weight plane, REQUANT into ``out`` with requantisation table ``table`` (the
        group's block at ``w``, the window at ``b``)."""
        return ([acc_bias(k.bias(w))] +
                [matmul(a=k.weights(w, p), b=b, k=k.K, accumulate=True)
                 for p in range(k.planes)] +
                [requant(out=out, per_channel=True, params=k.table(w, table))])

    def store_pixels(self, spad, n, pitch, Co):
        """Store ``n`` pixels of ``pitch`` channels (consecutive in the scratchpad) to
        GMEM from ARG1 on, pixels ``Co`` words apart."""
        if pitch == Co and n * Co <= _MAX_COLS:
            return dma_store(gmem=0, spad=spad, cols=n * Co, base=GmemBase.ARG1)
        return dma_store(gmem=0, spad=spad, rows=n, cols=pitch, gmem_stride=Co,
                         spad_stride=pitch, base=GmemBase.ARG1)

    def vector_cfg(self, zp_out, lo, hi, **extra):
        body = [vcfg(VectorCfg.ZP_OUT, zp_out), vcfg(VectorCfg.LO, lo), vcfg(VectorCfg.HI, hi)]
        for reg, value in extra.items():
            body.append(vcfg(VectorCfg[reg.upper()], value))
        return body

    def conv_tiling(self, spec, consts, pool=None):
        """How a convolution runs with its weights resident in the scratchpad: (groups of
        R output channels per pass, output pixels per call), or None when not even one
        group and one pixel fit (then the weights are streamed, :meth:`conv_streamed`).
        Unfused, the choice moves the fewest words: every call reloads its pass's
        weights, every pass re-gathers the input windows."""
        cfg, k, R = self.cfg, consts, self.R
        Co, Ci, KH, KW = spec.weight.shape
        _, OH, OW = self.map_shape(spec.y)
        if KW * Ci > _MAX_COLS or k.K > _MAX_K:
            return None
        best, best_cost = None, None
        for Gp in range(k.G, 0, -1):
            cw = Gp * k.block
            pitch = min(Co, Gp * R)
            fixed = -(-cw // _MAX_COLS) + 3 + 5      # constants, vcfg, wait, drain, store...
            if pool is not None:
                pkh, pkw = pool.kernel
                if max(pkh, pkw) > _MAX_WINDOW:
                    return None
                _, _, PW = self.map_shape(pool.y)
                insns = fixed + pkh * KH + (2 + k.planes) * OW * pkh * Gp + 1 + PW
                words = cw + 1 + pkh * OW * (k.Kp + pitch) + R + (OW + PW) * pitch
                if insns <= cfg.slot_depth and words <= cfg.spad_words:
                    return Gp, OW
                continue
            for P in sorted((d for d in range(1, OW + 1) if OW % d == 0), reverse=True):
                if (fixed + KH + (2 + k.planes) * P * Gp <= cfg.slot_depth
                        and cw + 1 + P * (k.Kp + pitch) + R <= cfg.spad_words):
                    cost = OH * OW // P * k.G * k.block + -(-k.G // Gp) * OH * OW * k.K
                    if best_cost is None or cost < best_cost:
                        best, best_cost = (Gp, P), cost
                    break
        return best

    def conv(self, spec, pool=None):
        """A convolution (optionally fused with an unpadded max-pool ``pool``), in passes
        over groups of output channels whose weights fit the scratchpad beside the
        input windows; weights that do not fit even one group at a time are streamed."""
        xb = self.buffers[spec.x]
        Co, Ci, KH, KW = spec.weight.shape
        sh, sw = spec.stride
        pt, pl = spec.pads[0], spec.pads[1]
        OC, OH, OW = self.map_shape(spec.y)
        yb = self.buffers[pool.y if pool else spec.y]
        consts = self.conv_constants(spec)
        tiling = self.conv_tiling(spec, consts, pool)
        if tiling is None:
            if pool is not None:
                raise AssertionError("fused only when it fits")   # see compile_graph
            return self.conv_streamed(spec, consts)
        Gp, P = tiling
        k = consts
        self.tilings[spec.name] = Tiling(-(-k.G // Gp), P)
        for g0 in range(0, k.G, Gp):
            groups = range(g0, min(k.G, g0 + Gp))
            c0 = g0 * self.R
            pitch = min(Co, groups.stop * self.R) - c0
            cw = len(groups) * k.block
            body = self.load_const(0, k.group(g0), cw)
            body += self.vector_cfg(self.T[spec.y].zero_point, spec.lo, spec.hi)
            patch = cw + 1                      # odd: never in a weight's bank
            if pool is None:
                row_buf = patch + P * k.Kp
                bodies = {}       # an AvgPool's border pixels pick other tables: other bodies
                for oh in range(OH):
                    for ow0 in range(0, OW, P):
                        tables = tuple(spec.table(oh, ow0 + p) for p in range(P))
                        if tables not in bodies:
                            bodies[tables] = body + self.conv_rows_body(
                                spec, xb, P, 1, row_buf, patch=patch, consts=k, groups=groups,
                                pitch=pitch, tables=[tables]) + [
                                _DRAIN, self.store_pixels(row_buf, P, pitch, Co), wait(), ret()]
                        self.emit(bodies[tables], xb.word(oh * sh - pt, ow0 * sw - pl),
                                  yb.word(oh, ow0) + c0)
                continue
            # Fused with the max-pool: per pooled row, the conv rows it needs, pooled in
            # the scratchpad (the conv output map never reaches GMEM).
            pkh, pkw = pool.kernel
            psh, psw = pool.stride
            _, PH, PW = self.map_shape(pool.y)
            row_buf = patch + pkh * OW * k.Kp
            tmp = row_buf + pkh * OW * pitch + self.R
            out = tmp + OW * pitch
            body += self.conv_rows_body(spec, xb, OW, pkh, row_buf, patch=patch, consts=k,
                                        groups=groups, pitch=pitch)
            body += self.pool_rows(row_buf, OW, pitch, pkh, pkw, psw, PW, tmp, out)
            body += [_DRAIN, self.store_pixels(out, PW, pitch, Co), wait(), ret()]
            for ph in range(PH):
                self.emit(body, xb.word(ph * psh * sh - pt, -pl), yb.word(ph, 0) + c0)

    def conv_streamed(self, spec, consts):
        """A convolution whose weights do not fit the scratchpad even one group of R
        output channels at a time: per call one output pixel and a pass of groups; the
        contraction is cut into chunks (whole window rows, or pieces of one), each
        group's weights stream through two buffers while the MAC array works on the
        other, and the partial sums stay in the accumulators (ACC_BIAS, one MATMUL per
        chunk, REQUANT). The window is gathered once per call when it fits beside the
        buffers, else it streams with the weights."""
        cfg, k, R = self.cfg, consts, self.R
        xb, yb = self.buffers[spec.x], self.buffers[spec.y]
        Co, Ci, KH, KW = spec.weight.shape
        sh, sw = spec.stride
        pt, pl = spec.pads[0], spec.pads[1]
        _, OH, OW = self.map_shape(spec.y)
        row = KW * Ci
        x_row = xb.Wp * Ci
        for Gp, resident in ((g, r) for g in range(k.G, 0, -1) for r in (True, False)):
            out = Gp * k.tables                      # tables first, then the outputs
            free = out + Gp * R + R
            if resident:
                patch = free | 1                      # odd, like every activation stream
                free = patch + k.K
            n_bufs = 2 if resident else 4
            Kc = min((cfg.spad_words - free) // n_bufs - 2, _MAX_COLS - 1) & ~1
            if Kc < 2:
                continue
            chunks = _window_chunks(KH, row, Kc)
            gather = _window_chunks(KH, row, _MAX_COLS) if resident else []
            insns = (Gp if k.block > 0xFFFF else 1) + 3 + len(gather) + 4 + \
                Gp * (2 + k.planes * len(chunks) * (3 if resident else 4))
            if insns <= cfg.slot_depth:
                break
        else:
            raise CompileError(spec.name, spec.op, f"a window of {k.K} words does not fit "
                               f"a kernel slot even streamed in chunks")
        self.tilings[spec.name] = Tiling(-(-k.G // Gp), 1, streamed=True, chunks=len(chunks))
        wbuf = [free + (free & 1), free + (free & 1) + Kc + 2]        # even
        xbuf = [wbuf[1] + Kc + 3, wbuf[1] + 2 * Kc + 5]               # odd

        def x_load(chunk, spad):
            t0, n, kh, s, rows = chunk
            return dma_load(gmem=kh * x_row + s, spad=spad, rows=rows, cols=n // rows,
                            gmem_stride=x_row, spad_stride=n // rows, base=GmemBase.ARG0)

        for g0 in range(0, k.G, Gp):
            groups = range(g0, min(k.G, g0 + Gp))
            c0 = g0 * R
            pitch = min(Co, groups.stop * R) - c0
            if k.block <= 0xFFFF:
                body = [dma_load(gmem=k.bias(k.group(g0)), spad=0, rows=len(groups),
                                 cols=k.tables, gmem_stride=k.block, spad_stride=k.tables)]
            else:                                   # beyond the DMA's stride field
                body = [dma_load(gmem=k.bias(k.group(g)), spad=i * k.tables, cols=k.tables)
                        for i, g in enumerate(groups)]
            body += self.vector_cfg(self.T[spec.y].zero_point, spec.lo, spec.hi)
            if resident:
                body += [x_load(c, patch + c[0]) for c in gather]
            # per group, per weight plane, per chunk of the window
            steps = [(i, g, p, j) for i, g in enumerate(groups) for p in range(k.planes)
                     for j in range(len(chunks))]
            operands = []
            for n_step, (i, g, p, j) in enumerate(steps):
                t0, n = chunks[j][:2]
                buf = n_step % 2
                b = patch + t0 if resident else xbuf[buf]
                a = wbuf[buf] + (1 - (b & 1))          # the other parity: another bank
                loads = [dma_load(gmem=k.weights(k.group(g), p) + t0, spad=a, cols=n)]
                if not resident:
                    loads.append(x_load(chunks[j], b))
                operands.append((loads, a, b, n))
            head = body + operands[0][0]

            def pixel_body(table):
                """The pass's body for a pixel requantised with table ``table``."""
                body = list(head)
                for n_step, (i, g, p, j) in enumerate(steps):
                    _, a, b, n = operands[n_step]
                    body.append(wait())
                    if p == 0 and j == 0:
                        body.append(acc_bias(i * k.tables))
                    # Issued only when the compute unit is idle, so once this MATMUL is
                    # issued the previous one has finished reading the other buffers.
                    body.append(matmul(a=a, b=b, k=n, accumulate=True))
                    if p == k.planes - 1 and j == len(chunks) - 1:
                        body.append(requant(out=out + i * R, per_channel=True,
                                            params=i * k.tables + k.bias_words +
                                            table * k.table_words))
                    if n_step + 1 < len(steps):
                        body += operands[n_step + 1][0]
                return body + [_DRAIN, dma_store(gmem=0, spad=out, cols=pitch,
                                                 base=GmemBase.ARG1), wait(), ret()]

            bodies = {}
            for oh in range(OH):
                for ow in range(OW):
                    t = spec.table(oh, ow)
                    if t not in bodies:
                        bodies[t] = pixel_body(t)
                    self.emit(bodies[t], xb.word(oh * sh - pt, ow * sw - pl),
                              yb.word(oh, ow) + c0)

    def dense_chain_layout(self, specs):
        """Scratchpad layout of a fused chain of Dense layers: every layer's constants
        (even words), the input window, each hidden vector (odd, so that it is the next
        layer's activation stream) and the output; or the reason it does not fit."""
        k = [_ConvConsts.layout(s, self.R, self.wb) for s in specs]
        Co, Ci, KH, KW = specs[0].weight.shape
        if KW * Ci > _MAX_COLS:
            return None, "a window row longer than a DMA moves"
        if any(x.K > _MAX_K for x in k):
            return None, "a contraction longer than a MATMUL"
        consts = []
        top = 0
        for x in k:
            consts.append(top)
            top += x.G * x.block
        patch = top | 1
        top = patch + k[0].Kp
        vectors = []
        for x in k:
            at = top | 1
            vectors.append(at)
            top = at + x.G * self.R
        loads = sum(-(-x.G * x.block // _MAX_COLS) for x in k)
        insns = loads + KH + 1 + sum(3 + (2 + x.planes) * x.G for x in k) + 4
        if top > self.cfg.spad_words:
            return None, f"needs {top} scratchpad words, the tile has {self.cfg.spad_words}"
        if insns > self.cfg.slot_depth:
            return None, f"needs {insns} micro-instructions, a slot holds {self.cfg.slot_depth}"
        return (k, consts, patch, vectors), None

    def dense_chain_fit(self, specs):
        """None if the chain fits one kernel with every weight resident, else why not."""
        return self.dense_chain_layout(specs)[1]

    def dense_chain(self, specs):
        """Dense layers one after the other in one call: every layer's weights resident,
        each hidden vector written by REQUANT where the next layer's MATMUL reads it (it
        never leaves the scratchpad)."""
        (_, consts_at, patch, vectors), _ = self.dense_chain_layout(specs)
        xb = self.buffers[specs[0].x]
        yb = self.buffers[specs[-1].y]
        placed = [self.conv_constants(s) for s in specs]
        body = []
        for k, at in zip(placed, consts_at):
            body += self.load_const(at, k.at, k.G * k.block)
        first = specs[0]
        for i, (spec, k, w0) in enumerate(zip(specs, placed, consts_at)):
            body += self.vector_cfg(self.T[spec.y].zero_point, spec.lo, spec.hi)
            if i == 0:
                body += self.conv_rows_body(first, xb, 1, 1, vectors[0], patch=patch, consts=k,
                                            groups=range(k.G), pitch=k.Co, w0=w0)
                continue
            for g in range(k.G):
                body += self.dot(k, w0 + g * k.block, vectors[i - 1], vectors[i] + g * self.R)
        body += [_DRAIN, dma_store(gmem=0, spad=vectors[-1], cols=placed[-1].Co,
                                   base=GmemBase.ARG1), wait(), ret()]
        for spec, k in zip(specs, placed):
            self.tilings[spec.name] = Tiling(1, 1)
        self.emit(body, xb.word(0, 0), yb.word(0, 0))

    def conv_pool_dense_layout(self, spec, pool, tail):
        """Scratchpad layout of a conv, the max-pool after it and a chain of Dense layers
        over the pooled map, all in one call (every weight resident, the whole pooled
        map in the scratchpad); or the reason it does not fit."""
        R = self.R
        k = _ConvConsts.layout(spec, R, self.wb)
        kd = [_ConvConsts.layout(s, R, self.wb) for s in tail]
        Co, Ci, KH, KW = spec.weight.shape
        _, OH, OW = self.map_shape(spec.y)
        pkh, pkw = pool.kernel
        _, PH, PW = self.map_shape(pool.y)
        if KW * Ci > _MAX_COLS or max(x.K for x in [k] + kd) > _MAX_K or \
                max(pkh, pkw) > _MAX_WINDOW:
            return None, "a window beyond the DMA, MATMUL or VPOOL fields"
        top = k.G * k.block
        dense_at = []
        for x in kd:
            dense_at.append(top)
            top += x.G * x.block
        patch = top | 1
        row_buf = patch + pkh * OW * k.Kp
        tmp = row_buf + pkh * OW * Co + R
        out = (tmp + OW * Co) | 1                  # the first Dense's activation stream
        top = out + PH * PW * Co
        vectors = []
        for x in kd:
            vectors.append(top | 1)
            top = vectors[-1] + x.G * R
        loads = sum(-(-x.G * x.block // _MAX_COLS) for x in [k] + kd)
        insns = loads + 3 + PH * (pkh * KH + 1 + (2 + k.planes) * OW * pkh * k.G + 1 + PW) + \
            sum(3 + (2 + x.planes) * x.G for x in kd) + 4
        if top > self.cfg.spad_words:
            return None, f"needs {top} scratchpad words, the tile has {self.cfg.spad_words}"
        if insns > self.cfg.slot_depth:
            return None, f"needs {insns} micro-instructions, a slot holds {self.cfg.slot_depth}"
        return (dense_at, patch, row_buf, tmp, out, vectors), None

    def conv_pool_dense(self, spec, pool, tail):
        """Conv + max-pool over the whole map, then the Dense layers over the pooled map,
        in one call: neither the conv map nor the pooled map nor a hidden vector leaves
        the scratchpad, and every weight is loaded once per call."""
        (dense_at, patch, row_buf, tmp, out, vectors), _ = self.conv_pool_dense_layout(
            spec, pool, tail)
        xb = self.buffers[spec.x]
        yb = self.buffers[tail[-1].y]
        Co = spec.weight.shape[0]
        pkh, pkw = pool.kernel
        psh, psw = pool.stride
        _, OH, OW = self.map_shape(spec.y)
        _, PH, PW = self.map_shape(pool.y)
        k = self.conv_constants(spec)
        placed = [self.conv_constants(s) for s in tail]
        body = self.load_const(0, k.at, k.G * k.block)
        for x, at in zip(placed, dense_at):
            body += self.load_const(at, x.at, x.G * x.block)
        body += self.vector_cfg(self.T[spec.y].zero_point, spec.lo, spec.hi)
        for ph in range(PH):
            # The MATMULs of the previous row have all been issued (and so finished)
            # before its VPOOLs, so the gather may overwrite the patch.
            body += self.conv_rows_body(spec, xb, OW, pkh, row_buf, patch=patch, consts=k,
                                        groups=range(k.G), pitch=Co, row0=ph * psh)
            body += self.pool_rows(row_buf, OW, Co, pkh, pkw, psw, PW, tmp,
                                   out + ph * PW * Co)
        src = out
        for s, x, w0, vec in zip(tail, placed, dense_at, vectors):
            body += self.vector_cfg(self.T[s.y].zero_point, s.lo, s.hi)
            for g in range(x.G):
                body += self.dot(x, w0 + g * x.block, src, vec + g * self.R)
            src = vec
        body += [_DRAIN, dma_store(gmem=0, spad=vectors[-1], cols=placed[-1].Co,
                                   base=GmemBase.ARG1), wait(), ret()]
        self.tilings[spec.name] = Tiling(1, OH * OW)
        for s in tail:
            self.tilings[s.name] = Tiling(1, 1)
        self.emit(body, xb.word(-spec.pads[0], -spec.pads[1]), yb.word(0, 0))

    def conv_add_pool_layout(self, spec, add, pool):
        """A residual branch's last conv, the Add that joins the skip path and the
        unpadded max-pool after it, per pooled row in one call: the scratchpad layout,
        or the reason it does not fit. The skip map's rows must lie at a fixed distance
        from the conv's input rows (the same row step in words)."""
        R = self.R
        k = _ConvConsts.layout(spec, R, self.wb)
        Co, Ci, KH, KW = spec.weight.shape
        _, OH, OW = self.map_shape(spec.y)
        pkh, pkw = pool.kernel
        _, PH, PW = self.map_shape(pool.y)
        xb = self.buffers.get(spec.x)
        skip = self.buffers.get(add.b if add.a == spec.y else add.a)
        if xb is not None and skip is not None and \
                xb.Wp * Ci * spec.stride[0] != skip.Wp * Co:
            return None, "the skip map's rows are not a fixed distance from the conv's input"
        if KW * Ci > _MAX_COLS or k.K > _MAX_K or max(pkh, pkw) > _MAX_WINDOW or \
                OW * Co > _MAX_COLS:
            return None, "a window or row beyond the DMA, MATMUL or VPOOL fields"
        patch = (k.G * k.block) | 1
        row_buf = patch + pkh * OW * k.Kp
        skip_buf = row_buf + pkh * OW * Co + R
        sums = skip_buf + pkh * OW * Co
        tmp = sums + pkh * OW * Co
        out = tmp + OW * Co
        top = out + PW * Co
        loads = -(-k.G * k.block // _MAX_COLS)
        insns = loads + 3 + pkh * KH + 1 + (2 + k.planes) * OW * pkh * k.G + 2 + 8 + pkh + \
            1 + PW + 4
        if top > self.cfg.spad_words:
            return None, f"needs {top} scratchpad words, the tile has {self.cfg.spad_words}"
        if insns > self.cfg.slot_depth:
            return None, f"needs {insns} micro-instructions, a slot holds {self.cfg.slot_depth}"
        return (patch, row_buf, skip_buf, sums, tmp, out), None

    def conv_add_pool(self, spec, add, pool):
        """Per pooled row: the conv rows under it (weights resident), the skip path's
        rows beside them, VADD, max-pool, store the pooled row: neither the conv's map
        nor the sum reaches GMEM."""
        layout, reason = self.conv_add_pool_layout(spec, add, pool)   # now with buffers
        if layout is None:
            raise CompileError(f"{spec.name}+{add.name}+{pool.name}", "Fusion", reason)
        patch, row_buf, skip_buf, sums, tmp, out = layout
        xb, yb = self.buffers[spec.x], self.buffers[pool.y]
        conv_first = add.a == spec.y
        skip = self.buffers[add.b if conv_first else add.a]
        Co = spec.weight.shape[0]
        sh = spec.stride[0]
        pt, pl = spec.pads[0], spec.pads[1]
        _, OH, OW = self.map_shape(spec.y)
        pkh, pkw = pool.kernel
        psh, psw = pool.stride
        _, PH, PW = self.map_shape(pool.y)
        n = OW * Co
        # ARG0: the lower of the conv's first input row and the skip's first row
        base = min(xb.word(-pt, -pl), skip.word(0, 0))
        gx, gs = xb.word(-pt, -pl) - base, skip.word(0, 0) - base
        k = self.conv_constants(spec)
        conv_cfg = self.vector_cfg(self.T[spec.y].zero_point, spec.lo, spec.hi)
        body = self.load_const(0, k.at, k.G * k.block) + conv_cfg
        body += self.conv_rows_body(spec, xb, OW, pkh, row_buf, patch=patch, consts=k,
                                    groups=range(k.G), pitch=Co, gmem0=gx)
        body += [dma_load(gmem=gs, spad=skip_buf, rows=pkh, cols=n, gmem_stride=skip.Wp * Co,
                          spad_stride=n, base=GmemBase.ARG0), wait()] + self.add_cfg(add)
        for r in range(pkh):
            conv_row, skip_row = row_buf + r * n, skip_buf + r * n
            a, b = (conv_row, skip_row) if conv_first else (skip_row, conv_row)
            body.append(vadd(a=a, b=b, out=sums + r * n, n=n))
        body += self.pool_rows(sums, OW, Co, pkh, pkw, psw, PW, tmp, out)
        body += [_DRAIN, dma_store(gmem=0, spad=out, cols=PW * Co, base=GmemBase.ARG1), wait(),
                 ret()]
        self.tilings[spec.name] = Tiling(1, OW)
        for ph in range(PH):
            h = ph * psh
            self.emit(body, min(xb.word(h * sh - pt, -pl), skip.word(h, 0)), yb.word(ph, 0))

    def pool_rows(self, src, src_w, C, kh, kw, sw, ow, tmp, out):
        """Max-pool ``kh`` rows of ``src_w`` pixels x C channels at ``src`` (row i at
        src + i * src_w * C) into one row of ``ow`` pixels at
        ``out``: a vertical pass over whole rows into ``tmp`` (one VPOOL), then a
        horizontal one per output pixel (VPOOL writes consecutive words, so it is the
        pixel's C channels that it writes at once)."""
        body = [vpool(src=src, out=tmp, n=src_w * C, window=kh, stride=src_w * C, step=1)]
        body += [vpool(src=tmp + o * sw * C, out=out + o * C, n=C, window=kw, stride=C,
                       step=1) for o in range(ow)]
        return body

    def select(self, op):
        """The decision of a :class:`Select`, as a kernel of its own: the key's words
        in, then for a threshold the max over them (VPOOL, windows of at most 15
        words, repeated) compared with the threshold into flag ``_SELECT_FLAG``; for an
        argmax, VARGMAX over lane 0 of the words into index register ``_SELECT_INDEX``."""
        K = self.T[op.key].size
        if K > _MAX_COLS:
            raise CompileError(op.name, "Select", f"a key of {K} elements; at most "
                               f"{_MAX_COLS}")
        body = [dma_load(gmem=0, spad=0, cols=K, base=GmemBase.ARG0), wait()]
        body += self.decision(op, 0, K)
        body.append(ret())
        self.emit(body, self.buffers[op.key].word(0, 0))

    @staticmethod
    def decision(op, key, n, guess=None):
        """Compute instructions deciding :class:`Select` ``op`` on its key, ``n`` words
        at scratchpad word ``key`` (the words after them are free). A threshold sets
        flag ``_SELECT_FLAG`` when path 0 is chosen; an argmax sets index register
        ``_SELECT_INDEX`` and, with ``guess`` (a path), flag ``_GUARD_FLAG`` to whether
        it chose that path."""
        if op.mode == "argmax":
            test = {} if guess is None else dict(flag=_GUARD_FLAG, expect=guess)
            return [vargmax(addr=key, n=n, index=_SELECT_INDEX, lane=0, **test)]
        body, src = [], key
        while n > 1:                            # max of n words at src -> one word
            w = min(n, _MAX_WINDOW)
            full, rest = divmod(n, w)
            out = src + n
            body.append(vpool(src=src, out=out, n=full, window=w, stride=1, step=w))
            if rest:
                body.append(vpool(src=src + full * w, out=out + full, n=1, window=rest,
                                  stride=1, step=1))
            src, n = out, full + (1 if rest else 0)
        # VCMP's immediate is int8: a threshold beyond it is always or never reached.
        t = op.threshold
        cmp, imm = (CmpOp.GE, max(t, -128)) if t <= 127 else (CmpOp.GT, 127)
        return body + [vcmp(addr=src, lane=0, op=cmp, imm=imm, flag=_SELECT_FLAG)]

    def speculative(self, ops, view, guess):
        """One kernel running ``ops`` (graph order: Dense, Add, Clamp over vectors): the
        head (the key's producer and the ops before it), the decision of ``view.flow``'s
        Select guessing path ``guess``, and that path's ops; every intermediate in the
        scratchpad: every weight and the inputs from outside loaded, then per op its
        compute instructions, the decision right after the key; the results read
        outside the kernel stored at the end (in a speculative region, into the staging
        buffer).

        The loads are queued at once, the inputs and the key producer's weights first,
        each Dense's weights with a DMA token of their own, and each op waits only for
        its own: the path's weights stream in while the key and the decision are
        computed (what the unspeculated plan cannot do before its branch), and a wrong
        guess is caught before they are all in."""
        sel, alias, R = view.flow.select, view.alias, self.R
        name = "+".join(op.name for op in ops)
        inside = {op.name for op in ops}

        def canon(t):
            return alias.get(t, t)

        def size(t):
            return self.T[t].size

        consts, top = {}, 0
        for op in ops:
            if isinstance(op, Dense):
                k = self.conv_constants(view.specs[op.name])
                consts[op.name] = (k, top)
                top += k.G * k.block
        vec, loads = {}, []

        def place(t, words):
            nonlocal top
            vec[canon(t)] = top | 1
            top = (top | 1) + words

        for op in ops:
            for t in op_inputs(op):
                if canon(t) not in vec:
                    buf = self.buffers[t]
                    if any(buf.ring):
                        raise CompileError(op.name, type(op).__name__, f"{t!r} has a "
                                           "padding ring: a speculative unit loads vectors")
                    place(t, size(t))
                    loads += self.load_const(vec[canon(t)], buf.word(0, 0), size(t))
            out = consts[op.name][0].G * R if op.name in consts else size(op.y)
            place(op.y, out + (size(op.y) if canon(op.y) == canon(sel.key) else 0))
        if top > self.cfg.spad_words:
            raise CompileError(name, "Speculate", f"needs {top} scratchpad words, the tile "
                               f"has {self.cfg.spad_words}")
        dense = [op.name for op in ops if op.name in consts]
        # tokens 1, 2 for the first two Dense layers, 3 for the rest (which then wait
        # for each other's weights too)
        token = {n: 1 + min(i, 2) for i, n in enumerate(dense)}
        body = loads + [i for n in dense for i in self.load_const(
            consts[n][1], consts[n][0].at, consts[n][0].G * consts[n][0].block, token[n])]
        body.append(wait(1))
        for op in ops:
            out = vec[canon(op.y)]
            if isinstance(op, Dense):
                body.append(wait(1 << token[op.name]))
                spec, (k, w0) = view.specs[op.name], consts[op.name]
                body += self.vector_cfg(self.T[op.y].zero_point, spec.lo, spec.hi)
                for g in range(k.G):
                    body += self.dot(k, w0 + g * k.block, vec[canon(op.x)], out + g * R)
            elif isinstance(op, Add):
                body += self.add_cfg(op) + [vadd(a=vec[canon(op.a)], b=vec[canon(op.b)],
                                                 out=out, n=size(op.y))]
            elif isinstance(op, Clamp):
                body.append(vclamp(src=vec[canon(op.x)], out=out, n=size(op.y), lo=op.lo,
                                   hi=op.hi))
            else:
                raise CompileError(op.name, type(op).__name__, "a speculative unit runs "
                                   "Dense, Add and Clamp")
            if canon(op.y) == canon(sel.key):
                body += self.decision(sel, out, size(sel.key), guess)
        body.append(_DRAIN)
        stored = 0
        for t in dict.fromkeys(canon(op.y) for op in ops):
            readers = [r for r in view.consumers.get(t, []) if r.name not in inside]
            if t == canon(sel.y) or any(r is not sel for r in readers):
                body.append(dma_store(gmem=self.buffers[t].word(0, 0), spad=vec[t],
                                      cols=size(t)))
                stored += size(t)
        if stored > self.cfg.staging_words:
            raise CompileError(name, "Speculate", f"stores {stored} words; the staging "
                               f"buffer holds {self.cfg.staging_words}")
        body += [wait(), ret()]
        if len(body) > self.cfg.slot_depth:
            raise CompileError(name, "Speculate", f"needs {len(body)} micro-instructions, "
                               f"a slot holds {self.cfg.slot_depth}")
        self.unit = name
        self.emit(body)

    def maxpool(self, op):
        """Per call a chunk of output pixels of one row (the most that fit a DMA, a slot
        and the scratchpad): the window rows under them, pooled as in :meth:`pool_rows`."""
        cfg = self.cfg
        xb, yb = self.buffers[op.x], self.buffers[op.y]
        C, OH, OW = self.map_shape(op.y)
        kh, kw = op.kernel
        sh, sw = op.stride
        pt, pl = op.pads[0], op.pads[1]
        if max(kh, kw) > _MAX_WINDOW:
            raise CompileError(op.name, "MaxPool", f"windows larger than {_MAX_WINDOW}")
        for P in sorted((d for d in range(1, OW + 1) if OW % d == 0), reverse=True):
            n = ((P - 1) * sw + kw) * C             # words of one input row under P pixels
            tmp = kh * n
            out = tmp + n
            if max(n, P * C) <= _MAX_COLS and out + P * C <= cfg.spad_words and \
                    7 + P <= cfg.slot_depth:
                break
        else:
            raise CompileError(op.name, "MaxPool", f"one output pixel needs {out + C} "
                               f"scratchpad words, the tile has {cfg.spad_words}")
        body = [dma_load(gmem=0, spad=0, rows=kh, cols=n, gmem_stride=xb.Wp * C,
                         spad_stride=n, base=GmemBase.ARG0), wait()]
        body += self.pool_rows(0, n // C, C, kh, kw, sw, P, tmp, out)
        body += [_DRAIN, dma_store(gmem=0, spad=out, cols=P * C, base=GmemBase.ARG1), wait(),
                 ret()]
        for oh in range(OH):
            for ow0 in range(0, OW, P):
                self.emit(body, xb.word(oh * sh - pt, ow0 * sw - pl), yb.word(oh, ow0))

    def add_cfg(self, op):
        T = self.T
        return self.vector_cfg(T[op.y].zero_point, op.lo, op.hi, mult_a=op.mult_a,
                               mult_b=op.mult_b, shift=op.shift, zp_a=T[op.a].zero_point,
                               zp_b=T[op.b].zero_point)

    def add(self, op):
        cfgs = self.add_cfg(op)
        self.elementwise(op, 2, lambda s, out, n: cfgs + [vadd(a=s[0], b=s[1], out=out, n=n)])

    def add_pool_layout(self, add, pool):
        """Scratchpad words of an Add fused with the unpadded max-pool after it, or the
        reason it does not fit."""
        C, H, W = self.map_shape(add.y)
        _, PH, PW = self.map_shape(pool.y)
        pkh, pkw = pool.kernel
        n = W * C
        if max(pkh, pkw) > _MAX_WINDOW or n > _MAX_COLS or PW * C > _MAX_COLS:
            return None, "rows or windows beyond the DMA and VPOOL fields"
        words = 3 * pkh * n + n + PW * C
        insns = 3 + 8 + pkh + 1 + PW + 4
        if words > self.cfg.spad_words:
            return None, f"needs {words} scratchpad words, the tile has {self.cfg.spad_words}"
        if insns > self.cfg.slot_depth:
            return None, f"needs {insns} micro-instructions, a slot holds {self.cfg.slot_depth}"
        return words, None

    def add_pool(self, add, pool):
        """Add + max-pool, per pooled row: the window rows of both inputs (the two maps
        have the same row pitch, so one lies at a fixed distance from the other; the
        compiler makes it so), VADD row by row, pool, store the pooled row: the sum
        never reaches GMEM."""
        a, b = self.buffers[add.a], self.buffers[add.b]
        yb = self.buffers[pool.y]
        C, H, W = self.map_shape(add.y)
        _, PH, PW = self.map_shape(pool.y)
        pkh, pkw = pool.kernel
        psh, psw = pool.stride
        n = W * C
        base = min(a.word(0, 0), b.word(0, 0))
        A, B, S = 0, pkh * n, 2 * pkh * n
        tmp, out = 3 * pkh * n, 3 * pkh * n + n
        body = [dma_load(gmem=a.word(0, 0) - base, spad=A, rows=pkh, cols=n,
                         gmem_stride=a.Wp * C, spad_stride=n, base=GmemBase.ARG0),
                dma_load(gmem=b.word(0, 0) - base, spad=B, rows=pkh, cols=n,
                         gmem_stride=b.Wp * C, spad_stride=n, base=GmemBase.ARG0),
                wait()] + self.add_cfg(add)
        body += [vadd(a=A + r * n, b=B + r * n, out=S + r * n, n=n) for r in range(pkh)]
        body += self.pool_rows(S, W, C, pkh, pkw, psw, PW, tmp, out)
        body += [_DRAIN, dma_store(gmem=0, spad=out, cols=PW * C, base=GmemBase.ARG1), wait(),
                 ret()]
        for ph in range(PH):
            h = ph * psh
            self.emit(body, min(a.word(h, 0), b.word(h, 0)), yb.word(ph, 0))

    def clamp(self, op):
        self.elementwise(op, 1, lambda s, out, n: [vclamp(src=s[0], out=out, n=n, lo=op.lo,
                                                          hi=op.hi)])

    def elementwise(self, op, n_in, make):
        """Row by row: the output relative to ARG1; one input relative to ARG0, or two:
        ARG0 the lower of their rows, the other at a fixed distance (the compiler gives
        the two inputs of an Add the same row pitch), so one kernel body serves every
        row."""
        names = [op.a, op.b] if n_in == 2 else [op.x]
        ins = [self.buffers[n] for n in names]
        yb = self.buffers[op.y]
        C, H, W = self.map_shape(op.y)
        n = W * C
        if n > _MAX_COLS:
            raise CompileError(op.name, type(op).__name__, "rows longer than a DMA moves")
        spad = [0, n + 1][:n_in]
        out = (n + 1) * n_in + 1
        base = min(b.word(0, 0) for b in ins)
        body = [dma_load(gmem=b.word(0, 0) - base, spad=s, cols=n, base=GmemBase.ARG0)
                for b, s in zip(ins, spad)]
        body += [wait()] + make(spad, out, n) + [
            _DRAIN, dma_store(gmem=0, spad=out, cols=n, base=GmemBase.ARG1), wait(), ret()]
        for h in range(H):
            self.emit(body, min(b.word(h, 0) for b in ins), yb.word(h, 0))


def compile_graph(graph, config, *, policy="none", groups=None, lanes=None,
                  stable_layout=False, speculate=None):
    """Compile ``graph`` for a tile with ``config`` under ``policy``, or with the ops
    grouped into fused units as ``groups`` says (tuples of op names; every op not named
    is a unit of its own; see :func:`fusion_kind` for the groups the compiler fuses).

    With ``stable_layout`` every tensor gets its GMEM buffer even when a fused unit
    keeps it in the scratchpad, so programs of the same graph with different groups
    share one GMEM image (weights, tables and buffers at the same addresses): the
    adaptive runtime swaps between them by loading kernels and a plan only.

    With ``speculate`` (a path of the graph's :class:`Select`) the plan guesses that
    path: see :func:`_speculative_segment`. Its segment's ``fallback`` is the plan
    without the guess, which the other plan bank must hold.

    Raises
    ------
    CompileError
        Naming the node and op that cannot be fitted on this configuration, or the
        group that cannot be fused.
    ValueError
        For an unknown policy.
    """
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    sel = next((op for op in graph.ops if isinstance(op, Select)), None)
    flow_lanes = 1 if sel else None
    if sel and not config.decisions:
        raise CompileError(sel.name, "Select", "a data-dependent choice is made by VCMP or "
                           "VARGMAX, which this tile does not build (TileConfig.decisions)")
    word_op = next((op for op in graph.ops if isinstance(op, (Add, MaxPool, Clamp))), None)
    if word_op and not config.word_ops:
        raise CompileError(word_op.name, type(word_op).__name__, "an Add, MaxPool or Clamp "
                           "is made by VADD, VPOOL or VCLAMP, which this tile does not "
                           "build (TileConfig.word_ops)")
    if flow_lanes and lanes not in (None, 1):
        raise CompileError(sel.name, "Select", "a data-dependent choice is made once per "
                           "run, so a run carries one sample: lanes must be 1")
    lanes = lanes or flow_lanes or min(config.rows, config.cols, config.word_bytes)
    c = _Compiler(graph, config, policy, lanes)
    T = graph.tensors
    view = _GraphView(graph, c)
    alias, specs = view.alias, view.specs

    units = view.units(static_groups(graph, config) if groups is None and policy == "static"
                       else groups or [])
    if view.flow:
        units.sort(key=lambda u: _region_order(view.flow.region(u.ops[0].name)))
    fused = {u.ops[0].name: u.ops[1] for u in units if u.kind == "conv+pool"}
    skipped = set() if stable_layout else {op.y for u in units for op in u.ops[:-1]}

    # Buffers with rings for their consumers' padding.
    names = [graph.input] + [op.y for op in graph.ops if not isinstance(op, Flatten)]
    for name in names:
        if name in skipped:
            continue
        c.buffers[name] = Buffer(name, c.map_shape(name))
    for name, buf in c.buffers.items():
        ring = [0, 0, 0, 0]
        pad_value = None
        for op in view.consumers.get(name, []):
            pads = getattr(op, "pads", None)
            if not pads or not any(pads):
                continue
            value = -128 if isinstance(op, MaxPool) else T[name].zero_point
            if pad_value is not None and value != pad_value:
                raise CompileError(op.name, type(op).__name__, f"{name!r} is padded with "
                                   "different values by its consumers")
            pad_value = value
            ring = [max(r, p) for r, p in zip(ring, pads)]
        buf.ring = tuple(ring)
        buf.pad_value = pad_value
    # The two inputs of an Add get the same row pitch (the narrower ring widened on
    # the right), so that one lies at a fixed distance from the other in every row.
    for op in graph.ops:
        if isinstance(op, Add) and op.a in c.buffers and op.b in c.buffers:
            a, b = c.buffers[op.a], c.buffers[op.b]
            if a.Wp != b.Wp:
                narrow, wide = (a, b) if a.Wp < b.Wp else (b, a)
                t, l, bt, r = narrow.ring
                narrow.ring = (t, l, bt, r + wide.Wp - narrow.Wp)
    for name in alias:
        if alias[name] in c.buffers:
            c.buffers[name] = c.buffers[alias[name]]

    for name, buf in c.buffers.items():
        if name not in alias:
            buf.at = c.alloc(buf.words)

    regions = []                # (region, index of its first call), with a flow
    for unit in units:
        c.unit = unit.name
        op = unit.ops[0]
        if view.flow:
            region = view.flow.region(op.name)
            if not regions or regions[-1][0] != region:
                regions.append((region, len(c.calls)))
            if region == ("select",):
                c.select(op)
                continue
        if unit.kind == "dense chain":
            c.dense_chain([specs[o.name] for o in unit.ops])
        elif unit.kind == "conv+add+pool":
            c.conv_add_pool(specs[op.name], unit.ops[1], unit.ops[2])
        elif unit.kind == "add+pool":
            c.add_pool(op, unit.ops[1])
        elif unit.kind == "conv+pool+dense":
            c.conv_pool_dense(specs[op.name], unit.ops[1], [specs[o.name] for o in unit.ops[2:]])
        elif op.name in specs:
            c.conv(specs[op.name], fused.get(op.name))
        elif isinstance(op, MaxPool):
            c.maxpool(op)
        elif isinstance(op, Add):
            c.add(op)
        elif isinstance(op, Clamp):
            c.clamp(op)

    if c.top * config.word_bytes > config.gmem_bytes:
        raise CompileError(graph.name, "Graph", f"needs {c.top * config.word_bytes} bytes "
                           f"of GMEM, the tile has {config.gmem_bytes}")

    gmem = bytearray(c.top * config.word_bytes)
    for buf in c.buffers.values():
        if buf.pad_value is not None:
            start = buf.at * config.word_bytes
            gmem[start:start + buf.words * config.word_bytes] = \
                bytes([buf.pad_value & 0xFF]) * (buf.words * config.word_bytes)
    for at, data in c.const:
        gmem[at * config.word_bytes:at * config.word_bytes + len(data)] = data

    if view.flow:
        sel = view.flow.select
        for i in view.flow.copies:           # at the end of their path
            regions.append((("path", i), len(c.calls)))
            c.unit = f"{sel.name}:copy{i}"
            c.clamp(Clamp(c.unit, sel.inputs[i], sel.y, -128, 127))
    segments = _flow_segment(c.calls, regions, view.flow.select, config) if view.flow \
        else _segments(c.calls, config)
    if speculate is not None:
        if not view.flow:
            raise CompileError(graph.name, "Graph", "no data-dependent choice to speculate on")
        if not config.speculates:
            raise CompileError(view.flow.select.name, "Select", "the tile has no speculation "
                               "(staging_words 0): ASSUME and COMMIT are illegal there")
        segments = [_speculative_segment(c, view, units, segments[0], speculate)]
    return Program(config, graph, policy, segments, bytes(gmem), c.buffers[graph.input],
                   c.buffers[alias.get(graph.output, graph.output)], (0, config.spad_words),
                   lanes, calls=len(c.calls), tilings=c.tilings,
                   groups=[tuple(o.name for o in u.ops) for u in units],
                   constant_words=sum(len(d) for _, d in c.const) // config.word_bytes,
                   speculation=None if speculate is None else
                   (view.flow.select.name, speculate),
                   constant_loads=frozenset(c.const_loads))


def resident(program):
    """``program`` with its constants kept in the scratchpad from one run to the next:
    its kernel without the DMA loads of its weights, biases and tables.

    That is right only where the whole plan calls one kernel (every call then loads the
    same constants to the same place, and nothing else writes there), and only after a
    run of ``program`` itself has loaded them, with nothing run in between: the adaptive
    runtime's to know (``docs/runtime.md``). The kernel's cycles and GMEM traffic per
    run drop by the constants' loads; its outputs are the same.

    Raises
    ------
    CompileError
        If the plan calls more than one kernel, has more than one segment, steers
        between paths, or loads no constants.
    """
    segments = program.segments
    if len(segments) != 1 or len(segments[0].kernels) != 1 or \
            segments[0].fallback is not None or any(
                PlanInstr.from_bits(i).op not in (PlanOp.CALL, PlanOp.DONE)
                for i in segments[0].plan):
        raise CompileError(program.graph.name, "Resident", "constants stay in the "
                           "scratchpad between runs only when one kernel runs the whole "
                           "plan, which only calls it")
    (segment,) = segments
    (slot, body), = segment.kernels.items()
    kept = [i for i in body if i not in program.constant_loads]
    if len(kept) == len(body):
        raise CompileError(program.graph.name, "Resident", "the kernel loads no constants")
    return replace(program, resident=True, segments=[
        replace(segment, kernels={slot: kept})])


@dataclass
class Unit:
    """Ops compiled into one kernel (one op, or a fused group)."""
    kind: str                 # "op", "conv+pool", "conv+pool+dense", "conv+add+pool",
                              # "add+pool", "dense chain"
    ops: list

    @property
    def name(self):
        return "+".join(op.name for op in self.ops)


class _Flow:
    """Where the ops of a graph with a :class:`Select` run: ``common`` (before the
    decision: everything the key needs, and what more than one path needs), path ``i``
    (what only input ``i`` needs), ``tail`` (after the choice). Input ``i`` is
    computed straight into the Select's output buffer when its path makes it and
    nothing else reads it (``aliases``); otherwise path ``i`` copies it there."""

    def __init__(self, graph):
        selects = [op for op in graph.ops if isinstance(op, Select)]
        if len(selects) > 1:
            raise CompileError(selects[1].name, "Select", "the compiler takes one "
                               "data-dependent choice per graph")
        self.select = sel = selects[0]
        producer, producer_of, readers = {}, {}, {}
        for op in graph.ops:
            producer[op.y] = producer_of[op.name] = op
            for t in op_inputs(op):
                readers.setdefault(t, []).append(op)

        def ancestors(tensor):
            seen, stack = set(), [tensor]
            while stack:
                op = producer.get(stack.pop())
                if op is not None and op.name not in seen:
                    seen.add(op.name)
                    stack.extend(op_inputs(op))
            return seen

        before = ancestors(sel.y) - {sel.name}
        need = [ancestors(t) for t in sel.inputs]
        key = ancestors(sel.key)
        self.paths = [n - key - set().union(*(m for j, m in enumerate(need) if j != i))
                      for i, n in enumerate(need)]
        self.common = before - set().union(*self.paths)
        self._region = {n: ("common",) for n in self.common}
        self._region[sel.name] = ("select",)
        for i, path in enumerate(self.paths):
            self._region.update({n: ("path", i) for n in path})
        for i, path in enumerate(self.paths):
            for name in path:
                for r in readers.get(producer_of[name].y, []):
                    if r is not sel and r.name not in path:
                        raise CompileError(r.name, type(r).__name__, f"reads what only "
                                           f"path {i} of {sel.name} computes")
        self.aliases, self.copies = {}, []
        for i, t in enumerate(sel.inputs):
            op = producer.get(t)
            if op is not None and op.name in self.paths[i] and len(readers[t]) == 1 and \
                    t != graph.output and not isinstance(op, Flatten):
                self.aliases[t] = sel.y
            else:
                self.copies.append(i)

    def region(self, name):
        """``("common",)``, ``("select",)``, ``("path", i)`` or ``("tail",)``."""
        return self._region.get(name, ("tail",))


class _GraphView:
    """What the compiler needs to know of a graph before it compiles it: Flatten
    aliases, consumers, convolution specs; and which groups of ops fuse."""

    def __init__(self, graph, compiler):
        self.g, self.c = graph, compiler
        self.alias = {}
        for op in graph.ops:
            if isinstance(op, Flatten):
                self.alias[op.y] = self.alias.get(op.x, op.x)
        self.flow = _Flow(graph) if any(isinstance(op, Select) for op in graph.ops) else None
        if self.flow:
            self.alias.update(self.flow.aliases)
        self.consumers = {}                     # tensor -> ops reading it (not Flatten)
        for op in graph.ops:
            if isinstance(op, Flatten):
                continue
            for name in op_inputs(op):
                self.consumers.setdefault(self.alias.get(name, name), []).append(op)
        self.specs = {}
        for op in graph.ops:
            if isinstance(op, (Dense, Conv, AvgPool)):
                x = self.alias.get(op.x, op.x)
                self.specs[op.name] = _conv_spec(op, graph.tensors, x, compiler.map_shape(x))
            elif not isinstance(op, (MaxPool, Add, Clamp, Flatten, Select)):
                raise CompileError(getattr(op, "name", "?"), type(op).__name__,
                                   "not supported")

    def kind(self, ops):
        """The fusion kind of ``ops`` (in graph order), or the reason it does not fuse."""
        if len(ops) == 1:
            return "op", None
        if self.flow and len({self.flow.region(op.name) for op in ops}) > 1:
            return None, "its ops run on different sides of a data-dependent choice"
        for prev, nxt in zip(ops, ops[1:]):
            y = self.alias.get(prev.y, prev.y)
            cons = self.consumers.get(y, [])
            if len(cons) != 1 or cons[0] is not nxt or y == self.alias.get(
                    self.g.output, self.g.output):
                return None, f"{nxt.name} is not the only consumer of {prev.name}"
        c = self.c
        if len(ops) == 2 and isinstance(ops[0], Conv) and isinstance(ops[1], MaxPool):
            if any(ops[1].pads):
                return None, "a padded max-pool does not fuse"
            spec = self.specs[ops[0].name]
            if c.conv_tiling(spec, _ConvConsts.layout(spec, c.R, c.wb), ops[1]) is None:
                return None, "conv and pool do not fit one kernel"
            return "conv+pool", None
        if len(ops) == 3 and isinstance(ops[0], Conv) and isinstance(ops[1], Add) and \
                isinstance(ops[2], MaxPool):
            if any(ops[2].pads):
                return None, "a padded max-pool does not fuse"
            reason = c.conv_add_pool_layout(self.specs[ops[0].name], ops[1], ops[2])[1]
            return ("conv+add+pool", None) if reason is None else (None, reason)
        if len(ops) == 2 and isinstance(ops[0], Add) and isinstance(ops[1], MaxPool):
            if any(ops[1].pads):
                return None, "a padded max-pool does not fuse"
            reason = c.add_pool_layout(ops[0], ops[1])[1]
            return ("add+pool", None) if reason is None else (None, reason)
        if all(isinstance(op, Dense) for op in ops):
            reason = c.dense_chain_fit([self.specs[op.name] for op in ops])
            return ("dense chain", None) if reason is None else (None, reason)
        if len(ops) > 2 and isinstance(ops[0], Conv) and isinstance(ops[1], MaxPool) and \
                all(isinstance(op, Dense) for op in ops[2:]) and not any(ops[1].pads):
            reason = c.conv_pool_dense_layout(self.specs[ops[0].name], ops[1],
                                              [self.specs[op.name] for op in ops[2:]])[1]
            return ("conv+pool+dense", None) if reason is None else (None, reason)
        return None, ("the compiler fuses a conv or an add with a max-pool (a conv's with "
                      "Dense layers after it, or with the add that joins a residual branch), "
                      "or a chain of Dense layers")

    def units(self, groups):
        """Every op (but Flatten) in a unit, in graph order; ``groups`` fused."""
        order = {op.name: i for i, op in enumerate(self.g.ops)}
        of = {}
        for group in groups:
            names = sorted(group, key=lambda n: order.get(n, -1))
            for n in names:
                if n not in order:
                    raise CompileError("+".join(group), "Fusion", f"no op {n!r}")
                if n in of:
                    raise CompileError("+".join(group), "Fusion", f"{n} is in two groups")
            ops = [self.g.ops[order[n]] for n in names if not isinstance(
                self.g.ops[order[n]], Flatten)]
            kind, reason = self.kind(ops)
            if kind is None:
                raise CompileError("+".join(names), "Fusion", reason)
            unit = Unit(kind, ops)
            for n in names:
                of[n] = unit
        # A fused unit runs where its last op is: every input from outside it is made
        # by then, and what its other ops make only it reads.
        units = []
        for op in self.g.ops:
            if isinstance(op, Flatten):
                continue
            unit = of.get(op.name) or Unit("op", [op])
            if op is unit.ops[-1]:
                units.append(unit)
        return units


def fusion_kind(graph, config, group):
    """How the compiler would fuse ``group`` (op names): ``"op"``, ``"conv+pool"``,
    ``"conv+pool+dense"``, ``"conv+add+pool"``, ``"add+pool"``, ``"dense chain"``; or
    raise :class:`CompileError` saying why it cannot."""
    view = _GraphView(graph, _Compiler(graph, config, "none", 1))
    members = set(group)
    return next(u.kind for u in view.units([tuple(group)])
                if members & {op.name for op in u.ops})


def unit_groups(graph, config, groups):
    """``groups`` completed to every unit of the graph, in order (ops not named are
    units of their own; Flatten is no unit): the form ``Program.groups`` has."""
    view = _GraphView(graph, _Compiler(graph, config, "none", 1))
    return [tuple(op.name for op in u.ops) for u in view.units(groups)]


def unit_edges(graph, config, groups):
    """The dependency graph between the units ``groups`` (as ``Program.groups``):
    (producer, consumer) pairs where the consumer is the only unit that reads the
    producer's output."""
    view = _GraphView(graph, _Compiler(graph, config, "none", 1))
    unit_of = {n: tuple(g) for g in groups for n in g}
    by_name = {op.name: op for op in graph.ops}
    out = []
    for g in map(tuple, groups):
        y = by_name[g[-1]].y
        readers = [unit_of[op.name] for op in view.consumers.get(view.alias.get(y, y), [])]
        if len(readers) == 1 and readers[0] != g:
            out.append((g, readers[0]))
    return out


def static_groups(graph, config):
    """The ``static`` policy's fixed rule set (like TVM's FuseOps), applied without
    measuring anything: a convolution whose only consumer is an unpadded max-pool is
    fused with it, and a chain of Dense layers, each the only consumer of the one
    before, into one kernel; each when it fits. (Bias, requantisation and a ReLU are part
    of every convolution kernel.) Merges across a pooling or an add, of residual
    branches and of siblings are the adaptive runtime's, when its measurements say they
    pay."""
    view = _GraphView(graph, _Compiler(graph, config, "static", 1))
    groups, taken = [], set()

    def only_consumer(op):
        nxt = view.consumers.get(view.alias.get(op.y, op.y), [])
        return nxt[0] if len(nxt) == 1 else None

    for op in graph.ops:
        if op.name in taken:
            continue
        nxt = only_consumer(op)
        group = []
        if isinstance(op, Conv) and nxt is not None and \
                view.kind([op, nxt])[0] == "conv+pool":
            group = [op, nxt]
        elif isinstance(op, Dense):
            group = [op]
            while isinstance(nxt, Dense) and view.kind(group + [nxt])[0] == "dense chain":
                group.append(nxt)
                nxt = only_consumer(nxt)
        if len(group) > 1:
            groups.append(tuple(o.name for o in group))
            taken.update(groups[-1])
    return groups


def _region_order(region):
    return {"common": (0, 0), "select": (1, 0), "path": (2, region[-1]),
            "tail": (3, 0)}[region[0]]


def _flow_segment(calls, regions, select, config):
    """One segment whose plan steers between the paths of ``select``: the common calls
    (the last one decides: a flag for a threshold, an index for an argmax), then a
    BRANCH or a SWITCH over a table of JUMPs to each path's calls, every path JUMPing
    to the tail."""
    by_region = {}
    for k, (region, first) in enumerate(regions):
        end = regions[k + 1][1] if k + 1 < len(regions) else len(calls)
        by_region.setdefault(region, []).extend(calls[first:end])
    kernels, plan, units = {}, [], []

    def put(instr, unit=None):
        plan.append(instr)
        units.append(unit)
        return len(plan) - 1

    def put_calls(region):
        for body, a, b, unit in by_region.get(region, []):
            slot = kernels.setdefault(body, len(kernels))
            put(call(slot, a=a, b=b), unit)

    n = len(select.inputs)
    put_calls(("common",))
    put_calls(("select",))
    if select.mode == "threshold":
        # Path 0 (the flag set: the key reached the threshold) after path 1.
        at_branch = put(None)
        put_calls(("path", 1))
        at_jump = put(None)
        starts, jumps = {0: len(plan)}, [at_jump]
        put_calls(("path", 0))
        plan[at_branch] = branch(_SELECT_FLAG, starts[0])
    else:
        at_switch = put(None)
        table = [put(None) for _ in range(n)]
        starts, jumps = {}, []
        for i in range(n):
            starts[i] = len(plan)
            put_calls(("path", i))
            if i < n - 1:
                jumps.append(put(None))
        plan[at_switch] = switch(_SELECT_INDEX, table[0], n)
        for i, at in enumerate(table):
            plan[at] = jump(starts[i])
    for at in jumps:
        plan[at] = jump(len(plan))
    put_calls(("tail",))
    put(done())
    if len(kernels) > config.kernel_slots or len(plan) > config.plan_depth:
        raise CompileError(select.name, "Select", f"the plan around the choice needs "
                           f"{len(kernels)} kernels and {len(plan)} plan instructions, the "
                           f"tile has {config.kernel_slots} slots and a bank of "
                           f"{config.plan_depth}")
    return [Segment({s: list(k) for k, s in kernels.items()}, plan, units)]


def _speculative_segment(c, view, units, fallback, guess):
    """The plan that guesses path ``guess`` of the Select, beside its ``fallback``:

    the fallback's calls of the units before the decision, but those of the *head*
    (the key's producer and the vector ops before it, up to the first op of another
    kind); ``assume`` (the guess), with the fallback's first call of the head as the
    place a miss resumes; one kernel (:meth:`_Compiler.speculative`) running the head,
    the decision and the guessed path; ``commit``; the fallback's calls after the
    choice; ``done``. The decision writes the guarded flag, so a wrong guess rolls back
    to the fallback as soon as it is known; a right one publishes the staged result at
    ``commit``."""
    flow, sel, cfg = view.flow, view.flow.select, c.cfg
    if not 0 <= guess < len(sel.inputs):
        raise ValueError(f"speculate must be a path of {sel.name!r} "
                         f"(0..{len(sel.inputs) - 1}), not {guess!r}")
    key = view.alias.get(sel.key, sel.key)
    producer = {view.alias.get(op.y, op.y): op for op in c.g.ops if not isinstance(op, Flatten)}
    # The key's producer and the vector ops before it that the decision waits for.
    inside, stack = set(), [producer[key]]
    while stack:
        op = stack.pop()
        if op.name in inside:
            continue
        inside.add(op.name)
        for t in op_inputs(op):
            p = producer.get(view.alias.get(t, t))
            if isinstance(p, _VECTOR_OPS) and flow.region(p.name) == ("common",):
                stack.append(p)
    head_units = [u for u in units if inside & {op.name for op in u.ops}]
    for u in head_units:
        if {op.name for op in u.ops} - inside:
            raise CompileError(u.name, "Speculate", "a unit only partly before the key")
    ops = [op for op in c.g.ops if op.name in inside or
           flow.region(op.name) == ("path", guess) and not isinstance(op, Flatten)]
    if guess in flow.copies:
        ops.append(Clamp(f"{sel.name}:copy{guess}", sel.inputs[guess], sel.y, -128, 127))
    region_of = {u.name: flow.region(u.ops[0].name) for u in units}
    head_units = [u.name for u in head_units]
    c.speculative(ops, view, guess)
    body = c.calls[-1][0]
    kernels = dict(fallback.kernels)
    slot = len(kernels)
    kernels[slot] = list(body)
    plan, names = [], []
    for pc, instr in enumerate(fallback.plan):
        if region_of.get(fallback.units[pc]) == ("common",) and \
                fallback.units[pc] not in head_units:
            plan.append(instr)
            names.append(fallback.units[pc])
    resume = min(fallback.units.index(u) for u in head_units)
    flag, expect = (_SELECT_FLAG, guess == 0) if sel.mode == "threshold" else (_GUARD_FLAG, True)
    plan += [assume(flag, resume, expect=expect), call(slot), commit()]
    names += [None, c.unit, None]
    for pc, instr in enumerate(fallback.plan):
        if region_of.get(fallback.units[pc]) == ("tail",):
            plan.append(instr)
            names.append(fallback.units[pc])
    plan.append(done())
    names.append(None)
    if len(kernels) > cfg.kernel_slots or len(plan) > cfg.plan_depth:
        raise CompileError(c.unit, "Speculate", f"needs {len(kernels)} kernels beside the "
                           f"fallback's; the tile has {cfg.kernel_slots} slots")
    return Segment(kernels, plan, names, fallback=fallback.plan,
                   fallback_units=fallback.units)


def _segments(calls, config):
    """Cut the CALL sequence into segments that fit the slots and a plan bank."""
    segments = []
    kernels, plan, units = {}, [], []

    def close():
        segments.append(Segment({s: list(k) for k, s in kernels.items()}, plan + [done()],
                                units))

    for body, a, b, unit in calls:
        slot = kernels.get(body)
        if slot is None and len(kernels) == config.kernel_slots or \
                len(plan) + 2 > config.plan_depth:
            close()
            kernels, plan, units = {}, [], []
            slot = None
        if slot is None:
            slot = kernels[body] = len(kernels)
        plan.append(call(slot, a=a, b=b))
        units.append(unit)
    if plan:
        close()
    return segments
