"""The vector unit's datapaths: requantisation and the int8 lane-wise operations.

:class:`VectorAlu`, bit-exact against :mod:`fusetile.kernels.arith`, is two
free-running pipelines that share their lane multipliers and their rounding and clamp:

* rows on ``rq``: one row of int32 accumulators into int8 lanes per cycle (REQUANT);
* words on ``i``: VADD, VPOOL, VCLAMP, VCMP and VARGMAX over a stream of scratchpad
  words.

Neither applies backpressure nor accepts it: ``ready`` is always 1 and the outputs'
``ready`` is ignored (the consumer takes each result in the cycle it is presented). A
word presented with ``valid`` in cycle ``t`` has its result presented with ``valid``
in cycle ``t + LATENCY`` (a row: ``t + REQUANT_LATENCY``), exactly, whatever came
before or after, as long as the rows and the words that need the multipliers do not
meet there (``requant``, below). (The streams are plain
:class:`amaranth.lib.stream.Signature` s rather than ``always_ready`` ones because a
constant ``ready`` cannot be a port of a converted top-level.) A sequencer that reads
the scratchpad (1-cycle read latency) therefore issues one read per cycle, presents
each word the cycle after its read, and writes each result back the cycle it appears.

Why the arithmetic is laid out as it is:

* multipliers are split into 16-bit pieces whose products each fit one FPGA DSP block
  (18x18 or 25x18 signed; unsigned 16-bit pieces are 17-bit signed operands), with a
  register on every product (the DSP's own), another beside the adders, and one on
  their sum;
* ``round_half_even(p / 2**(31 + s))`` is computed from the arithmetic right shift
  ``t = p >> (30 + s)`` (whose bit 0 is the rounding bit) and a sticky bit (any of the
  bits below it set): round up iff ``t[0] & (sticky | t[1])``; no wide adder of
  rounding constants, and the variable shifter is only 34 bits wide after a constant
  shift of 30;
* the clamp is ``min(max(y, lo), hi)``, like :func:`numpy.clip` (so ``lo > hi`` gives
  ``hi``), and a lane is *saturated* when the clamp changed it.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..kernels import config as tile_config
from ..kernels.config import TileConfig
from ..kernels.isa import CmpOp
from .compare import below
from .copies import copy
from .multiplier import Multiplier


__all__ = [
    "requant_input_layout", "requant_output_layout",
    "VectorOp", "VectorRegs", "vector_input_layout", "vector_output_layout", "VectorAlu",
]


# --- shared pipeline pieces -------------------------------------------------------

_PIECE = 16     # operand piece width: an unsigned piece is a 17-bit signed DSP operand


def _register(m, value, name, *, reset_less=True):
    """``value`` one cycle later. Datapath registers have no reset (it would take a
    control input of every flip-flop and a net to thousands of them); valid bits and
    state pass ``reset_less=False``."""
    reg = Signal(value.shape(), name=name, reset_less=reset_less)
    m.d.sync += reg.eq(value)
    return reg


def _wire(m, value, name):
    """``value`` as a named combinational signal, so expressions used more than once
    are built once."""
    wire = Signal(value.shape(), name=name)
    m.d.comb += wire.eq(value)
    return wire


def _delay(m, value, cycles, name):
    """``value`` ``cycles`` cycles later (a chain of registers)."""
    for k in range(cycles):
        value = _register(m, value, f"{name}_d{k + 1}")
    return value


def _pieces(value):
    """Split ``value`` into (piece, bit offset) pairs of at most 16 bits; only the top
    piece of a signed value is signed."""
    shape = value.shape()
    pieces = []
    for lo in range(0, shape.width, _PIECE):
        hi = min(lo + _PIECE, shape.width)
        piece = value[lo:hi]
        if shape.signed and hi == shape.width:
            piece = piece.as_signed()
        pieces.append((piece, lo))
    return pieces


#: Cycles :func:`_product_sum` takes.
_PRODUCT_STAGES = 4


def _product_sum(m, sel, terms_1, terms_0, name, *, short=False, low_or=False):
    """``sum(a * b for a, b in terms_1)`` if ``sel`` else the same over ``terms_0``,
    from one set of multipliers, ``_PRODUCT_STAGES`` (4) cycles after the terms' values
    are given; built ``short`` (for :attr:`TileConfig.compact`), 3 cycles: the
    operand registers, the products, the sum.

    The terms are the stage's operand registers (their inputs, a cycle sooner, put
    VPOOL's merge in front of every multiplier: the ULX3S build's worst paths, step
    32). Cycle 1 registers the operand pieces of every partial product of
    16-bit pieces, chosen by ``sel``, so that each DSP multiplier is fed by flip-flops
    of its own (the choice in front of the DSP, from one ``sel`` flip-flop for every
    lane, was the ULX3S build's worst path); cycle 2 registers the partial products
    (a :class:`Multiplier` of latency 1 each: on an ECP5 the DSP block's output
    register; with its input registers too, the operands' own inputs came later,
    docs/fpga-timing.md step 31); cycle 3 registers them again, in the fabric beside
    the adders (from the DSP's output register to the first adder's LUTs was 5 to
    6 ns of wire alone, in front of the adders' carry chains: the worst paths of
    6fd2928's ULX3S build, 11.68 ns, docs/fpga-timing.md step 47); cycle 4 their
    shifted sum. The
    k-th partial product of ``terms_1`` and that of ``terms_0`` share a multiplier, so
    both sets cost as many multipliers as the larger. ``sel`` is sampled with the
    terms. Built short, a signed piece of ``terms_0`` that shares a multiplier with an
    unsigned piece of 16 bits goes in biased, and its bias comes off the sum from the
    term's ``b`` as it is then: those ``b`` operands must hold still until the sum.

    With ``low_or`` (built short, for a reader of the sum's low bits through their OR
    alone), where a single product, at offset 0, makes the sum's low 16 bits, those
    bits are its OR in bit 0 and zeros above it.
    """
    def partials(terms):
        return [(pa, pb, oa + ob) for a, b in terms
                for pa, oa in _pieces(a) for pb, ob in _pieces(b)]

    def width(terms):
        return max(len(a) + len(b) + 1 for a, b in terms) + len(terms)

    part_1, part_0 = partials(terms_1), partials(terms_0)
    zero = (Const(0), Const(0), None)
    part_1 += [zero] * (len(part_0) - len(part_1))
    part_0 += [zero] * (len(part_1) - len(part_0))
    # Partial products of equal offsets share a multiplier where they can: its product
    # then goes into the sum with no choice of shift in front of the adders.
    shared = []
    for a1, b1, o1 in part_1:
        k = next((k for k, (_, _, o0) in enumerate(part_0) if o0 in (o1, None)), 0)
        shared.append(((a1, b1, o1), part_0.pop(k)))
    sel_3 = _delay(m, sel, 2 if short else 3, f"{name}_sel")
    shifted = []
    offsets = []        # (k, product, its offsets) of each multiplier
    biases = []         # built short: (b, shift) of each product of a biased piece
    for k, ((a1, b1, o1), (a0, b0, o0)) in enumerate(shared):
        if short and _needs_bias(a1, a0):
            # An iCE40's SB_MAC16 takes 16-bit operands, each signed or unsigned; Yosys
            # builds a product whose operand needs 17 bits (an unsigned piece of 16
            # chosen with a signed one) as the block, a row of partial products in the
            # fabric and their adders: 80 LUT4 and 31 carry cells a multiplier on the
            # UP5K. The signed piece `a0` is given biased instead, `a0 + 2**15` (its
            # top bit flipped: unsigned), and its product's `b0 << 15` taken off the
            # sum. (Only the second set's: its `b` operands are the VCFG registers,
            # which hold still until the sum.)
            wide = Cat(a0, a0[-1].replicate(_PIECE - len(a0)))
            a0 = Cat(wide[:_PIECE - 1], ~wide[_PIECE - 1])
            biases.append((b0, o0 + _PIECE - 1))
        # Each multiplier's operand registers are its own (`hdl/copies.py`): those of
        # two multipliers that take the same piece were merged, and the one register
        # placed between the two DSP blocks was 10.26 ns of 88176a6's routed paths
        # into one of them, the worst (docs/fpga-timing.md, step 53). Built short, the
        # operand and product registers are the DSP block's own (an iCE40's SB_MAC16
        # takes them in; a copy's `keep` would leave them in the fabric).
        x = _register(m, Mux(sel, a1, a0), f"{name}_x{k}")
        y = _register(m, Mux(sel, b1, b0), f"{name}_y{k}")
        if not short:
            x, y = copy(x), copy(y)
        m.submodules[f"{name}_mul{k}"] = mul = Multiplier(x.shape(), y.shape(), latency=1)
        m.d.comb += [mul.a.eq(x), mul.b.eq(y)]
        p = mul.p if short else _register(m, mul.p, f"{name}_p{k}")
        o1 = o0 if o1 is None else o1
        o0 = o1 if o0 is None else o0
        shifted.append(p << o1 if o1 == o0 else Mux(sel_3, p << o1, p << o0))
        offsets.append((k, p, o1, o0))
    total_bits = max(width(terms) for terms in (terms_1, terms_0) if terms)
    low = [k for k, (_, _, o1, o0) in enumerate(offsets) if min(o1, o0) < _PIECE]
    if short and low_or and not biases and len(low) == 1 and offsets[low[0]][2:] == (0, 0):
        # Built for area, the sum's low 16 bits are the one product's there, which
        # only their OR reaches (the rounding's sticky bit): that OR is registered,
        # not the bits (16 flip-flops loaded from the SB_MAC16, each a logic cell of
        # the UP5K alone).
        k = low[0]
        p = offsets[k][1]
        p_high = p[_PIECE:].as_signed() if p.shape().signed else p[_PIECE:]
        highs = [p_high if j == k else value >> _PIECE for j, value in enumerate(shifted)]
        any_low = Signal(name=f"{name}_sum_low", reset_less=True)
        high = Signal(signed(total_bits - _PIECE), name=f"{name}_sum", reset_less=True)
        m.d.sync += [any_low.eq(p[:_PIECE].any()), high.eq(_tree_sum(highs))]
        return Cat(any_low, Const(0, _PIECE - 1), high).as_signed()
    total = Signal(signed(total_bits), name=f"{name}_sum", reset_less=True)
    if biases:
        m.d.sync += total.eq(_tree_sum(shifted) - Mux(sel_3, 0, _bias_sum(biases)))
    else:
        m.d.sync += total.eq(_tree_sum(shifted))
    return total


def _tree_sum(values):
    """The sum of ``values`` as a balanced tree of adders: Python's sum() chains them,
    one carry chain after another (the vector unit's most common late endpoints on the
    ULX3S at 3247880, docs/fpga-timing.md step 35)."""
    while len(values) > 1:
        values = [values[k] + values[k + 1] if k + 1 < len(values) else values[k]
                  for k in range(0, len(values), 2)]
    return values[0]


def _needs_bias(a1, a0):
    """Whether a choice between pieces ``a1`` and ``a0`` needs 17 bits as one operand
    (an unsigned piece of 16 bits and a signed one), which built short biases ``a0``
    (:func:`_product_sum`). The other way round (``a1`` signed) is not built."""
    s1, s0 = a1.shape(), a0.shape()
    if s1.signed == s0.signed:
        return False
    if s1.signed:
        if s0.width >= _PIECE:
            raise NotImplementedError("only the second set of terms' pieces are biased")
        return False
    return s1.width >= _PIECE


def _bias_sum(biases):
    """``sum(b << shift for b, shift in biases)``: the bits side by side where they are
    unsigned and do not overlap (as the pieces of one unsigned operand), with no
    adder."""
    biases = sorted(biases, key=lambda bias: bias[1])
    if not any(b.shape().signed for b, _ in biases) and \
            all(b_shift + len(b) <= shift
                for (b, b_shift), (_, shift) in zip(biases, biases[1:])):
        value = Const(0, 0)
        for b, shift in biases:
            value = Cat(value, Const(0, shift - len(value)), b)
        return value
    return sum(b << shift for b, shift in biases)


def _round_clamp(m, prods, shift, zp, lo, hi, name):
    """``clamp(zp + round_half_even(p / 2**(31 + shift)), lo, hi)`` for each ``p`` in
    ``prods``, three cycles later.

    ``prods`` are signed values, ``zp``, ``lo``, ``hi`` (int8) the values of the same
    cycle, and ``shift`` (0..31) the value of the cycle before: it is registered here
    with the sticky bit's mask, which worked out from it in the products' cycle (a
    subtraction in front of the sticky bit's AND and OR of 32 bits) was the ULX3S
    build's routed worst path at a8fc9f8 (13.65 ns). Returns ``(values,
    saturated)``: lists of signed(8) and 1-bit registers.
    """
    shift_early, shift = shift, _register(m, shift, f"{name}_shift")
    mask = _register(m, ((Const(1, 1) << shift_early) - 1)[:32], f"{name}_mask")
    zp_1 = _register(m, zp, f"{name}_zp")
    # y - lo = (t >> 1) + (zp - lo) + round and y - (hi + 1) likewise, summed beside y:
    # their signs are the clamp's decisions, registered (below, the comparisons of the
    # registered y, 9-bit carry chains in front of the choice of the value, were the
    # ULX3S build's worst paths at e964b34, 10.42 ns: docs/fpga-timing.md, step 44).
    zp_lo_1 = _register(m, zp - lo, f"{name}_zp_lo")
    zp_hi_1 = _register(m, zp - hi - 1, f"{name}_zp_hi")
    lo_1, hi_1 = _register(m, lo, f"{name}_lo_d1"), _register(m, hi, f"{name}_hi_d1")
    inverted_1 = lo_1 > hi_1
    # mask: the bits of p >> 30 below t[0]
    values, saturated = [], []
    for lane, prod in enumerate(prods):
        # The clamp's bounds, a copy per lane: one register read by every lane's
        # comparisons spent 3 ns in wire on 198c8e5's ULX3S build (docs/fpga-timing.md,
        # step 38).
        lo_2 = copy(_register(m, lo_1, f"{name}{lane}_lo_d2"))
        hi_2 = copy(_register(m, hi_1, f"{name}{lane}_hi_d2"))
        inverted = copy(_register(m, inverted_1, f"{name}{lane}_inverted"))  # lo_2 > hi_2
        # |p| < 2**63, so p >> 30 fits 34 bits; widening first makes the sticky mask
        # see sign bits when p is narrower than 30 + shift.
        wide = Signal(signed(64), name=f"{name}{lane}_wide")
        m.d.comb += wide.eq(prod)
        t = Signal(signed(34), name=f"{name}{lane}_t", reset_less=True)  # p >> (30 + shift)
        sticky = Signal(name=f"{name}{lane}_sticky", reset_less=True)    # bits below t[0]
        m.d.sync += [
            t.eq((wide >> 30) >> shift),
            sticky.eq(wide[:30].any() | (wide[30:62] & mask).any()),
        ]
        rounded = _wire(m, t[0] & (sticky | t[1]), f"{name}{lane}_round")
        y = Signal(signed(36), name=f"{name}{lane}_y", reset_less=True)
        below = Signal(name=f"{name}{lane}_below", reset_less=True)     # y < lo_2
        above = Signal(name=f"{name}{lane}_above", reset_less=True)     # y > hi_2
        m.d.sync += [
            y.eq((t >> 1) + zp_1 + rounded),
            below.eq(_wire(m, (t >> 1) + zp_lo_1 + rounded, f"{name}{lane}_y_lo")[-1]),
            above.eq(~_wire(m, (t >> 1) + zp_hi_1 + rounded, f"{name}{lane}_y_hi")[-1]),
        ]
        # min(max(y, lo), hi): below lo, it is lo, or hi if lo > hi; above hi, it is hi.
        # Whether the clamp changed y asks y != hi (below lo, when lo > hi): 9 bits
        # wide, beside the tests of whether y is past that range at all (a 36-bit
        # comparison's carry chain was the ULX3S build's worst path at d3bfcf1,
        # 11.57 ns).
        big = _wire(m, y[8:].any() & ~y[8:].all(), f"{name}{lane}_big")   # y outside int9
        not_hi = big | (y[:9].as_signed() != hi_2)                          # y != hi
        to_hi = _wire(m, Mux(below, inverted, above), f"{name}{lane}_to_hi")
        value = Signal(signed(8), name=f"{name}{lane}_value", reset_less=True)
        sat = Signal(name=f"{name}{lane}_sat", reset_less=True)     # the clamp changed y
        m.d.sync += [
            value.eq(Mux(to_hi, hi_2, Mux(below, lo_2, y[:8]))),
            sat.eq(Mux(below, ~inverted | not_hi, above)),
        ]
        values.append(value)
        saturated.append(sat)
    return values, saturated


def _next_group(lanes, group):
    """``lanes`` (an array) moved down by ``group`` lanes, zeros in at the top."""
    bits = len(lanes.as_value()) // len(lanes) * group
    return Cat(lanes.as_value()[bits:], Const(0, bits))


def _check_lanes(lanes):
    if not isinstance(lanes, int) or isinstance(lanes, bool):
        raise TypeError(f"lanes must be an integer, not {lanes!r}")
    if lanes < 1:
        raise ValueError(f"lanes must be at least 1, not {lanes!r}")


# --- REQUANT ----------------------------------------------------------------------

def requant_input_layout(lanes):
    """Payload of :attr:`VectorAlu.rq`: one ACC row and its requantisation parameters.

    Fields: ``acc`` (``lanes`` x signed(32)), ``mult`` (unsigned(32); the ISA keeps it
    below 2**31, every 32-bit value is computed exactly anyway), ``shift`` (0..31),
    ``zp``, ``lo``, ``hi`` (signed(8)).
    """
    _check_lanes(lanes)
    return data.StructLayout({
        "acc":   data.ArrayLayout(signed(32), lanes),
        "mult":  unsigned(32),
        "shift": unsigned(5),
        "zp":    signed(8),
        "lo":    signed(8),
        "hi":    signed(8),
    })


def requant_output_layout(lanes):
    """Payload of :attr:`VectorAlu.rq_o`: ``value`` (``lanes`` x signed(8)) and
    ``saturated`` (bit ``j``: lane ``j`` was changed by the clamp)."""
    _check_lanes(lanes)
    return data.StructLayout({
        "value":     data.ArrayLayout(signed(8), lanes),
        "saturated": unsigned(lanes),
    })


# --- VADD, VPOOL, VCLAMP, VCMP, VARGMAX ---------------------------------------------

class VectorOp(enum.Enum, shape=3):
    """What :class:`VectorAlu` does with a word."""
    VADD    = 0   #: result = arith.vadd(a, b, ...)
    VPOOL   = 1   #: reduction: result = arith.vpool(words first..last, average, pairs, ...)
    VCLAMP  = 2   #: result = arith.vclamp(a, lo, hi)
    VCMP    = 3   #: reduction: flag = arith.vcmp(lane (or max of lanes), cmp, imm)
    VARGMAX = 4   #: reduction: index = arith.vargmax(lanes of words first..last), or
                  #: with ``column`` arith.vargmax_column(words first..last, lane);
                  #: flag = arith.vargmax_test(index, expect)


class VectorRegs(data.Struct):
    """The vector configuration registers (VCFG) as :class:`VectorAlu` reads them."""
    mult_a: unsigned(32)
    mult_b: unsigned(32)
    shift:  unsigned(5)
    zp_a:   signed(8)
    zp_b:   signed(8)
    zp_out: signed(8)
    lo:     signed(8)
    hi:     signed(8)


def _lane_bits(lanes):
    return max(1, (lanes - 1).bit_length())


def vector_input_layout(lanes):
    """Payload of :attr:`VectorAlu.i`: one word (two for VADD) and what to do with it.

    Fields
    ------
    op : VectorOp
    a, b : ``lanes`` x signed(8)
        The word (``b``: VADD's second word; ignored otherwise).
    first, last : 1
        Reductions (VPOOL, VCMP, VARGMAX): the first and the last word of the
        reduction (both for a one-word reduction). Ignored by VADD and VCLAMP.
    average, pairs : 1
        VPOOL: average instead of max; combine lane pairs too.
    reduce : 1
        VCMP: the max of lanes instead of one lane.
    column : 1
        VARGMAX: the argmax of lane ``lane`` over the words (a word number) instead of
        the argmax of all their lanes (a lane number).
    lane : range(lanes)
        VCMP: the lane compared (without ``reduce``). VCMP with ``reduce`` and VARGMAX:
        in the ``last`` word, lanes above ``lane`` are ignored. VARGMAX with
        ``column``: the lane of every word.
    cmp : CmpOp
    imm : signed(8)
        VCMP: the comparison and the immediate.
    expect : 16
        VARGMAX: the value its ``flag`` compares the result with.
    lo, hi : signed(8)
        VCLAMP bounds.
    """
    _check_lanes(lanes)
    word = data.ArrayLayout(signed(8), lanes)
    return data.StructLayout({
        "op":      VectorOp,
        "a":       word,
        "b":       word,
        "first":   1,
        "last":    1,
        "average": 1,
        "pairs":   1,
        "reduce":  1,
        "column":  1,
        "lane":    _lane_bits(lanes),
        "cmp":     CmpOp,
        "imm":     signed(8),
        "expect":  16,
        "lo":      signed(8),
        "hi":      signed(8),
    })


def vector_output_layout(lanes):
    """Payload of :attr:`VectorAlu.o`.

    Fields
    ------
    op : VectorOp
        The operation of this result.
    word : ``lanes`` x signed(8)
        VADD, VPOOL, VCLAMP: the result word (0 otherwise).
    saturated : ``lanes`` bits
        VADD, VPOOL average: lanes changed by the clamp.
    sat_count : range(lanes + 1)
        The number of bits set in ``saturated`` (for the saturation counter).
    flag : 1
        VCMP: the flag. VARGMAX: ``index == expect``.
    index : 16
        VARGMAX: the lane number (counted across the reduction's words), or with
        ``column`` the word number (counted from ``first``).
    """
    _check_lanes(lanes)
    return data.StructLayout({
        "op":        VectorOp,
        "word":      data.ArrayLayout(signed(8), lanes),
        "saturated": unsigned(lanes),
        "sat_count": range(lanes + 1),
        "flag":      1,
        "index":     16,
    })


def _max(m, a, b, name):
    return _wire(m, Mux(b > a, b, a), name)


def _take_larger(left, right):
    """The larger of two (value, index) pairs; ``left`` holds the lower indices and
    keeps ties."""
    (va, ia), (vb, ib) = left, right
    take_b = vb > va
    return Mux(take_b, vb, va), Mux(take_b, ib, ia)


def _argmax(m, values, stages, name):
    """(largest value, its index) over ``values``, the lowest index on ties, from a
    tree of comparisons with a register after every level, or every few levels so
    that there are at most ``stages`` registers on the way (one for a single value;
    none with ``stages`` 0: the tree is combinational).
    Returns the two registers and the number of cycles after ``values`` they hold the
    result."""
    index_bits = _lane_bits(len(values))
    levels = (len(values) - 1).bit_length()
    level = [(v, Const(i, index_bits)) for i, v in enumerate(values)]
    if stages == 0:
        while len(level) > 1:
            level = [_take_larger(*level[k:k + 2]) if k + 1 < len(level) else level[k]
                     for k in range(0, len(level), 2)]
        return (*level[0], 0)
    per_stage = max(1, -(-levels // stages))
    done, cycles = 0, 0
    while cycles == 0 or len(level) > 1:
        pairs = [_take_larger(level[k], level[k + 1]) for k in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            pairs.append(level[-1])
        level = pairs
        done += 1
        if len(level) == 1 or done % per_stage == 0:
            cycles += 1
            level = [(_register(m, v, f"{name}_v{cycles}_{k}"),
                      _register(m, i, f"{name}_i{cycles}_{k}"))
                     for k, (v, i) in enumerate(level)]
    value, index = level[0]
    return value, index, cycles


def _argmax_merge(m, take_word, first, column, word_max, word_arg, lanes):
    """VARGMAX's merge of a word into the best so far, in the cycles ``take_word`` is
    high: the word's candidate (its best lane, or with ``column`` its lane ``lane``:
    the word's maximum either way, ``word_max`` at lane ``word_arg``) against the
    best so far; a later word wins only when larger, so the lowest index wins ties.
    The index is the word number (from ``first``) and lane, or with ``column`` the
    word number. Returns the register of the best index."""
    lane_bits = _lane_bits(lanes) if lanes > 1 else 0
    word_no = Signal(16, name="argmax_word")               # words since `first`
    best_value = Signal(signed(8), name="argmax_value")
    best_index = Signal(16, name="argmax_index")
    this_word = _wire(m, Mux(first, 0, word_no), "argmax_this_word")
    packed_index = Cat(word_arg[:lane_bits], this_word)[:16] if lane_bits else this_word
    this_index = _wire(m, Mux(column, this_word, packed_index), "argmax_this_index")
    take = _wire(m, first | (word_max > best_value), "argmax_take")
    with m.If(take_word):
        m.d.sync += [
            word_no.eq(this_word + 1),
            best_value.eq(Mux(take, word_max, best_value)),
            best_index.eq(Mux(take, this_index, best_index)),
        ]
    return best_index


def _flag(m, vargmax, cmp, imm, expect, cmp_max, best_index, domain="sync"):
    """The flag register (a wire in ``domain`` "comb"): VARGMAX's test (``best_index ==
    expect``) when ``vargmax``, else VCMP's comparison ``cmp`` of ``cmp_max`` with
    ``imm``."""
    flag = Signal(name="flag")
    with m.If(vargmax):
        m.d[domain] += flag.eq(best_index == expect)
    with m.Else():
        with m.Switch(cmp):
            with m.Case(CmpOp.GE):
                m.d[domain] += flag.eq(cmp_max >= imm)
            with m.Case(CmpOp.GT):
                m.d[domain] += flag.eq(cmp_max > imm)
            with m.Case(CmpOp.LT):
                m.d[domain] += flag.eq(cmp_max < imm)
            with m.Case(CmpOp.EQ):
                m.d[domain] += flag.eq(cmp_max == imm)
    return flag


def _row_in(m, rq, group, tail):
    """The REQUANT row the lane multipliers take this cycle, ``row_next`` (the one on
    ``rq`` as it comes), and its register ``row``: with more than one pass, a row
    shifts its accumulators down a group per cycle until the next one comes."""
    row = Signal(rq.payload.shape(), name="row", reset_less=True)
    row_next = Signal(rq.payload.shape(), name="row_next")
    m.d.comb += row_next.eq(rq.payload)
    if tail:
        with m.If(~rq.valid):
            m.d.comb += [row_next.eq(row), row_next.acc.eq(_next_group(row.acc, group))]
    m.d.sync += row.eq(row_next)
    return row, row_next


def _whole_words(m, scaled, saturated, lanes, group, tail):
    """The scaled lanes and their saturation bits as whole words: with more than one
    pass, the groups before the last, oldest lowest, registered as they come."""
    if not tail:
        return scaled, saturated
    done = Signal(data.ArrayLayout(signed(8), lanes - group), name="rq_done",
                  reset_less=True)
    done_sat = Signal(lanes - group, name="rq_done_sat", reset_less=True)
    m.d.sync += [
        done.eq(Cat(done.as_value()[8 * group:], *scaled)),
        done_sat.eq(Cat(done_sat[group:], *saturated)),
    ]
    return ([done[j] for j in range(lanes - group)] + scaled,
            [done_sat[j] for j in range(lanes - group)] + saturated)


def _requant_out(m, rq_o, row_valid, latency, scaled, saturated):
    """Connect the rows' results: ``row_valid`` (a row's, a cycle after it comes)
    carried to ``latency``; returns the valid bits of every cycle, the first the
    given one."""
    row_valids = [row_valid]                # row_valids[k]: cycle 1 + k
    for k in range(1, latency):
        row_valids.append(_register(m, row_valids[-1], f"row{k + 1}_valid",
                                    reset_less=False))
    m.d.comb += [
        rq_o.valid.eq(row_valids[-1]),
        rq_o.payload.value.eq(Cat(*scaled)),
        rq_o.payload.saturated.eq(Cat(*saturated)),
    ]
    return row_valids


def _output(m, o, valid, op, pairs, is_scaled, scaled, saturated, word, flag, index):
    """The output register ``o``, from the result stage: ``valid``, ``op``, the scaled
    lanes (when ``is_scaled``) or the unscaled ``word``, VCMP's or VARGMAX's ``flag``
    and VARGMAX's ``index``. Pairs (VPOOL) leave the upper half of the lanes 0."""
    lanes = len(scaled)
    upper = Signal(name="res_upper")        # the upper lanes are 0 (VPOOL pairs)
    m.d.comb += upper.eq((op == VectorOp.VPOOL) & pairs)
    out = o.payload
    out_sat = []
    for j in range(lanes):
        zero = upper if j >= lanes // 2 else Const(0)
        m.d.sync += out.word[j].eq(Mux(zero, 0, Mux(is_scaled, scaled[j], word[j])))
        out_sat.append(~zero & is_scaled & saturated[j])
    m.d.sync += [
        o.valid.eq(valid),
        out.op.eq(op),
        out.saturated.eq(Cat(*out_sat)),
        out.sat_count.eq(sum(out_sat)),
        out.flag.eq(((op == VectorOp.VCMP) | (op == VectorOp.VARGMAX)) & flag),
        out.index.eq(Mux(op == VectorOp.VARGMAX, index, 0)),
    ]


class VectorAlu(wiring.Component):
    """REQUANT over rows of ``word_bytes`` int32 accumulators; VADD, VPOOL, VCLAMP,
    VCMP and VARGMAX over words of ``word_bytes`` int8 lanes.

    Bit-exact against :func:`fusetile.kernels.arith.requantize`, ``vadd``, ``vpool``,
    ``vclamp``, ``vcmp`` and ``vargmax``.

    REQUANT: lane ``j`` of a row's result is ``clamp(zp + round_half_even(acc[j] *
    mult / 2**(31 + shift)), lo, hi)``. A row presented on ``rq`` in cycle ``t`` is on
    ``rq_o`` (``valid`` high, payload registered) in cycle ``t + REQUANT_LATENCY``;
    rows may follow each other in consecutive cycles. Pipeline: the multipliers'
    operand registers (a row goes to them as it comes, from the MAC array's and the
    compute unit's registers); partial products (4 per lane, 16 x 16 bits), in the DSP
    blocks and again beside the adders; their sum; shift and sticky; rounding and zero
    point; clamp.

    The rows and the scaled words (VADD, VPOOL average) share the lane multipliers
    and everything after them; ``requant`` says which of the two they serve (see the
    attribute for the cycles it must hold in). The compute
    unit holds it for a whole command (high for REQUANT), and never has a REQUANT
    row and a vector word in flight together: sharing saves 4 DSP multipliers per
    lane and a rounding and clamp datapath.

    Contract for words (no stalls either way):

    * Each cycle, present at most one word on ``i`` (``valid``, ``payload``); the
      registers ``regs`` are sampled in the same cycle (the values with the last word
      of a reduction apply to its result, ZP_A to each word), so VCFG may change them
      as soon as the last word of an operation has been presented.
    * VADD, VCLAMP: every word gives a result. VPOOL, VCMP, VARGMAX are reductions over
      the words from one marked ``first`` to one marked ``last`` (one word may be
      both); only ``last`` gives a result. Words of one reduction may have gaps
      between them but must not be interleaved with another VPOOL, VCMP or VARGMAX
      reduction; VADD and VCLAMP words may be.
    * A result for a word presented in cycle ``t`` is on ``o`` (``o.valid`` high,
      payload registered) in cycle ``t + LATENCY``, for every operation.

    What to present per operation (operands as in :mod:`fusetile.kernels.isa`):

    * VADD: ``a``, ``b`` = words ``a_addr + w``, ``b_addr + w``.
    * VPOOL: the ``window`` words of output ``o`` in order (``first`` on ``t = 0``,
      ``last`` on ``t = window - 1``), ``average``, ``pairs``. At most 64 words per
      window (the sum of ``x - ZP_A`` is held in 16 bits; the ISA allows 15).
    * VCLAMP: ``a``, ``lo``, ``hi``.
    * VCMP: without ``reduce``, the one word holding the lane (``first`` and ``last``),
      ``lane`` = lane % word_bytes; with ``reduce``, words ``addr .. addr + lane //
      word_bytes``, ``lane`` = lane % word_bytes (used with the last word). ``cmp``,
      ``imm`` with the last word.
    * VARGMAX: words ``addr .. addr + (n - 1) // word_bytes``, ``lane`` =
      ``(n - 1) % word_bytes`` (used with the last word); with ``column``, words
      ``addr .. addr + n - 1`` and the ``lane`` (with every word). ``expect`` with the
      last word.

    With ``config.vector_lanes`` below ``word_bytes`` (:attr:`TileConfig.vector_passes`
    = P > 1), the lane multipliers and everything after them are built for
    ``vector_lanes`` lanes and a row or a scaled word (VADD, the last word of a VPOOL
    average) goes through them a group of lanes per cycle, in P cycles: its operands
    shift down a group each cycle, and its results shift into a word that is complete
    with the last group. Every result then comes P - 1 cycles later (:attr:`latency`,
    :attr:`requant_latency`), and a row or a scaled word must come at least P cycles
    after the previous one (the compute unit paces them); the other words still come
    one per cycle.

    Pipeline (``LATENCY`` = 11 with P = 1): the word's and ``regs``' input registers
    (stage 0); input registers again, with VCLAMP's comparisons and VPOOL's pair sums
    and maxima (stage 1); operand preparation and the reductions (VPOOL's merge,
    VCLAMP's selection: stage 2, where a row comes in); the multipliers' operand
    registers; partial products, in the DSP blocks and again beside the adders; the
    products' sum; shift and sticky; rounding and zero point; clamp; output register.
    VADD is ``(a - ZP_A) * MULT_A + (b - ZP_B) * MULT_B`` and a VPOOL average is
    ``sum * MULT_A + 0 * MULT_B``: both share the lane multipliers. Beside stages
    2..9, VCMP and VARGMAX find the word's maximum and its lane a level of the lane
    tree per stage (three stages for 8 lanes, four for 16; beyond, two or more levels
    per stage), merge it with the best so far the next stage and compare or test the
    result the stage after that.

    Parameters
    ----------
    config : TileConfig
        ``word_bytes`` gives the number of lanes.

    Attributes
    ----------
    i : In(stream.Signature(vector_input_layout(word_bytes)))
        Words in; ``ready`` is always 1.
    o : Out(stream.Signature(vector_output_layout(word_bytes)))
        Results, ``LATENCY`` cycles after the word that completes them; ``ready`` is
        ignored.
    regs : In(VectorRegs)
        The vector configuration registers.
    rq : In(stream.Signature(requant_input_layout(word_bytes)))
        REQUANT rows in; ``ready`` is always 1.
    rq_o : Out(stream.Signature(requant_output_layout(word_bytes)))
        REQUANT results, ``REQUANT_LATENCY`` cycles after their rows; ``ready`` is
        ignored.
    requant : In(1)
        The lane multipliers serve the rows (1) or the words (0): high in the cycle
        before a row is presented on ``rq`` and in that cycle, low two and three cycles
        after a word is presented on ``i`` (registered, as ``rows``, a cycle before
        the multipliers' operand registers load; a word comes to them three cycles
        after it is presented, a row as it is presented).
    busy : Out(1)
        Words or rows are in flight: high from the cycle after one is presented until
        the cycle before its result is out (one cycle for a VPOOL word that does not
        end a reduction, up to five for VCMP and VARGMAX words: the lane tree and the
        merge; so it may be low between the words of a reduction).

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    #: Cycles from the word completing a result on ``i`` to the result on ``o``, with a
    #: lane multiplier per lane (:attr:`latency` in general).
    LATENCY = tile_config.VECTOR_LATENCY
    #: Cycles from a row on ``rq`` to its result on ``rq_o``, with a lane multiplier
    #: per lane (:attr:`requant_latency` in general).
    REQUANT_LATENCY = tile_config.REQUANT_LATENCY
    #: The cycles, from the one a row is presented in (a scaled word, for
    #: ``REQUANT_LOW``), in which ``requant`` must be high (low).
    REQUANT_HIGH = (-1, 0)
    REQUANT_LOW = (2, 3)
    #: The stage of a scaled word's result (its last group's, with more than one
    #: pass): stage 2's operands, the products' stages, then shift and sticky,
    #: rounding and zero point, clamp. The output register comes after it.
    _RESULT_STAGE = 2 + _PRODUCT_STAGES + 3
    #: At most this many registers on the lane tree of VCMP and VARGMAX, so that the
    #: merge (a stage) and the comparison (a stage) are done by the result stage.
    _TREE_STAGES = 4

    def __init__(self, config):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        self._config = config
        lanes = config.word_bytes
        super().__init__({
            "i":    In(stream.Signature(vector_input_layout(lanes))),
            "o":    Out(stream.Signature(vector_output_layout(lanes))),
            "regs": In(VectorRegs),
            "rq":   In(stream.Signature(requant_input_layout(lanes))),
            "rq_o": Out(stream.Signature(requant_output_layout(lanes))),
            "requant": In(1),
            "busy": Out(1),
        })

    @property
    def config(self):
        return self._config

    @property
    def latency(self):
        """Cycles from the word completing a result on ``i`` to the result on ``o``."""
        return self._config.vector_latency

    @property
    def unscaled_latency(self):
        """Cycles from the word completing an unscaled result (VCLAMP, a maximum VPOOL,
        VCMP, VARGMAX) to the result: :attr:`latency` here, fewer in the compact
        build."""
        return self._config.unscaled_latency

    @property
    def requant_latency(self):
        """Cycles from a row on ``rq`` to its result on ``rq_o``."""
        return self._config.requant_latency

    def _sizes(self):
        """The lanes of a word, half of them, the lanes through the multipliers per
        cycle and the cycles a result waits for its last group of them."""
        cfg = self._config
        return cfg.word_bytes, cfg.word_bytes // 2, cfg.scaler_lanes, cfg.vector_passes - 1

    def elaborate(self, platform):
        lanes, half, group, tail = self._sizes()
        m = Module()

        m.d.comb += [self.i.ready.eq(1), self.rq.ready.eq(1)]

        # Stage 0: a word is registered as it comes, with the registers it is
        # sampled with, so that the unit's first stage is placed apart from the
        # compute unit's data stage: a word went from there across the device into
        # stage 1's sums and comparisons (5.3 ns of wire in front of 10.4 to 10.5 ns
        # paths, e0f2cb7's ULX3S build; 10.8 to 11.1 ns at 7a057ba's: docs/fpga-timing.md
        # step 41). Like stage 1's, the word loads with its valid bit. A row comes
        # from the MAC array's and the compute unit's registers and goes straight into
        # the multipliers' operand registers, beside stage 2: a REQUANT after every
        # tile of a matmul keeps its cycles.
        i_valid = _register(m, self.i.valid, "s0_valid", reset_less=False)
        i_pay = Signal(self.i.payload.shape(), name="s0", reset_less=True)
        with m.If(self.i.valid):
            m.d.sync += i_pay.eq(self.i.payload)
        regs = _register(m, self.regs, "regs0")

        # Stage 1: input registers. A word has its operands prepared in stage 2 before
        # it goes to the lane multipliers (a REQUANT row goes to them as it comes, and
        # its scaling waits in `row`). The word is loaded only with its valid bit:
        # loaded every cycle, its register would equal the MAC array's operand
        # register (both take the scratchpad's operand words), Yosys would merge the
        # two, and one flip-flop would feed both units from wherever the placer puts
        # it (the ULX3S build's worst path did that).
        s1 = Signal(i_pay.shape(), name="s1", reset_less=True)
        with m.If(i_valid):
            m.d.sync += s1.eq(i_pay)
        # What stage 2 decides from a lane alone is worked out here and registered with
        # the word: VCLAMP's three comparisons, and VPOOL's pair (u, v) as a sum less
        # the zero points and as a maximum, so that stage 2 is a selection (VCLAMP) or
        # one adder and one comparison against the accumulator (VPOOL). (In stage 2
        # they were the ULX3S build's worst paths, steps 26 and 31.)
        pay = i_pay
        lanes_in = [pay.a[j] for j in range(lanes)]
        zp_in = regs.zp_a
        # (Each comparison the sign of a 9-bit subtraction, `below`: the carry chain's
        # last bit is the answer, where `>` left three LUTs after it; 10.71 ns, the
        # worst path of c475267's ULX3S build, docs/fpga-timing.md step 38.)
        pre = {
            "above":    Cat(below(pay.hi, lanes_in[j]) for j in range(lanes)),
            "below":    Cat(below(lanes_in[j], pay.lo) for j in range(lanes)),
            "inverted": below(pay.hi, pay.lo),
        }
        uvz_next, uvmax_next = [], []
        for j in range(lanes):
            if j < half:
                u = Mux(pay.pairs, lanes_in[2 * j], lanes_in[j])
                v = Mux(pay.pairs, lanes_in[2 * j + 1], 0)
                zp_x = Mux(pay.pairs, zp_in * 2, zp_in)
                # The pair's maximum compares the two lanes as they come, and `pairs`
                # chooses after (a choice in front of the comparison as well was one
                # LUT more on a path that starts at the scratchpad's word).
                left, right = lanes_in[2 * j], lanes_in[2 * j + 1]
                pair_max = Mux(below(left, right), right, left)
                uvmax_next.append(Mux(pay.pairs, pair_max, lanes_in[j]))
            else:
                u, v, zp_x = lanes_in[j], 0, zp_in
                uvmax_next.append(lanes_in[j])
            uvz_next.append(u + v - zp_x)
        # |u + v - 2 ZP_A| <= 510; a pair's maximum is a lane.
        uvz = Signal(data.ArrayLayout(signed(11), lanes), name="s1_uvz", reset_less=True)
        uvmax = Signal(data.ArrayLayout(signed(8), lanes), name="s1_uvmax", reset_less=True)
        s1_pre = {name: Signal(len(value), name=f"s1_{name}", reset_less=True)
                  for name, value in pre.items()}
        with m.If(i_valid):
            m.d.sync += [uvz[j].eq(uvz_next[j]) for j in range(lanes)]
            m.d.sync += [uvmax[j].eq(uvmax_next[j]) for j in range(lanes)]
            m.d.sync += [s1_pre[name].eq(value) for name, value in pre.items()]
        s1_valid = _register(m, i_valid, "s1_valid", reset_less=False)
        s1_regs = _register(m, regs, "s1_regs")
        # (The lane multipliers register their operands themselves, from the row's and
        # the word's operand registers, `row` and `opa` ...)
        row, row_next = _row_in(m, self.rq, group, tail)
        row_valid = _register(m, self.rq.valid, "row_valid", reset_less=False)

        # Stage 2: operands and reductions.
        op = s1.op
        reduction = (op == VectorOp.VPOOL) | (op == VectorOp.VCMP) | (op == VectorOp.VARGMAX)
        s2_valid = Signal(name="s2_valid")
        m.d.sync += s2_valid.eq(s1_valid & (~reduction | s1.last))

        opa = Signal(data.ArrayLayout(signed(16), lanes), name="s2_opa",   # x MULT_A
                     reset_less=True)
        opb = Signal(data.ArrayLayout(signed(9), lanes), name="s2_opb",    # x MULT_B
                     reset_less=True)
        opa_next = Signal(opa.shape(), name="s2_opa_next")
        opb_next = Signal(opb.shape(), name="s2_opb_next")
        m.d.comb += [opa_next.eq(opa), opb_next.eq(opb)]
        word = Signal(data.ArrayLayout(signed(8), lanes), name="s2_word",  # unscaled results
                      reset_less=True)

        a = [s1.a[j] for j in range(lanes)]
        zp_a = s1_regs.zp_a

        # VPOOL: one accumulator per output lane, sum of (x - ZP_A) or max. A lane takes
        # a pair (u, v), or its own input u (v is then 0 in the sum, u again in the
        # maximum): stage 1 holds u + v less the zero points (2 ZP_A for a pair) and
        # max(u, v), so the merge with the accumulator is one adder or one comparison
        # (0 stands in for acc in the sum on the first word, and the pair's maximum
        # wins).
        pool = Signal(data.ArrayLayout(signed(16), lanes), name="pool")
        pooled = []
        for j in range(lanes):
            acc = pool[j]
            total = _wire(m, Mux(s1.first, 0, acc) + uvz[j], f"pool_sum{j}")
            biggest = _wire(m, Mux(s1.first | below(acc, uvmax[j]), uvmax[j], acc),
                            f"pool_max{j}")
            merged = Signal(signed(16), name=f"pooled{j}")
            m.d.comb += merged.eq(Mux(s1.average, total, biggest))
            pooled.append(merged)
        with m.If(s1_valid & (op == VectorOp.VPOOL)):
            m.d.sync += pool.eq(Cat(*pooled))

        # VCMP, VARGMAX: lanes above `lane` of the last word are ignored; so are all
        # lanes but `lane` for the operations that look at that lane alone (VCMP
        # without `reduce`, VARGMAX with `column`), whose value is then the word's
        # maximum like the others'. The lowest lane (or `lane`) is always counted and
        # masked lanes are -128, so they never win. (The lanes are masked as the word
        # comes in and registered so: masked in stage 2, in front of the lane tree's
        # first comparison, they were 11.61 ns of step 37's first ULX3S build.)
        one_lane = (((pay.op == VectorOp.VCMP) & ~pay.reduce) |
                    ((pay.op == VectorOp.VARGMAX) & pay.column))
        s1_masked = Signal(data.ArrayLayout(signed(8), lanes), name="s1_masked",
                           reset_less=True)
        with m.If(i_valid):
            for j in range(lanes):
                ignored = Mux(one_lane, j != pay.lane, pay.last & (j > pay.lane))
                m.d.sync += s1_masked[j].eq(Mux(ignored, -128, lanes_in[j]))
        masked = [s1_masked[j] for j in range(lanes)]
        # The word's own maximum, a level of the lane tree per stage (one compare and
        # select per cycle), then its merge with the best so far, then VCMP's
        # comparison and VARGMAX's test: all of them in one or two stages were the
        # tile's longest paths. Up to 16 lanes, everything is done by the result
        # stage, so LATENCY does not change.
        word_max, word_arg, tree = _argmax(m, masked, self._TREE_STAGES, "word")

        def beside_tree(value, name):
            return _delay(m, value, tree, name)

        m_first = beside_tree(s1.first, "m_first")
        m_column = beside_tree(s1.column, "m_column")
        in_tree = [s1_valid & ((op == VectorOp.VCMP) | (op == VectorOp.VARGMAX))]
        for k in range(tree):
            in_tree.append(_register(m, in_tree[-1], f"m{k + 1}_valid", reset_less=False))
        m_vargmax = _wire(m, in_tree[-1] & beside_tree(op == VectorOp.VARGMAX, "m_is_vargmax"),
                          "m_vargmax")
        m_vcmp = _wire(m, in_tree[-1] & ~m_vargmax, "m_vcmp")

        cmp_max = Signal(signed(8), name="cmp_max")
        with m.If(m_vcmp):
            m.d.sync += cmp_max.eq(Mux(m_first, word_max,
                                       _max(m, cmp_max, word_max, "cmp_merged_max")))

        best_index = _argmax_merge(m, m_vargmax, m_first, m_column, word_max, word_arg,
                                   lanes)

        # The stage after the merge: VCMP's comparison and VARGMAX's test, on what the
        # merge left in cmp_max and best_index.
        f_vargmax = _register(m, m_vargmax, "f_vargmax", reset_less=False)
        f_cmp = _delay(m, s1.cmp, tree + 1, "f_cmp")
        f_imm = _delay(m, s1.imm, tree + 1, "f_imm")
        f_expect = _delay(m, s1.expect, tree + 1, "f_expect")
        flag = _flag(m, f_vargmax, f_cmp, f_imm, f_expect, cmp_max, best_index)

        m.d.sync += word.eq(0)                  # the result word of VCMP, VARGMAX
        with m.Switch(op):
            with m.Case(VectorOp.VADD):
                for j in range(lanes):
                    m.d.comb += [
                        opa_next[j].eq(a[j] - zp_a),
                        opb_next[j].eq(s1.b[j] - s1_regs.zp_b),
                    ]
            with m.Case(VectorOp.VPOOL):
                for j in range(lanes):
                    m.d.comb += [opa_next[j].eq(pooled[j]), opb_next[j].eq(0)]
                    m.d.sync += word[j].eq(pooled[j])
            with m.Case(VectorOp.VCLAMP):
                # min(max(a, lo), hi) from the comparisons of stage 1: hi when lo > hi,
                # as numpy's clip.
                to_hi = s1_pre["inverted"][0]
                for j in range(lanes):
                    m.d.sync += word[j].eq(
                        Mux(to_hi | s1_pre["above"][j], s1.hi,
                            Mux(s1_pre["below"][j], s1.lo, a[j])))

        s2_op = _register(m, op, "s2_op")
        s2_pairs = _register(m, s1.pairs, "s2_pairs")
        s2_scaled = _register(m, (op == VectorOp.VADD) |
                              ((op == VectorOp.VPOOL) & s1.average), "s2_scaled")
        s2_regs = Signal(VectorRegs, name="s2_regs", reset_less=True)
        s2_regs_next = Signal(VectorRegs, name="s2_regs_next")
        m.d.comb += s2_regs_next.eq(s1_regs)
        if tail:
            # A scaled word's operands and registers stay for its passes, the operands
            # shifting down a group per cycle (other words leave them alone).
            scaled_in = s1_valid & ((op == VectorOp.VADD) |
                                    ((op == VectorOp.VPOOL) & s1.average & s1.last))
            with m.If(~scaled_in):
                m.d.comb += [
                    s2_regs_next.eq(s2_regs),
                    opa_next.eq(_next_group(opa, group)),
                    opb_next.eq(_next_group(opb, group)),
                ]
        m.d.sync += [opa.eq(opa_next), opb.eq(opb_next), s2_regs.eq(s2_regs_next)]

        # Stages 3..9 (a row's 1..7): (opa * MULT_A + opb * MULT_B), or a row's
        # acc * mult, requantised, on the same multipliers (the lanes of a group),
        # which take their operands from the operand registers (a word's) or from the
        # row as it comes (its accumulators and `mult` are the MAC array's and the
        # compute unit's registers), `requant` registered a cycle before. (From the
        # operand registers' inputs, a cycle sooner, VPOOL's merge and a selection
        # were in front of every multiplier's operand registers. A row does not wait
        # in `row` first: that cycle pays for the products' second register, and a
        # REQUANT after every tile of a matmul keeps its cycles.)
        rows = _register(m, self.requant, "rows")
        prods = [_product_sum(m, rows, [(row_next.acc[j], row_next.mult)],
                              [(opa[j], s2_regs.mult_a), (opb[j], s2_regs.mult_b)],
                              f"prod{j}")
                 for j in range(group)]
        # The scaling's registers a cycle after the operands (a row's in `row`), chosen
        # by `requant` of the cycle the operands were; the shift a cycle sooner than
        # the others: _round_clamp registers it.
        s3_regs = _register(m, s2_regs, "s3_regs")
        shift, zp, lo, hi = (_delay(m, Mux(rows, of_row, of_word), delay, f"scale_{name}")
                             for of_row, of_word, name, delay in (
                                 (row.shift, s3_regs.shift, "shift", _PRODUCT_STAGES - 2),
                                 (row.zp, s3_regs.zp_out, "zp", _PRODUCT_STAGES - 1),
                                 (row.lo, s3_regs.lo, "lo", _PRODUCT_STAGES - 1),
                                 (row.hi, s3_regs.hi, "hi", _PRODUCT_STAGES - 1)))
        scaled, saturated = _whole_words(m, *_round_clamp(m, prods, shift, zp, lo, hi, "rq"),
                                         lanes, group, tail)
        row_valids = _requant_out(m, self.rq_o, row_valid, self.requant_latency,
                                  scaled, saturated)

        # The result stage (9): what goes into the output register, where pairs leave
        # the upper half of the lanes 0. (With more than one pass, the cycle of a scaled
        # word's last group.)
        at_result = self._RESULT_STAGE - 2 + tail     # cycles from stage 2
        valid = [s2_valid]                      # valid[k]: stage 2 + k
        for k in range(1, at_result + 1):
            valid.append(_register(m, valid[-1], f"s{k + 2}_valid", reset_less=False))
        res_valid = valid[at_result]
        res_op = _delay(m, s2_op, at_result, "op")
        res_scaled = _delay(m, s2_scaled, at_result, "scaled")
        res_pairs = _delay(m, s2_pairs, at_result, "pairs")
        res_word = _delay(m, word, at_result, "word")
        res_flag = _delay(m, flag, at_result - tree - 1, "flag")           # stage tree + 3
        res_index = _delay(m, best_index, at_result - tree, "index")       # stage tree + 2
        _output(m, self.o, res_valid, res_op, res_pairs, res_scaled, scaled, saturated,
                res_word, res_flag, res_index)

        # Every accepted word, reductions included, passes stages 0 and 1 and sets
        # `busy`; a VCMP or VARGMAX word goes through the lane tree to its merge;
        # stages 2..9 carry only words that produce a result.
        m.d.comb += self.busy.eq(Cat(i_valid, s1_valid, *in_tree, *valid,
                                     *row_valids[:-1]).any())
        return m
