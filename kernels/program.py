"""Builders for plan instructions and micro-instructions.

Each function returns the instruction's bits as an ``int``, packed through the layouts
in :mod:`fusetile.kernels.isa` (the same ones the gateware decodes with), ready for
``Device.load_plan`` / ``Device.load_kernel``.

    plan = [call(0, a=0x100), done()]
    kernel = [dma_load(gmem=0, spad=0, rows=4, cols=2, base=GmemBase.ARG0), ret()]

Every operand is range-checked against the width of its field in the layout (and
against the narrower range the semantics allow, e.g. a flag number below ``FLAGS``);
a bad one raises :class:`ValueError` naming the operand. Signed immediates (int8)
take -128..127 and are stored as two's complement. :mod:`fusetile.kernels.asm` is the
textual form of the same instructions.
"""

import enum
import functools

from amaranth.lib import data

from .isa import (PlanOp, PlanInstr, MicroOp, MicroInstr, GmemBase, CmpOp, VectorCfg,
                  DmaArgs, WaitArgs, MatmulArgs, AccBiasArgs, RequantArgs, VaddArgs,
                  VpoolArgs, VclampArgs, VcmpArgs, VargmaxArgs, VcfgArgs,
                  FLAGS, INDEX_REGS)


__all__ = [
    # plan
    "nop", "call", "done", "mark", "jump", "branch", "switch", "assume", "commit",
    # micro
    "micro_nop", "ret", "wait", "dma_load", "dma_store", "matmul", "acc_bias", "requant",
    "vadd", "vpool", "vclamp", "vcmp", "vargmax", "vcfg",
    "VCFG_RANGES",
]


#: The values each vector configuration register takes (VCFG ``value``): the
#: multipliers are Q0.31, SHIFT a shift count, the others int8.
VCFG_RANGES = {
    VectorCfg.MULT_A: (0, 2**31 - 1),
    VectorCfg.MULT_B: (0, 2**31 - 1),
    VectorCfg.SHIFT:  (0, 31),
    VectorCfg.ZP_A:   (-128, 127),
    VectorCfg.ZP_B:   (-128, 127),
    VectorCfg.ZP_OUT: (-128, 127),
    VectorCfg.LO:     (-128, 127),
    VectorCfg.HI:     (-128, 127),
}


def _width(layout, field):
    return _fields(layout)[field][1]


def _check_range(name, value, lo, hi):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    return value


def _check(name, value, bits):
    """``value`` as an unsigned ``bits``-bit field."""
    return _check_range(name, value, 0, (1 << bits) - 1)


def _check_field(name, value, layout, field, lo=0):
    """``value`` for ``layout.field`` (unsigned, ``lo`` up to the field's maximum)."""
    return _check_range(name, value, lo, (1 << _width(layout, field)) - 1)


def _check_int8(name, value):
    """A signed 8-bit immediate, as its two's complement bits."""
    return _check_range(name, value, -128, 127) & 0xFF


def _check_bool(name, value):
    if value not in (0, 1) or not isinstance(value, int):
        raise ValueError(f"{name} must be a bool, not {value!r}")
    return int(value)


def _check_enum(name, value, enum):
    if isinstance(value, enum):
        return value
    if isinstance(value, str) and value.upper() in enum.__members__:
        return enum[value.upper()]
    names = ", ".join(m.name for m in enum)
    raise ValueError(f"{name} must be a {enum.__name__} ({names}), not {value!r}")


@functools.cache
def _fields(shape):
    """{field: (offset, width, shape)} of a layout (or a Struct/Union class)."""
    layout = data.Layout.cast(shape)
    return {name: (f.offset, f.width, f.shape) for name, f in layout}


