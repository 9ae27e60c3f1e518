"""Builders for plan instructions and micro-instructions.

Each function returns the instruction's bits as an ``int``, packed through the layouts
in :mod:`fusetile.kernels.isa` (the same ones the gateware decodes with), ready for
``Device.load_plan`` / ``Device.load_kernel``.

    plan = [call(0, a=0x100), done()]
    kernel = [dma_load(gmem=0, spad=0, rows=4, cols=2, base=GmemBase.ARG0), ret()]
"""

from .isa import PlanOp, PlanInstr, MicroOp, MicroInstr, GmemBase


__all__ = [
    "nop", "call", "done", "mark",
    "micro_nop", "ret", "wait", "dma_load", "dma_store",
]


def _check(name, value, bits):
    if not isinstance(value, int) or not 0 <= value < (1 << bits):
        raise ValueError(f"{name} must be an integer from 0 to {(1 << bits) - 1}, not {value!r}")
    return value


# -- plan instructions -----------------------------------------------------------------

def _plan(op, *, sel=0, a=0, b=0):
    return PlanInstr.const({
        "op": op, "sel": _check("sel", sel, 8), "a": _check("a", a, 24),
        "b": _check("b", b, 24),
    }).as_bits()


def nop():
    """Plan NOP."""
    return _plan(PlanOp.NOP)


def call(slot, a=0, b=0):
    """Run kernel slot ``slot`` with arguments ``a`` and ``b`` (24-bit GMEM word bases)."""
    return _plan(PlanOp.CALL, sel=slot, a=a, b=b)


def done():
    """End of the plan."""
    return _plan(PlanOp.DONE)


def mark(value):
    """Write ``value`` to the MARK register."""
    return _plan(PlanOp.MARK, a=value)


# -- micro-instructions ----------------------------------------------------------------

def _micro(op, args=None):
    return MicroInstr.const({"op": op, "args": args or {"raw": 0}}).as_bits()


def micro_nop():
    return _micro(MicroOp.NOP)


def ret():
    """Wait for the DMA engine, then return to the plan."""
    return _micro(MicroOp.RET)


def wait():
    """Wait until the DMA engine is idle."""
    return _micro(MicroOp.WAIT)


def _dma(op, gmem, spad, rows, cols, gmem_stride, spad_stride, base):
    if not isinstance(base, GmemBase):
        raise TypeError(f"base must be a GmemBase, not {base!r}")
    return _micro(op, {"dma": {
        "gmem_base": base,
        "gmem_addr": _check("gmem", gmem, 24),
        "gmem_stride": _check("gmem_stride", cols if gmem_stride is None else gmem_stride, 16),
        "spad_addr": _check("spad", spad, 16),
        "spad_stride": _check("spad_stride", cols if spad_stride is None else spad_stride, 16),
        "rows": _check("rows", rows, 12),
        "cols": _check("cols", cols, 12),
    }})


def dma_load(*, gmem, spad, rows=1, cols=1, gmem_stride=None, spad_stride=None,
             base=GmemBase.ABS):
    """Copy ``rows`` x ``cols`` words from GMEM to the slot's scratchpad partition.

    Strides default to ``cols`` (dense rows). Addresses count words.
    """
    return _dma(MicroOp.DMA_LOAD, gmem, spad, rows, cols, gmem_stride, spad_stride, base)


def dma_store(*, gmem, spad, rows=1, cols=1, gmem_stride=None, spad_stride=None,
              base=GmemBase.ABS):
    """Copy ``rows`` x ``cols`` words from the slot's scratchpad partition to GMEM."""
    return _dma(MicroOp.DMA_STORE, gmem, spad, rows, cols, gmem_stride, spad_stride, base)
