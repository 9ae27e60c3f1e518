"""Bit-exact reference arithmetic of the tile's compute micro-instructions.

These NumPy functions *define* what MATMUL, REQUANT, VADD, VPOOL, VCLAMP, VCMP and
VARGMAX compute (see ``kernels/isa.py`` for the operands). The golden model executes
programs with them and the gateware is tested against them, so any disagreement is
a bug in one of the two, never a matter of interpretation.

All integer arithmetic is exact (int64 holds every intermediate: an int32 accumulator
times a 31-bit multiplier needs 63 bits).
"""

import numpy as np


__all__ = [
    "INT8_MIN", "INT8_MAX", "round_shift", "requantize", "matmul_step", "vadd",
    "vpool", "vclamp", "vcmp", "vargmax", "vargmax_column", "vargmax_test", "lanes_to_word",
    "word_to_lanes",
]


INT8_MIN, INT8_MAX = -128, 127


def round_shift(x, n):
    """``x / 2**n`` rounded to the nearest integer, ties to even (int64 arrays, n >= 1).

    This is what ``round()`` does in onnxruntime's requantisation, computed without
    floating point.
    """
    x = np.asarray(x, dtype=np.int64)
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n!r}")
    q = x >> n                                   # floor
    r = x - (q << n)                             # 0 <= r < 2**n
    half = np.int64(1) << (n - 1)
    up = (r > half) | ((r == half) & (q & 1 == 1))
    return q + up


def requantize(acc, mult, shift, zp, lo, hi):
    """clamp(zp + round_shift(acc * mult, 31 + shift), lo, hi).

    Returns ``(values as int8, saturated)`` where ``saturated`` marks lanes the clamp
    changed (counted by the tile's saturation counter).

    Parameters
    ----------
    acc : int32 array
    mult : int or int array broadcastable to ``acc``
        Q0.31 multiplier, 0 .. 2**31 - 1.
    shift : int or int array
        Extra right shift, 0 .. 31.
    zp, lo, hi : int
        Output zero point and clamp bounds (int8 range).
    """
    acc = np.asarray(acc, dtype=np.int64)
    mult = np.asarray(mult, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    prod = acc * mult
    if shift.ndim == 0:
        scaled = round_shift(prod, 31 + int(shift))
    else:
        shift = np.broadcast_to(shift, prod.shape)
        scaled = np.empty_like(prod)
        for s in np.unique(shift):
            sel = shift == s
            scaled[sel] = round_shift(prod[sel], 31 + int(s))
    y = scaled + zp
    out = np.clip(y, lo, hi)
    return out.astype(np.int8), out != y


def matmul_step(acc, a_lanes, b_lanes):
    """One MATMUL step: acc + outer(a, b) (int32, wrapping like the hardware)."""
    a = np.asarray(a_lanes, dtype=np.int64)
    b = np.asarray(b_lanes, dtype=np.int64)
    total = np.asarray(acc, dtype=np.int64) + np.outer(a, b)
    return ((total + 2**31) % 2**32 - 2**31).astype(np.int32)


def vadd(a, b, *, mult_a, mult_b, shift, zp_a, zp_b, zp_out, lo, hi):
    """Lane-wise requantised add of int8 arrays ``a`` and ``b``; returns
    ``(int8 values, saturated)``."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    total = (a - zp_a) * mult_a + (b - zp_b) * mult_b
    y = round_shift(total, 31 + shift) + zp_out
    out = np.clip(y, lo, hi)
    return out.astype(np.int8), out != y


def vpool(windows, *, average, pairs, mult=0, shift=0, zp_in=0, zp_out=0, lo=-128, hi=127):
    """Pool int8 ``windows`` of shape (window, lanes) into one word of lanes.

    Returns ``(int8 lanes, saturated)``; with ``pairs``, lane j combines lanes 2j and
    2j+1 and the upper half of the lanes is 0.
    """
    w = np.asarray(windows, dtype=np.int64)
    lanes = w.shape[1]
    if pairs:
        w = w[:, :lanes - lanes % 2].reshape(w.shape[0], -1, 2).transpose(0, 2, 1)
        w = w.reshape(-1, (lanes - lanes % 2) // 2)
    if average:
        y = round_shift((w - zp_in).sum(axis=0) * mult, 31 + shift) + zp_out
        out = np.clip(y, lo, hi)
        sat = out != y
    else:
        out = w.max(axis=0)
        sat = np.zeros(out.shape, dtype=bool)
    if pairs:
        out = np.concatenate([out, np.zeros(lanes - out.shape[0], dtype=np.int64)])
        sat = np.concatenate([sat, np.zeros(lanes - sat.shape[0], dtype=bool)])
    return out.astype(np.int8), sat


def vclamp(x, lo, hi):
    return np.clip(np.asarray(x, dtype=np.int64), lo, hi).astype(np.int8)


_CMP = {
    "GE": np.greater_equal, "GT": np.greater, "LT": np.less, "EQ": np.equal,
}


def vcmp(value, op, imm):
    """The flag VCMP writes: ``value op imm`` (``op`` a CmpOp or its name)."""
    name = getattr(op, "name", op)
    return bool(_CMP[name](int(value), int(imm)))


def vargmax(lanes):
    """Index of the largest int8 lane, the lowest on ties."""
    return int(np.argmax(np.asarray(lanes, dtype=np.int64)))


def vargmax_column(words, lane):
    """VARGMAX with ``column``: the number of the word (row of ``words``, shape
    (n, word_bytes), int8) whose lane ``lane`` is the largest, the lowest on ties."""
    return vargmax(np.asarray(words, dtype=np.int64)[:, lane])


def vargmax_test(result, expect):
    """The flag VARGMAX with ``test`` writes: ``result == expect``."""
    return int(result) == int(expect)


def word_to_lanes(word, word_bytes):
    """The int8 lanes of a scratchpad word given as an int (lane 0 = byte 0)."""
    return np.frombuffer(int(word).to_bytes(word_bytes, "little"), dtype=np.int8).copy()


def lanes_to_word(lanes):
    """Pack int8 lanes into an int (lane 0 = byte 0)."""
    return int.from_bytes(np.asarray(lanes, dtype=np.int8).tobytes(), "little")