def _pack(shape, value):
    """The bits of ``value`` (nested dicts of ints and enum members) in ``shape``: what
    ``Layout.const(value).as_bits()`` gives, computed from the same layouts without
    building Amaranth constants (which cost milliseconds per instruction, and the
    runtime JIT-compiles kernels of hundreds)."""
    if isinstance(value, dict):
        bits = 0
        fields = _fields(shape)
        for name, v in value.items():
            offset, width, sub = fields[name]
            bits |= (_pack(sub, v) & ((1 << width) - 1)) << offset
        return bits
    if isinstance(value, enum.Enum):
        return value.value
    return int(value)


# -- plan instructions -----------------------------------------------------------------

def _plan(op, *, cond=0, sel=0, a=0, b=0):
    return _pack(PlanInstr, {
        "op": op, "cond": cond, "sel": _check_field("sel", sel, PlanInstr, "sel"),
        "a": _check_field("a", a, PlanInstr, "a"), "b": _check_field("b", b, PlanInstr, "b"),
    })


def nop():
    """Plan NOP."""
    return _plan(PlanOp.NOP)


def call(slot, a=0, b=0):
    """Run kernel slot ``slot`` with arguments ``a`` and ``b`` (24-bit GMEM word bases)."""
    return _plan(PlanOp.CALL, sel=_check_field("slot", slot, PlanInstr, "sel"), a=a, b=b)


def done():
    """End of the plan."""
    return _plan(PlanOp.DONE)


def mark(value):
    """Write ``value`` to the MARK register (a NOP on a tile without it:
    ``TileConfig.debug_regs``)."""
    return _plan(PlanOp.MARK, a=_check_field("value", value, PlanInstr, "a"))


def jump(a):
    """Continue at plan PC ``a``."""
    return _plan(PlanOp.JUMP, a=a)


def branch(flag, target, *, if_set=True):
    """Continue at ``target`` if flag F[``flag``] is set (``if_set``) or clear."""
    return _plan(PlanOp.BRANCH, sel=_check_range("flag", flag, 0, FLAGS - 1),
                 cond=_check_bool("if_set", if_set),
                 a=_check_field("target", target, PlanInstr, "a"))


def switch(index, table, size):
    """Continue at ``table + X[index]``; an index at or beyond ``size`` faults
    (SWITCH_RANGE)."""
    return _plan(PlanOp.SWITCH, sel=_check_range("index", index, 0, INDEX_REGS - 1),
                 a=_check_field("table", table, PlanInstr, "a"),
                 b=_check_field("size", size, PlanInstr, "b"))


def assume(flag, resume, *, expect=True):
    """Open a speculative region guarded by F[``flag``] == ``expect``; on a miss the tile
    continues at PC ``resume`` of the other plan bank."""
    return _plan(PlanOp.ASSUME, sel=_check_range("flag", flag, 0, FLAGS - 1),
                 cond=_check_bool("expect", expect),
                 a=_check_field("resume", resume, PlanInstr, "a"))


def commit():
    """Close the speculative region: publish its stores if the guard holds, else roll
    back."""
    return _plan(PlanOp.COMMIT)


# -- micro-instructions ----------------------------------------------------------------

def _micro(op, args=None):
    return _pack(MicroInstr, {"op": op, "args": args or {"raw": 0}})


def micro_nop():
    return _micro(MicroOp.NOP)


def ret():
    """Wait for the DMA engine, then return to the plan."""
    return _micro(MicroOp.RET)


def wait(tokens=0, *, compute=False):
    """Wait until no DMA tagged with a token in the mask ``tokens`` is outstanding and,
    with ``compute``, the compute unit is idle (no arguments: every DMA)."""
    return _micro(MicroOp.WAIT, {"wait": {
        "tokens": _check_field("tokens", tokens, WaitArgs, "tokens"),
        "compute": int(bool(compute))}})


