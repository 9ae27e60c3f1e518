"""The integer graph IR: what an imported network is, once quantisation is lowered.

A :class:`Graph` is a list of integer operators over int8 tensors, in topological
order, with one input and one output. Every tensor carries its quantisation (scale and
zero point in the *int8* domain: a uint8 model's zero points are shifted by -128, which
is exact). Shapes leave out the batch dimension: ``(C, H, W)`` for feature maps,
``(K,)`` for vectors; flattening is in ``C, H, W`` order, as ONNX's Flatten.

Operators are defined bit-exactly by :func:`run_reference` (int32 accumulation,
fixed-point requantisation of :func:`fusetile.kernels.arith.requantize`), which is what
the tile computes: the kernel compiler is tested against it, and the ONNX importer
against onnxruntime through it.

The quantise step at the input and the dequantise step at the output run on the host
(:meth:`Graph.quantize_input`, :meth:`Graph.dequantize_output`).
"""

from dataclasses import dataclass, field

import numpy as np

from . import arith


__all__ = ["QTensor", "Requant", "Dense", "Conv", "MaxPool", "AvgPool", "Add", "Clamp",
           "Flatten", "Select", "Graph", "GraphError", "op_inputs", "run_reference",
           "avgpool_requant"]


class GraphError(ValueError):
    """A model the tile cannot run, naming the node and op (never a wrong answer)."""

    def __init__(self, node, op, reason):
        self.node, self.op, self.reason = node, op, reason
        super().__init__(f"node {node!r} ({op}): {reason}")


@dataclass
class QTensor:
    """An int8 tensor: real value = ``scale * (q - zero_point)``."""
    name: str
    shape: tuple
    scale: float
    zero_point: int

    @property
    def size(self):
        return int(np.prod(self.shape))


@dataclass
class Requant:
    """Per-output-channel fixed-point scales: ``real = multiplier / 2**(31 + shift)``,
    ``multiplier`` in [2**30, 2**31) (or 0), ``shift`` in 0..31 (the tile's REQUANT)."""
    multiplier: np.ndarray     # int64, one per output channel
    shift: np.ndarray          # int64, one per output channel

    @classmethod
    def from_scales(cls, scales, *, node="?", op="?"):
        """The closest representable fixed-point scales to ``scales`` (real, >= 0).

        Raises
        ------
        GraphError
            If a scale is 1 or more, or so small that it is below 2**-32 (but not 0).
        """
        scales = np.atleast_1d(np.asarray(scales, dtype=np.float64))
        mult = np.zeros(scales.shape, dtype=np.int64)
        shift = np.zeros(scales.shape, dtype=np.int64)
        for i, s in enumerate(scales):
            if s == 0:
                continue
            if not 0 < s < 1:
                raise GraphError(node, op, f"requantisation scale {s:g} is not in (0, 1): "
                                 "the tile's multipliers are Q0.31")
            mantissa, exponent = np.frexp(s)          # s = mantissa * 2**exponent
            q = int(round(mantissa * 2**31))          # in [2**30, 2**31]
            if q == 2**31:
                q //= 2
                exponent += 1
            sh = -exponent
            if sh < 0:                                # rounded up to 1: the largest below
                q, sh = 2**31 - 1, 0
            if sh > 31:
                # Fold what does not fit in the shift into the multiplier.
                q >>= sh - 31
                sh = 31
            mult[i], shift[i] = q, sh
        return cls(mult, shift)

    def channel(self, i):
        return int(self.multiplier[i]), int(self.shift[i])


@dataclass
class _Op:
    name: str                  # the ONNX node it came from (for errors and reports)


@dataclass
class Dense(_Op):
    """``y = clamp(zp_y + rq(bias + sum_k w[n, k] * (x[k] - zp_x)), lo, hi)``; ``x`` is
    flattened in C, H, W order; ``w`` is int8 ``(N, K)`` (int16 within -255..255 when a
    weight zero point was folded in), ``bias`` int32 ``(N,)``."""
    x: str
    y: str
    weight: np.ndarray
    bias: np.ndarray
    requant: Requant
    lo: int = -128
    hi: int = 127


@dataclass
class Conv(_Op):
    """2-D convolution over ``(C, H, W)``, padding with the input's zero point (real 0):
    ``w`` int8 ``(Co, Ci, KH, KW)`` (or int16, as for Dense), ``bias`` int32 ``(Co,)``;
    output clamped to ``lo..hi`` (``lo`` = the output zero point fuses a ReLU)."""
    x: str
    y: str
    weight: np.ndarray
    bias: np.ndarray
    requant: Requant
    stride: tuple = (1, 1)
    pads: tuple = (0, 0, 0, 0)         # top, left, bottom, right
    lo: int = -128
    hi: int = 127


