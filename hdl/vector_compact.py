"""The vector unit built for area (:attr:`TileConfig.compact`): :class:`CompactVectorAlu`.

:class:`~fusetile.hdl.vector.VectorAlu` is pipelined for the ULX3S's 100 MHz: a
register in every path of more than a few LUTs, the word and the VCFG registers
carried along its eleven stages, each DSP multiplier's operands and product registered
in the fabric as well as in the block. On an iCE40UP5K at 20 MHz a cycle is 50 ns, and
every flip-flop takes one of the 5,280 logic cells the whole tile must fit in. This
unit does the same operations, bit for bit, through the same ports and contract, in
the stages such a clock needs:

* cycle 1: VPOOL's merge, VCLAMP's result, and VCMP's and VARGMAX's lane tree and
  its merge with the best so far, worked out from the word as it is presented and
  registered (the deep unit's stages 0 to 2 and its lane tree); the operands of a
  scaled word (VADD's ``x - ZP``) go straight into the lane multipliers' operand
  registers, the DSP blocks' own, as a REQUANT row does;
* cycle 2: the products, in the DSP blocks' output registers; VCMP's comparison and
  VARGMAX's test, beside them, and the unscaled results into the output register;
* cycle 3: the products' sum; 4: the shift and the sticky bit; 5: rounding, zero
  point and clamp; 6: the output register.

``LATENCY`` is therefore 6 and ``REQUANT_LATENCY`` 5 (:mod:`fusetile.kernels.config`),
``vector_passes - 1`` more with fewer lane multipliers than lanes. The results that
are not scaled (VCLAMP's, a maximum VPOOL's, VCMP's and VARGMAX's) do not wait for
the scaling: they go to the output register in cycle 2, ``UNSCALED_LATENCY`` = 2
cycles after their last word, whatever the passes. The golden model's cycles follow
the configuration. Every stage past the first carries only what the later stages
read: the scaling registers go along as far as each is needed.

A tile without VCMP and VARGMAX (``TileConfig.decisions``) gets no lane tree, best so
far or flag test; one without VADD, VPOOL and VCLAMP (``word_ops``) no word path (its
pooling, clamp and scaled operands): only REQUANT's rows go through; one whose VPOOL takes maxima only (``pool_average``) keeps them in
8-bit accumulators, and its lane multipliers' scaled operand is VADD's 9-bit
``a - ZP_A`` rather than a 16-bit sum.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data

from ..kernels import config as tile_config
from .compare import below
from .vector import (VectorAlu, VectorOp, _argmax, _argmax_merge, _delay, _flag, _max,
                     _next_group, _output, _product_sum, _register, _requant_out,
                     _whole_words, _wire)


__all__ = ["CompactVectorAlu", "vector_alu"]


#: Cycles :func:`_product_sum` takes built ``short``: operands, products, sum.
_PRODUCT_STAGES = 3


#: Bits of ``t = p >> (30 + shift)`` the compact unit's rounding and clamp work on. Past
#: them ``|t >> 1| >= 512``, so ``|y| >= 383`` whatever the int8 zero point: outside
#: the int8 range, where the clamp makes every such ``y`` of one sign the same.
_T_BITS = 11


def _round_clamp(m, prods, shift, zp, lo, hi, name):
    """``clamp(zp + round_half_even(p / 2**(31 + shift)), lo, hi)`` for each ``p`` in
    ``prods``, two cycles later: the shift and the sticky bit, then the rest.

    ``prods`` are signed values and ``shift`` (0..31) the value of their cycle; ``zp``,
    ``lo``, ``hi`` (int8) those of the cycle after. The rounding is the deep unit's
    (:func:`fusetile.hdl.vector._round_clamp`): ``t = p >> (30 + shift)``, whose bit 0
    is the rounding bit, and a sticky bit for the bits below it; round up iff
    ``t[0] & (sticky | t[1])``. The clamp is :func:`numpy.clip`'s ``min(max(y, lo),
    hi)`` (``lo > hi`` gives ``hi``); a lane is saturated when it changed ``y``.

    Built for area, the shifter makes only ``t``'s low ``_T_BITS`` bits, and the
    arithmetic after it is that wide: a ``t`` outside them is replaced by the
    nearest value inside, of the same sign, whose ``y`` is outside the int8 range
    too (clamped, and saturated, alike). Whether ``t`` fits is whether the bits of
    ``p >> 30`` from ``shift + _T_BITS - 1`` up are all its sign: a mask, not a second
    shifter. The sticky bit ORs the bits each step of the shifter shifts out, with no
    mask of its own. (With the deep unit's 34-bit shifter, adders and comparisons the
    unit took 2,322 LUT4, 586 carry cells and 1,004 flip-flops mapped alone at
    f6b567c; with these 2,238, 518 and 981; with the sticky bit from the shifter and
    the mask a one-hot decode's running OR, 2,076, 497 and 888 at step 57.)

    Returns ``(values, saturated)``: lists of signed(8) and 1-bit registers.
    """
    # The bits of p >> 30 at and above t's top kept bit (bit shift + _T_BITS - 1): a
    # running OR of the shift's one-hot decode (a subtraction, `(1 << shift) - 1`, is
    # a carry chain; comparisons of the shift with each bit's number are too).
    at = _wire(m, (Const(1, 1) << shift)[:34 - (_T_BITS - 1)], f"{name}_at")
    top = [at[0]]
    for i in range(1, len(at)):
        top.append(top[-1] | at[i])
    top = _wire(m, Cat(Const(0, _T_BITS - 1), *top), f"{name}_top")
    t_min, t_max = -(1 << (_T_BITS - 1)), (1 << (_T_BITS - 1)) - 1
    values, saturated = [], []
    for lane, prod in enumerate(prods):
        # |p| < 2**63, so p >> 30 fits 34 bits; widening first makes the masks see sign
        # bits when p is narrower than 30 + shift.
        wide = Signal(signed(64), name=f"{name}{lane}_wide")
        m.d.comb += wide.eq(prod)
        high = wide[30:64]                      # p >> 30, unsigned bits
        sign = wide[63]
        fits = _wire(m, ~((high ^ sign.replicate(34)) & top).any(), f"{name}{lane}_fits")
        # t's low bits: each step of the shifter makes only the bits the later steps
        # and the result read. The bits a step shifts out are below t[0]: the sticky
        # bit ORs them, with the bits below p >> 30.
        low = high
        shifted_out = [wide[:30].any()]
        for k in reversed(range(len(shift))):
            need = _T_BITS + (1 << k) - 1
            ext = Cat(low, low[-1].replicate((1 << k) + need - len(low)))
            shifted_out.append(shift[k] & low[:1 << k].any())
            low = Mux(shift[k], ext[1 << k:(1 << k) + need], low[:need])
        low = _wire(m, low.as_signed(), f"{name}{lane}_low")
        t = Signal(signed(_T_BITS), name=f"{name}{lane}_t", reset_less=True)
        sticky = Signal(name=f"{name}{lane}_sticky", reset_less=True)
        m.d.sync += [
            t.eq(Mux(fits, low, Mux(sign, t_min, t_max))),
            sticky.eq(Cat(*shifted_out).any()),
        ]
        y = _wire(m, (t >> 1) + zp + (t[0] & (sticky | t[1])), f"{name}{lane}_y")
        at_least_lo = _wire(m, Mux(y < lo, lo, y), f"{name}{lane}_at_least_lo")
        clamped = _wire(m, Mux(at_least_lo > hi, hi, at_least_lo), f"{name}{lane}_clamped")
        value = _register(m, clamped[:8].as_signed(), f"{name}{lane}_value")
        sat = _register(m, clamped != y, f"{name}{lane}_sat")
        values.append(value)
        saturated.append(sat)
    return values, saturated


def _row_held(m, rq, group, tail):
    """The REQUANT row the lane multipliers take this cycle: the one on ``rq``, with
    the pass's group of its accumulators first. With more than one pass, the row holds
    still on ``rq`` for its passes (the compute unit's ACC readout and table entry
    do), so it needs no copy of its own (the deep unit's ``_row_in`` shifts one): a
    row's pass ``k`` takes its ``k``-th group, ``k`` cycles after it came."""
    if not tail:
        return rq.payload
    passes = tail + 1
    turn = Signal(range(passes), name="row_pass")   # the pass of the row on `rq`
    with m.If(rq.valid):
        m.d.sync += turn.eq(1)
    with m.Elif(turn != 0):
        m.d.sync += turn.eq(turn + 1)           # (passes is a power of two: it wraps)
    acc = rq.payload.acc.as_value()
    bits = len(acc) // passes
    row_next = Signal(rq.payload.shape(), name="row_next")
    m.d.comb += [row_next.eq(rq.payload),
                 row_next.acc.as_value().eq(Array(acc[k * bits:(k + 1) * bits]
                                                  for k in range(passes))[turn])]
    return row_next


def _decision(m, valid, pay, is_vcmp, is_vargmax, lanes):
    """VCMP's and VARGMAX's part of the unit: their flag (a wire, in cycle 2) and
    VARGMAX's index register, from the word ``pay`` as it is presented (``valid``).

    Lanes above ``lane`` of the last word are ignored, and all lanes but ``lane`` for
    the operations that look at that lane alone (VCMP without ``reduce``, VARGMAX with
    ``column``); masked lanes are -128 and never win. The word's maximum and its lane,
    from the lane tree as it comes, merge with the best so far in cycle 1; VCMP's
    comparison and VARGMAX's test are made in cycle 2, into the output register."""
    a = [pay.a[j] for j in range(lanes)]
    one_lane = (is_vcmp & ~pay.reduce) | (is_vargmax & pay.column)
    masked = [Mux(Mux(one_lane, j != pay.lane, pay.last & (j > pay.lane)), -128, a[j])
              for j in range(lanes)]
    word_max, word_arg, _ = _argmax(m, [_wire(m, x, f"masked{j}")
                                        for j, x in enumerate(masked)],
                                    0, "word")
    cmp_max = Signal(signed(8), name="cmp_max")
    with m.If(valid & is_vcmp):
        m.d.sync += cmp_max.eq(Mux(pay.first, word_max,
                                   _max(m, cmp_max, word_max, "cmp_merged_max")))
    best_index = _argmax_merge(m, valid & is_vargmax, pay.first, pay.column, word_max,
                               word_arg, lanes)
    s1_vargmax = _register(m, is_vargmax, "s1_vargmax")
    s1_cmp = _register(m, pay.cmp, "s1_cmp")
    s1_imm = _register(m, pay.imm, "s1_imm")
    s1_expect = _register(m, pay.expect, "s1_expect")
    flag = _flag(m, s1_vargmax, s1_cmp, s1_imm, s1_expect, cmp_max, best_index,
                 domain="comb")
    return flag, best_index


class CompactVectorAlu(VectorAlu):
    """:class:`~fusetile.hdl.vector.VectorAlu` built for area: the same operations and
    ports, in ``LATENCY`` = 6 cycles for a scaled word (VADD, an average VPOOL's
    last), ``UNSCALED_LATENCY`` = 2 for the others' results and ``REQUANT_LATENCY`` =
    5 for a row (the first and the last ``vector_passes - 1`` more each with fewer
    lane multipliers than lanes: :attr:`latency`, :attr:`unscaled_latency`,
    :attr:`requant_latency`). A scaled and an unscaled result must not be due in one
    cycle (the compute unit runs one command at a time).

    ``requant`` is read registered in the cycle a word's or a row's operands go to
    the lane multipliers: it must be high in the cycle before a row is presented and
    low in the cycle before a scaled word is (``REQUANT_HIGH``, ``REQUANT_LOW``;
    with more than one pass, for each pass: the compute unit holds it for a whole
    command). ``regs`` is read in each pass of a scaled word and until its result: it
    must hold still from the cycle a scaled word or a row is presented until its
    result is (the compute unit's VCFG registers do: a command drains before the
    next). With more than one pass, a row on ``rq`` must hold still for its passes,
    ``vector_passes - 1`` cycles after it comes (``rq.valid`` is high for its first
    only): the unit reads a group of its accumulators in each. A row's zero point and
    clamp bounds are ``regs``' ``zp_out``, ``lo`` and ``hi``, as the compute unit's
    rows have them: the ones on ``rq`` are not read.
    ``busy`` is high from the cycle after a word or a row is presented until the
    cycle before its result is out.

    Parameters
    ----------
    config : TileConfig
        ``word_bytes`` gives the number of lanes, ``vector_lanes`` the lane
        multipliers.
    """

    LATENCY = tile_config.COMPACT_VECTOR_LATENCY
    UNSCALED_LATENCY = tile_config.COMPACT_UNSCALED_LATENCY
    REQUANT_LATENCY = tile_config.COMPACT_REQUANT_LATENCY
    REQUANT_HIGH = (-1,)
    REQUANT_LOW = (-1,)

    def elaborate(self, platform):
        lanes, half, group, tail = self._sizes()
        cfg = self.config
        m = Module()

        m.d.comb += [self.i.ready.eq(1), self.rq.ready.eq(1)]

        # -- cycle 1: from the word as it is presented ----------------------------------
        valid, pay, regs = self.i.valid, self.i.payload, self.regs
        op = pay.op
        a = [pay.a[j] for j in range(lanes)]
        # The operations the tile does not build (TileConfig.decisions, word_ops,
        # pool_average) never come: their logic is left out.
        is_vadd, is_vpool, is_vclamp = ((op == VectorOp.VADD, op == VectorOp.VPOOL,
                                         op == VectorOp.VCLAMP) if cfg.word_ops
                                        else (Const(0), Const(0), Const(0)))
        is_vcmp, is_vargmax = ((op == VectorOp.VCMP, op == VectorOp.VARGMAX) if cfg.decisions
                               else (Const(0), Const(0)))
        average = pay.average if cfg.pool_average else Const(0)
        scaled_op = is_vadd | (is_vpool & average)
        scaled_in = valid & (is_vadd | (is_vpool & average & pay.last))
        reduction = is_vpool | is_vcmp | is_vargmax
        # A scaled word is VADD's or, where VPOOL averages, an average's sums.
        sums = is_vpool if cfg.pool_average else Const(0)
        # A word that gives a result (VADD, VCLAMP, a reduction's last), scaled or not.
        gives = valid & (~reduction | pay.last)
        s1_scaled_valid = _register(m, gives & scaled_op, "s1_scaled_valid", reset_less=False)
        s1_unscaled_valid = _register(m, gives & ~scaled_op, "s1_unscaled_valid",
                                      reset_less=False)

        # VPOOL: one accumulator per output lane, the sum of (x - ZP_A) or the maximum
        # (the maximum alone without `pool_average`). A lane takes a pair (its lanes
        # 2j and 2j + 1) or its own lane. A maximum is an int8 (the first word's, then
        # the larger), so it is compared on 8 bits.
        pool = Signal(data.ArrayLayout(signed(16 if cfg.pool_average else 8), lanes),
                      name="pool")
        pooled = []
        for j in range(lanes):
            if j < half:
                left, right = a[2 * j], a[2 * j + 1]
                u = Mux(pay.pairs, left, a[j])
                v = Mux(pay.pairs, right, 0)
                zp_x = Mux(pay.pairs, regs.zp_a * 2, regs.zp_a)
                most = Mux(pay.pairs, Mux(below(left, right), right, left), a[j])
            else:
                u, v, zp_x, most = a[j], 0, regs.zp_a, a[j]
            if cfg.pool_average:
                total = Mux(pay.first, 0, pool[j]) + (u + v - zp_x)
            pool_max = pool[j][:8].as_signed()
            biggest = Mux(pay.first | below(pool_max, most), most, pool_max)
            pooled.append(_wire(m, Mux(pay.average, total, biggest)[:16].as_signed()
                                if cfg.pool_average else biggest, f"pooled{j}"))
        with m.If(valid & is_vpool):
            m.d.sync += pool.eq(Cat(*pooled))

        # The unscaled result word: VCLAMP's (min(max(a, lo), hi), hi when lo > hi, as
        # numpy's clip) and a maximum VPOOL's; 0 for the others.
        word = Signal(data.ArrayLayout(signed(8), lanes), name="word", reset_less=True)
        m.d.sync += word.eq(0)
        with m.If(is_vpool):
            m.d.sync += [word[j].eq(pooled[j]) for j in range(lanes)]
        with m.If(is_vclamp):
            to_hi = below(pay.hi, pay.lo)
            m.d.sync += [word[j].eq(Mux(to_hi | below(pay.hi, a[j]), pay.hi,
                                        Mux(below(a[j], pay.lo), pay.lo, a[j])))
                         for j in range(lanes)]

        # The scaled words' operands, (a - ZP_A, b - ZP_B) for VADD and (sum, 0) for an
        # average VPOOL's last word, go to the lane multipliers as the word comes; with
        # more than one pass they stay for its passes, shifting down a group per cycle.
        # The registers that scale them are read in every pass: they hold still under
        # a command (the compute unit's VCFG registers), so they need no copy.
        # (VADD's `a - ZP_A` is 9 bits, an average's sum 16.)
        opa = Signal(data.ArrayLayout(signed(16 if cfg.pool_average else 9), lanes),
                     name="opa")
        opb = Signal(data.ArrayLayout(signed(9), lanes), name="opb")
        if tail:
            # With more than one pass the word's lanes wait as they came (VADD's a and
            # b, or the sums), and the zero points are subtracted from the group the
            # multipliers take: a subtraction per lane multiplier rather than per lane.
            raw_a = Signal(data.ArrayLayout(signed(16 if cfg.pool_average else 8), lanes),
                           name="raw_a")
            raw_b = Signal(data.ArrayLayout(signed(8), lanes), name="raw_b")
            vadd = Signal(name="raw_vadd")      # they are VADD's: subtract the zero points
            rest = [Signal(value.shape(), name=f"{name}_rest", reset_less=True)
                    for value, name in ((raw_a, "raw_a"), (raw_b, "raw_b"), (vadd, "raw_vadd"))]
            m.d.sync += [r.eq(value) for r, value in zip(rest, (raw_a, raw_b, vadd))]
            m.d.comb += [raw_a.eq(_next_group(rest[0], group)),
                         raw_b.eq(_next_group(rest[1], group)),
                         vadd.eq(rest[2])]
            with m.If(scaled_in):
                with m.If(sums):
                    m.d.comb += [*(raw_a[j].eq(pooled[j]) for j in range(lanes)),
                                 raw_b.eq(0), vadd.eq(0)]
                with m.Else():
                    m.d.comb += [*(raw_a[j].eq(a[j]) for j in range(lanes)),
                                 *(raw_b[j].eq(pay.b[j]) for j in range(lanes)), vadd.eq(1)]
            zp_a = _wire(m, Mux(vadd, regs.zp_a, 0), "raw_zp_a")
            zp_b = _wire(m, Mux(vadd, regs.zp_b, 0), "raw_zp_b")
            m.d.comb += [*(opa[j].eq(raw_a[j] - zp_a) for j in range(group)),
                         *(opb[j].eq(raw_b[j] - zp_b) for j in range(group))]
        else:
            with m.If(scaled_in):
                with m.If(sums):
                    m.d.comb += [opa[j].eq(pooled[j]) for j in range(lanes)]
                    m.d.comb += opb.eq(0)
                with m.Else():
                    m.d.comb += [opa[j].eq(a[j] - regs.zp_a) for j in range(lanes)]
                    m.d.comb += [opb[j].eq(pay.b[j] - regs.zp_b) for j in range(lanes)]

        s1_op = _register(m, op, "s1_op")
        s1_pairs = _register(m, pay.pairs, "s1_pairs")
        if cfg.decisions:
            flag, best_index = _decision(m, valid, pay, is_vcmp, is_vargmax, lanes)
        else:
            flag, best_index = Const(0), Const(0, 16)   # VCMP and VARGMAX: not built

        # -- cycles 1 to 5: the scaling ----------------------------------------------------
        # (opa * MULT_A + opb * MULT_B) of a word, or acc * mult of a row as it comes
        # (its accumulators and `mult` are the MAC array's and the compute unit's
        # registers), on the same multipliers: `requant` registered chooses.
        row_next = _row_held(m, self.rq, group, tail)
        # (Without the word operations every product is a row's: no choice, and no
        # word terms.)
        rows = _register(m, self.requant, "rows") if cfg.word_ops else Const(1)
        prods = [_product_sum(m, rows, [(row_next.acc[j], row_next.mult)],
                              [(opa[j], regs.mult_a), (opb[j], regs.mult_b)]
                              if cfg.word_ops else [],
                              f"prod{j}", short=True, low_or=True)
                 for j in range(group)]
        # The shift of the operands' cycle, a row's (its own, with a per-channel table)
        # or a word's, carried to the products' sum. The zero point and the bounds are
        # the VCFG registers', a row's too, read where they are used: they hold still
        # until the result is out.
        shift = _delay(m, Mux(rows, row_next.shift, regs.shift), _PRODUCT_STAGES,
                       "scale_shift")
        zp, lo, hi = regs.zp_out, regs.lo, regs.hi
        scaled, saturated = _whole_words(m, *_round_clamp(m, prods, shift, zp, lo, hi, "rq"),
                                         lanes, group, tail)
        row_valids = _requant_out(m, self.rq_o,
                                  _register(m, self.rq.valid, "row1_valid", reset_less=False),
                                  self.requant_latency, scaled, saturated)

        # -- cycle 6: the output register --------------------------------------------
        # A scaled word's result is there in the cycle before it (with more than one
        # pass, in its last group's cycle), the others' in cycle 2 (UNSCALED_LATENCY
        # = 2), from cycle 1's registers: they do not wait for the scaling. The two
        # are never due in one cycle (the compute unit runs one command at a time; a
        # stream that mixes them must keep them apart). Pairs leave the upper half of
        # the lanes 0.
        at_result = self.latency - 2            # cycles from cycle 1
        scaled_valids = [s1_scaled_valid]       # scaled_valids[k]: cycle 1 + k
        for k in range(1, at_result + 1):
            scaled_valids.append(_register(m, scaled_valids[-1], f"s{k + 1}_scaled_valid",
                                           reset_less=False))
        res_scaled = scaled_valids[at_result]
        res_op = _wire(m, Mux(res_scaled, _delay(m, s1_op, at_result, "scaled_op"), s1_op),
                       "res_op")
        res_pairs = _wire(m, Mux(res_scaled, _delay(m, s1_pairs, at_result, "scaled_pairs"),
                                 s1_pairs), "res_pairs")
        _output(m, self.o, res_scaled | s1_unscaled_valid, res_op, res_pairs, res_scaled,
                scaled, saturated, word, flag, best_index)

        # A word that gives no result (a reduction's but the last) is in flight for a
        # cycle: its merge.
        in_flight = _register(m, valid & reduction & ~pay.last, "merging", reset_less=False)
        m.d.comb += self.busy.eq(Cat(in_flight, *scaled_valids, s1_unscaled_valid,
                                     *row_valids[:-1]).any())
        return m


def vector_alu(config):
    """The vector unit for ``config``: :class:`CompactVectorAlu` when it is built for
    area (:attr:`TileConfig.compact`), else :class:`~fusetile.hdl.vector.VectorAlu`."""
    return (CompactVectorAlu if config.compact else VectorAlu)(config)