def _dma(op, gmem, spad, rows, cols, gmem_stride, spad_stride, base, token):
    if not isinstance(base, GmemBase):
        raise TypeError(f"base must be a GmemBase, not {base!r}")
    cols = _check_field("cols", cols, DmaArgs, "cols")
    return _micro(op, {"dma": {
        "gmem_base": base,
        "gmem_addr": _check_field("gmem", gmem, DmaArgs, "gmem_addr"),
        "gmem_stride": _check_field("gmem_stride", cols if gmem_stride is None else gmem_stride,
                                    DmaArgs, "gmem_stride"),
        "spad_addr": _check_field("spad", spad, DmaArgs, "spad_addr"),
        "spad_stride": _check_field("spad_stride", cols if spad_stride is None else spad_stride,
                                    DmaArgs, "spad_stride"),
        "rows": _check_field("rows", rows, DmaArgs, "rows"),
        "cols": cols,
        "token": _check_field("token", token, DmaArgs, "token"),
    }})


def dma_load(*, gmem, spad, rows=1, cols=1, gmem_stride=None, spad_stride=None,
             base=GmemBase.ABS, token=0):
    """Copy ``rows`` x ``cols`` words from GMEM to the slot's scratchpad partition.

    Strides default to ``cols`` (dense rows). Addresses count words. ``token`` tags
    the copy for :func:`wait`.
    """
    return _dma(MicroOp.DMA_LOAD, gmem, spad, rows, cols, gmem_stride, spad_stride, base,
                token)


def dma_store(*, gmem, spad, rows=1, cols=1, gmem_stride=None, spad_stride=None,
              base=GmemBase.ABS, token=0):
    """Copy ``rows`` x ``cols`` words from the slot's scratchpad partition to GMEM."""
    return _dma(MicroOp.DMA_STORE, gmem, spad, rows, cols, gmem_stride, spad_stride, base,
                token)


def matmul(*, a, b, k, a_stride=1, b_stride=1, accumulate=False):
    """ACC (+)= the sum over t < ``k`` of outer(word ``a + t*a_stride``,
    word ``b + t*b_stride``); without ``accumulate`` the first step overwrites ACC."""
    return _micro(MicroOp.MATMUL, {"matmul": {
        "a_addr": _check_field("a", a, MatmulArgs, "a_addr"),
        "a_stride": _check_field("a_stride", a_stride, MatmulArgs, "a_stride"),
        "b_addr": _check_field("b", b, MatmulArgs, "b_addr"),
        "b_stride": _check_field("b_stride", b_stride, MatmulArgs, "b_stride"),
        "k": _check_field("k", k, MatmulArgs, "k"),
        "accumulate": _check_bool("accumulate", accumulate),
    }})


def acc_bias(addr):
    """ACC[i][j] = bias[i], the int32 biases stored from word ``addr`` on."""
    return _micro(MicroOp.ACC_BIAS, {"acc_bias": {
        "addr": _check_field("addr", addr, AccBiasArgs, "addr")}})


def requant(*, out, out_stride=1, per_channel=False, params=0):
    """Requantise ACC row i into word ``out + i*out_stride`` (per-channel multipliers
    and shifts from the table at word ``params``)."""
    return _micro(MicroOp.REQUANT, {"requant": {
        "out_addr": _check_field("out", out, RequantArgs, "out_addr"),
        "out_stride": _check_field("out_stride", out_stride, RequantArgs, "out_stride"),
        "per_channel": _check_bool("per_channel", per_channel),
        "param_addr": _check_field("params", params, RequantArgs, "param_addr"),
    }})


def vadd(*, a, b, out, n):
    """Requantised add of ``n`` words from ``a`` and ``b`` into words from ``out``."""
    return _micro(MicroOp.VADD, {"vadd": {
        "a_addr": _check_field("a", a, VaddArgs, "a_addr"),
        "b_addr": _check_field("b", b, VaddArgs, "b_addr"),
        "out_addr": _check_field("out", out, VaddArgs, "out_addr"),
        "n": _check_field("n", n, VaddArgs, "n"),
    }})


