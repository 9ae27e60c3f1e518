"""What a compute micro-instruction touches in the scratchpad, known before it runs.

Every operand of a compute micro-instruction is an affine stream of partition offsets
starting at its base address with non-negative strides, so the whole operand lies
between its base and its *end* (the largest offset it touches), and it fits in a
partition exactly when its end does. The control unit checks these ends against the
calling slot's partition before it hands the instruction to the compute unit
(:class:`fusetile.hdl.operands.OperandCheck` is the gateware of this module), which is
what makes compute faults precise: an instruction that would leave its partition, or
has an illegal operand, faults before it does anything. The golden model checks with
the functions below.

Operands are listed in the order they are checked, inputs first, then the output; the
fault address of a PARTITION fault is the end of the first one that does not fit.
"""

from .config import TileConfig
from .isa import MicroOp, VectorCfg


__all__ = ["MAX_OPERANDS", "STRIDED_OPS", "WORD_OPS", "operand_ends", "illegal_operands",
           "check_latency"]


#: The most scratchpad operands a compute micro-instruction has (VADD: a, b, out).
MAX_OPERANDS = 3

#: The operations whose operand ends take ``count x stride`` products (MATMUL's inputs,
#: REQUANT's output, VPOOL's input): the others' ends are a base and a small extra.
STRIDED_OPS = frozenset({MicroOp.MATMUL, MicroOp.REQUANT, MicroOp.VPOOL})

#: The vector unit's operations on streams of words, which a tile may leave out
#: (:attr:`~fusetile.kernels.config.TileConfig.word_ops`).
WORD_OPS = frozenset({MicroOp.VADD, MicroOp.VPOOL, MicroOp.VCLAMP})


def _words(lanes, word_bytes):
    return -(-lanes // word_bytes)


def illegal_operands(op, f, config=None):
    """Whether the operands ``f`` (``{field: int}`` of ``op``'s argument struct) are
    illegal for compute micro-instruction ``op``: VPOOL with ``window`` 0; VARGMAX with
    ``n`` 0, with ``column`` and a ``lane`` of ``config.word_bytes`` or more, without
    ``column`` and a ``lane`` other than 0, or without ``test`` and a ``flag`` or
    ``expect`` other than 0; VCFG of a register that does not exist. On a tile without
    :attr:`~fusetile.kernels.config.TileConfig.decisions` every VCMP and VARGMAX,
    without :attr:`~fusetile.kernels.config.TileConfig.word_ops` every VADD, VPOOL and
    VCLAMP, and without :attr:`~fusetile.kernels.config.TileConfig.pool_average` a
    VPOOL with ``average``.

    ``config`` (a :class:`~fusetile.kernels.config.TileConfig`; ``None``: the default
    configuration) gives the word size VARGMAX's ``lane`` is checked against, and what
    the tile has built."""
    config = TileConfig() if config is None else config
    if op in (MicroOp.VCMP, MicroOp.VARGMAX) and not config.decisions:
        return True
    if op in WORD_OPS and not config.word_ops:
        return True
    if op == MicroOp.VPOOL:
        return f["window"] == 0 or (f["average"] != 0 and not config.pool_average)
    if op == MicroOp.VARGMAX:
        word_bytes = config.word_bytes
        lane_bad = f["lane"] >= word_bytes if f["column"] else f["lane"] != 0
        untested = not f["test"] and (f["flag"] != 0 or f["expect"] != 0)
        return f["n"] == 0 or lane_bad or untested
    if op == MicroOp.VCFG:
        return f["reg"] not in {r.value for r in VectorCfg}
    return False


def operand_ends(op, f, config):
    """The end offset of each scratchpad operand of compute micro-instruction ``op``
    (operands ``f``, legal), in checking order; empty for a no-op (MATMUL with ``k`` 0,
    VADD / VPOOL / VCLAMP with ``n`` 0) and for VCFG.

    ======== ===========================================================================
    MATMUL   a: ``a_addr + (k-1) a_stride``; b: ``b_addr + (k-1) b_stride``
    ACC_BIAS bias: ``addr + ceil(4R / W) - 1``
    REQUANT  table (per-channel): ``param_addr + ceil(8R / W) - 1``;
             out: ``out_addr + (R-1) out_stride``
    VADD     a, b, out: base ``+ n - 1``
    VPOOL    in: ``in_addr + (n-1) in_step + (window-1) in_stride``; out: ``out_addr + n - 1``
    VCLAMP   in, out: base ``+ n - 1``
    VCMP     in: ``addr + lane // W``
    VARGMAX  in: ``addr + ceil(n / W) - 1``; with ``column``: ``addr + n - 1``
    ======== ===========================================================================

    (R = ``config.rows``, W = ``config.word_bytes``.)
    """
    R, W = config.rows, config.word_bytes
    if op == MicroOp.MATMUL:
        k = f["k"]
        if k == 0:
            return []
        return [f["a_addr"] + (k - 1) * f["a_stride"], f["b_addr"] + (k - 1) * f["b_stride"]]
    if op == MicroOp.ACC_BIAS:
        return [f["addr"] + _words(4 * R, W) - 1]
    if op == MicroOp.REQUANT:
        out = f["out_addr"] + (R - 1) * f["out_stride"]
        if f["per_channel"]:
            return [f["param_addr"] + _words(8 * R, W) - 1, out]
        return [out]
    if op == MicroOp.VADD:
        n = f["n"]
        return [f[name] + n - 1 for name in ("a_addr", "b_addr", "out_addr")] if n else []
    if op == MicroOp.VPOOL:
        n = f["n"]
        if n == 0:
            return []
        return [f["in_addr"] + (n - 1) * f["in_step"] + (f["window"] - 1) * f["in_stride"],
                f["out_addr"] + n - 1]
    if op == MicroOp.VCLAMP:
        n = f["n"]
        return [f["in_addr"] + n - 1, f["out_addr"] + n - 1] if n else []
    if op == MicroOp.VCMP:
        return [f["addr"] + f["lane"] // W]
    if op == MicroOp.VARGMAX:
        n = f["n"]
        return [f["addr"] + (n if f["column"] else _words(n, W)) - 1]
    if op == MicroOp.VCFG:
        return []
    raise ValueError(f"op must be a compute micro-op, not {op!r}")


def check_latency(op, config):
    """Cycles from the operand check's start to its answer for compute micro-instruction
    ``op`` on ``config``'s tile: :meth:`TileConfig.check_latency` of whether its ends
    take ``count x stride`` products, VPOOL's a cycle more (its input's two products
    are added). An operation the tile does not build (``word_ops``) has no ends: it
    takes neither."""
    built = config.word_ops or op not in WORD_OPS
    return config.check_latency(built and op in STRIDED_OPS) + (built and op == MicroOp.VPOOL)