@dataclass
class MaxPool(_Op):
    """Max over windows; input and output share scale and zero point; padding never
    wins (it is -128)."""
    x: str
    y: str
    kernel: tuple
    stride: tuple
    pads: tuple = (0, 0, 0, 0)


@dataclass
class AvgPool(_Op):
    """Average over windows (GlobalAveragePool: the window is the whole map):
    ``y = clamp(zp_y + rq(sum (x - zp_x)), lo, hi)`` with a scale of
    ``s_x / (s_y * count)`` per window, ``count`` the window's size (or, without
    ``count_include_pad``, the number of its elements inside the map)."""
    x: str
    y: str
    kernel: tuple
    stride: tuple
    pads: tuple = (0, 0, 0, 0)
    count_include_pad: bool = False
    lo: int = -128
    hi: int = 127


@dataclass
class Add(_Op):
    """``y = clamp(zp_y + round(((a - zp_a) * M_a + (b - zp_b) * M_b) / 2**(31 + S)),
    lo, hi)``: the tile's VADD. ``M_a``, ``M_b`` are Q0.31 multipliers of
    ``s_a / s_y`` and ``s_b / s_y`` with the common shift ``S``."""
    a: str
    b: str
    y: str
    mult_a: int
    mult_b: int
    shift: int
    lo: int = -128
    hi: int = 127


@dataclass
class Clamp(_Op):
    """``y = clamp(x, lo, hi)`` (a ReLU in the quantised domain: ``lo`` = zero point);
    input and output share scale and zero point."""
    x: str
    y: str
    lo: int
    hi: int


@dataclass
class Flatten(_Op):
    """``(C, H, W)`` -> ``(C*H*W,)``; no data moves in C, H, W order."""
    x: str
    y: str


@dataclass
class Select(_Op):
    """A data-dependent choice: ``y = inputs[i]``, ``i`` decided by the int8 vector
    ``key``. Mode ``"argmax"``: ``i`` is the index of the largest element of ``key``
    (the lowest on ties), one input per element (a mixture of experts' top-1 gate).
    Mode ``"threshold"``: ``i`` is 0 when the largest element of ``key`` is at least
    ``threshold``, else 1 (an early exit on the exit head's largest logit).

    The inputs have ``y``'s shape and quantisation. Only the chosen one needs
    computing: the compiler runs the ops that only input ``i`` needs on path ``i`` of
    a BRANCH or SWITCH, after the ops the key needs."""
    key: str
    inputs: tuple
    y: str
    mode: str
    threshold: int = 0

    def choose(self, key):
        """The index of the chosen input for the int8 ``key`` values."""
        key = np.asarray(key).reshape(-1)
        if self.mode == "argmax":
            return int(np.argmax(key))
        return 0 if int(key.max()) >= self.threshold else 1


def op_inputs(op):
    """The tensors ``op`` reads, in order (a Select's key first)."""
    if isinstance(op, Add):
        return (op.a, op.b)
    if isinstance(op, Select):
        return (op.key,) + tuple(op.inputs)
    return (op.x,)


@dataclass
class Graph:
    """An integer network: ``ops`` in topological order from ``input`` to ``output``."""
    name: str
    tensors: dict                    # name -> QTensor
    ops: list
    input: str
    output: str
    notes: list = field(default_factory=list)

    def quantize_input(self, x):
        """Float samples ``(N, *input shape)`` -> int8, as onnxruntime's
        QuantizeLinear (round half to even, saturate)."""
        t = self.tensors[self.input]
        x = np.asarray(x, dtype=np.float32)
        q = np.rint(x / np.float32(t.scale)) + t.zero_point
        return np.clip(q, -128, 127).astype(np.int8)

    def dequantize_output(self, q):
        t = self.tensors[self.output]
        return ((np.asarray(q, dtype=np.int32) - t.zero_point) *
                np.float32(t.scale)).astype(np.float32)


# -- the reference ------------------------------------------------------------------------

def _pad(x, pads, value):
    t, l, b, r = pads
    return np.pad(x, ((0, 0), (t, b), (l, r)), constant_values=value)