def vpool(*, src, out, n, window, stride, step, average=False, pairs=False):
    """``n`` output words; word o pools the ``window`` words
    ``src + o*step + t*stride`` (max, or average with ``average``; lane pairs too with
    ``pairs``). ``window`` is at least 1."""
    return _micro(MicroOp.VPOOL, {"vpool": {
        "in_addr": _check_field("src", src, VpoolArgs, "in_addr"),
        "in_stride": _check_field("stride", stride, VpoolArgs, "in_stride"),
        "in_step": _check_field("step", step, VpoolArgs, "in_step"),
        "out_addr": _check_field("out", out, VpoolArgs, "out_addr"),
        "n": _check_field("n", n, VpoolArgs, "n"),
        "window": _check_field("window", window, VpoolArgs, "window", lo=1),
        "average": _check_bool("average", average),
        "pairs": _check_bool("pairs", pairs),
    }})


def vclamp(*, src, out, n, lo, hi):
    """Clamp the int8 lanes of ``n`` words from ``src`` to [``lo``, ``hi``] into
    words from ``out``."""
    return _micro(MicroOp.VCLAMP, {"vclamp": {
        "in_addr": _check_field("src", src, VclampArgs, "in_addr"),
        "out_addr": _check_field("out", out, VclampArgs, "out_addr"),
        "n": _check_field("n", n, VclampArgs, "n"),
        "lo": _check_int8("lo", lo),
        "hi": _check_int8("hi", hi),
    }})


def vcmp(*, addr, lane, op, imm, flag, reduce=False):
    """F[``flag``] = (lane ``lane`` from word ``addr`` ``op`` ``imm``); with
    ``reduce`` the largest of lanes 0..``lane``. ``op`` is a :class:`CmpOp` or its
    name."""
    return _micro(MicroOp.VCMP, {"vcmp": {
        "addr": _check_field("addr", addr, VcmpArgs, "addr"),
        "lane": _check_field("lane", lane, VcmpArgs, "lane"),
        "reduce": _check_bool("reduce", reduce),
        "op": _check_enum("op", op, CmpOp),
        "imm": _check_int8("imm", imm),
        "flag": _check_range("flag", flag, 0, FLAGS - 1),
    }})


def vargmax(*, addr, n, index, lane=None, flag=None, expect=None):
    """X[``index``] = the lane number of the largest of ``n`` (at least 1) int8 lanes
    from word ``addr``.

    With ``lane`` (column mode): X[``index``] = the number w (0..n-1) of the word
    ``addr + w`` whose lane ``lane`` is the largest of the ``n`` words; ``lane`` must
    be below the tile's ``word_bytes`` (else the instruction is illegal when it runs).
    With ``flag``: F[``flag``] = (the result == ``expect``) too; ``expect`` is required
    with ``flag`` and taken only with it.
    """
    if flag is None and expect is not None:
        raise ValueError(f"expect must be None without flag, not {expect!r}")
    column, test = lane is not None, flag is not None
    return _micro(MicroOp.VARGMAX, {"vargmax": {
        "addr": _check_field("addr", addr, VargmaxArgs, "addr"),
        "n": _check_field("n", n, VargmaxArgs, "n", lo=1),
        "index": _check_range("index", index, 0, INDEX_REGS - 1),
        "column": int(column),
        "lane": _check_field("lane", lane, VargmaxArgs, "lane") if column else 0,
        "test": int(test),
        "flag": _check_range("flag", flag, 0, FLAGS - 1) if test else 0,
        "expect": _check_field("expect", expect, VargmaxArgs, "expect") if test else 0,
    }})


def vcfg(reg, value):
    """Set the vector configuration register ``reg`` (a :class:`VectorCfg` or its name)
    to ``value`` (see :data:`VCFG_RANGES`; int8 registers take -128..127)."""
    reg = _check_enum("reg", reg, VectorCfg)
    lo, hi = VCFG_RANGES[reg]
    value = _check_range("value", value, lo, hi)
    return _micro(MicroOp.VCFG, {"vcfg": {
        "reg": reg, "value": value & 0xFF if lo < 0 else value}})