def _windows(x, kernel, stride):
    """(C, OH, OW, KH, KW) view of the windows of padded ``x`` (C, H, W)."""
    kh, kw = kernel
    sh, sw = stride
    c, h, w = x.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    s = x.strides
    return np.lib.stride_tricks.as_strided(
        x, (c, oh, ow, kh, kw), (s[0], s[1] * sh, s[2] * sw, s[1], s[2]), writeable=False)


def _requantize(acc, rq, zp, lo, hi, axis):
    """Requantise int32 ``acc`` with per-channel ``rq`` along ``axis``."""
    shape = [1] * acc.ndim
    shape[axis] = -1
    out, _ = arith.requantize(acc, rq.multiplier.reshape(shape), rq.shift.reshape(shape),
                              zp, lo, hi)
    return out


def _wrap32(x):
    return ((np.asarray(x, dtype=np.int64) + 2**31) % 2**32 - 2**31).astype(np.int64)


def run_reference(graph, x):
    """Run ``graph`` on one int8 sample ``x`` (the input's shape); returns every
    tensor {name: int8 array}. This *defines* the integer semantics of the IR."""
    env = {graph.input: np.asarray(x, dtype=np.int8).reshape(graph.tensors[graph.input].shape)}
    T = graph.tensors
    for op in graph.ops:
        if isinstance(op, Dense):
            x_ = env[op.x].reshape(-1).astype(np.int64) - T[op.x].zero_point
            acc = _wrap32(op.bias.astype(np.int64) + op.weight.astype(np.int64) @ x_)
            y = _requantize(acc, op.requant, T[op.y].zero_point, op.lo, op.hi, 0)
        elif isinstance(op, Conv):
            zx = T[op.x].zero_point
            xp = _pad(env[op.x].astype(np.int64) - zx, op.pads, 0)
            win = _windows(xp, op.weight.shape[2:], op.stride)   # C, OH, OW, KH, KW
            acc = np.einsum("chwij,ocij->ohw", win, op.weight.astype(np.int64))
            acc = _wrap32(acc + op.bias.astype(np.int64)[:, None, None])
            y = _requantize(acc, op.requant, T[op.y].zero_point, op.lo, op.hi, 0)
        elif isinstance(op, MaxPool):
            xp = _pad(env[op.x], op.pads, -128)
            y = _windows(xp, op.kernel, op.stride).max(axis=(3, 4))
        elif isinstance(op, AvgPool):
            zx, sx = T[op.x].zero_point, T[op.x].scale
            ty = T[op.y]
            xs = env[op.x].astype(np.int64) - zx
            win = _windows(_pad(xs, op.pads, 0), op.kernel, op.stride)
            acc = win.sum(axis=(3, 4))
            ones = _windows(_pad(np.ones((1,) + xs.shape[1:], np.int64), op.pads, 0),
                            op.kernel, op.stride).sum(axis=(3, 4))[0]
            y = np.empty(acc.shape, dtype=np.int8)
            for (i, j), inside in np.ndenumerate(ones):
                count = int(np.prod(op.kernel)) if op.count_include_pad else int(inside)
                rq = avgpool_requant(op, sx, ty.scale, count)
                y[:, i, j] = arith.requantize(acc[:, i, j], rq.multiplier[0], rq.shift[0],
                                              ty.zero_point, op.lo, op.hi)[0]
        elif isinstance(op, Add):
            out, _ = arith.vadd(env[op.a].reshape(-1), env[op.b].reshape(-1),
                                mult_a=op.mult_a, mult_b=op.mult_b, shift=op.shift,
                                zp_a=T[op.a].zero_point, zp_b=T[op.b].zero_point,
                                zp_out=T[op.y].zero_point, lo=op.lo, hi=op.hi)
            y = out.reshape(T[op.y].shape)
        elif isinstance(op, Clamp):
            y = np.clip(env[op.x], op.lo, op.hi)
        elif isinstance(op, Flatten):
            y = env[op.x].reshape(-1)
        elif isinstance(op, Select):
            y = env[op.inputs[op.choose(env[op.key])]]
        else:
            raise TypeError(f"not an IR operator: {op!r}")
        env[getattr(op, "y")] = np.asarray(y, dtype=np.int8).reshape(T[op.y].shape)
    return env


def avgpool_requant(op, scale_x, scale_y, count):
    """The fixed-point scale of an average window of ``count`` elements."""
    return Requant.from_scales(scale_x / (scale_y * count), node=op.name, op="AvgPool")
