"""The operand check of compute micro-instructions, made before they issue.

Gateware of :mod:`fusetile.kernels.operands`: from a compute micro-instruction it
derives whether its operands are legal and the end offset of each scratchpad operand,
so that the control unit can fault on an instruction that would leave its partition
*before* the compute unit starts it. That is what makes compute faults precise.
"""

from amaranth.hdl import Cat, Module, Signal, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig, CHECK_LATENCY
from ..kernels.isa import MicroOp, MicroArgs, VectorCfg
from ..kernels.operands import MAX_OPERANDS, WORD_OPS
from .compare import at_least
from .multiplier import Multiplier


__all__ = ["OperandCheck"]


_END_BITS = 32   # a_addr + (k - 1) * a_stride < 2**32 for 16-bit fields


class OperandCheck(wiring.Component):
    """Legality and operand ends of one compute micro-instruction, two or three cycles
    later.

    The ends are those of :func:`fusetile.kernels.operands.operand_ends`, in the same
    order; ``used`` marks which of the ``MAX_OPERANDS`` entries an instruction has
    (none for a no-op or VCFG). Two multipliers are shared between the instructions
    with strided operands (MATMUL's two operands, VPOOL's input, REQUANT's output).

    The control unit raises ``start`` in the first cycle it gives the instruction
    register (not the kernel store's output: the first stage came after a block RAM's
    clock-to-output) and holds the instruction. The first stage registers what each
    operand needs, straight from the instruction: its base, and either a small extra
    (``n - 1``, a parameter block's last word) or which of the two products it adds,
    and whether the instruction is illegal; the two multipliers take their operands
    (count x stride) into the DSP blocks' input registers. The second multiplies, into
    product registers in the fabric beside the comparisons, and registers the room
    each operand's partition leaves after its base (``limit - base``) and whether an
    extra already reaches past it. The third compares each product with each room,
    combinationally, and ``valid`` rises: an operand's end is past its partition if
    its product (or its extra) reaches its room, ``base + extent >= limit`` with no
    adder in front of the comparison. VPOOL's input adds both products: the third
    stage registers their sum, compared a cycle later. ``ends``, for the fault's
    address, are registered a cycle after ``valid``. (In two stages, the products'
    adds and the comparison after them, and the instruction's decode in front of the
    multipliers, were the ULX3S build's worst paths, 12.1 to 12.4 ns at d3bfcf1:
    docs/fpga-timing.md, step 36. From the DSP blocks' own output registers, 2.6 ns
    of wire and a carry chain into the control unit's ``armed`` were 9.90 ns of
    0059dff's: step 50.)

    Built for area (``config.compact``), the first stage is no registers but the held
    instruction's decode itself, and the two products are made in the fabric, a
    bit of the count per cycle (a shift-and-add over its 16 bits, in the 16 cycles
    after ``start``), with no DSP: an instruction with products (MATMUL, REQUANT,
    VPOOL) has its answer ``COMPACT_CHECK_LATENCY`` (17) cycles after ``start``
    (:meth:`TileConfig.check_latency`), the others as before.

    Parameters
    ----------
    config : TileConfig
        ``rows`` and ``word_bytes`` size ACC_BIAS's and REQUANT's operands;
        ``compact`` chooses the products' build.

    Attributes
    ----------
    op : In(MicroOp)
    args : In(MicroArgs)
        The micro-instruction.
    illegal : Out(1)
        An operand of the instruction is out of its range
        (VPOOL ``window`` 0; VARGMAX ``n`` 0, ``lane`` >= ``word_bytes`` with ``column``
        or not 0 without it, ``flag`` or ``expect`` not 0 without ``test``; VCFG of a
        register that does not exist), or the instruction is not built (VCMP and
        VARGMAX without ``config.decisions``, VADD, VPOOL and VCLAMP without
        ``config.word_ops``, VPOOL with ``average`` without ``config.pool_average``);
        ``ends`` and ``used`` are then meaningless.
    used : Out(MAX_OPERANDS)
    ends : Out(ArrayLayout(32, MAX_OPERANDS))
        The largest partition offset each operand of the instruction touches.
    limit : In(17)
        The executing partition's length, in the cycle after ``start``.
    outside : Out(MAX_OPERANDS)
        The operands in ``used`` whose end is at or past ``limit``.
    start : In(1)
        The instruction is given for the first time (and then held).
    valid : Out(1)
        ``illegal``, ``used`` and ``outside`` are the instruction's, from this cycle
        (:attr:`LATENCY` cycles after ``start``, or built for area
        :meth:`TileConfig.check_latency`; VPOOL one more) while it is held;
        ``ends`` from the cycle after (built for area, from this one).
    """

    #: Cycles from ``start`` to ``valid``, but for VPOOL (one more), built for speed.
    LATENCY = CHECK_LATENCY

    def __init__(self, config):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        self.config = config
        super().__init__({
            "op": In(MicroOp),
            "args": In(MicroArgs),
            "illegal": Out(1),
            "used": Out(MAX_OPERANDS),
            "ends": Out(data.ArrayLayout(_END_BITS, MAX_OPERANDS)),
            "limit": In(17),
            "outside": Out(MAX_OPERANDS),
            "start": In(1),
            "valid": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        R, W = cfg.rows, cfg.word_bytes
        a = self.args

        # Stage 1 (registers): per operand its base, its small extra and which products
        # it adds; the multipliers' operands, count and stride, into the DSP blocks'
        # input registers. Stage 2: the products (registered in the fabric).
        # The first stage's domain: built for area, the held instruction's decode
        # itself, with no registers (each was loaded from the instruction register
        # with no LUT between, a logic cell per bit of the UP5K).
        first = "comb" if cfg.compact else "sync"
        count = [Signal(16, name=f"count{i}") for i in range(2)]
        stride = [Signal(16, name=f"stride{i}") for i in range(2)]
        product = [Signal(_END_BITS, name=f"product{i}") for i in range(2)]
        # Cycles since `start` (1 in the cycle after it), up to the answer's: `valid`.
        step = Signal(range(cfg.check_latency(True) + 2))
        for i in range(2):
            if cfg.compact:
                # A turn of the serial products per bit of the count, in the cycles
                # after `start` (steps 1 to 16).
                turn = (step != 0) & (step <= len(count[i]))
                m.d.comb += product[i].eq(_serial_product(m, self.start, turn, count[i],
                                                          stride[i], f"product{i}"))
                continue
            m.submodules[f"mul{i}"] = mul = Multiplier(16, 16, latency=2, fabric_product=True)
            m.d.comb += [mul.a.eq(count[i]), mul.b.eq(stride[i]), product[i].eq(mul.p)]
        base = [Signal(16, name=f"base{i}") for i in range(MAX_OPERANDS)]
        extra = [Signal(16, name=f"extra{i}") for i in range(MAX_OPERANDS)]
        adds = [Signal(2, name=f"adds{i}") for i in range(MAX_OPERANDS)]   # bit k: product k
        used, illegal = Signal.like(self.used), Signal()
        # An operation with a count of 0 uses none of its operands: `counted`, apart
        # from the opcode's `used`, so that each count's test is made beside the
        # opcode's decode, not after it (the decode, the test and the choice of
        # operands into `used` were 10.11 ns of e0f2cb7's routed paths; docs/fpga-timing.md,
        # step 42).
        counted = Signal()

        def spans(*operands, n=None):
            """Operands, in order: (base, extra) or (base, products added); marks them
            used (with ``n``: if it is not 0)."""
            for i, (addr, plus) in enumerate(operands):
                m.d[first] += base[i].eq(addr)
                if isinstance(plus, _Products):
                    m.d[first] += adds[i].eq(plus.mask)
                else:
                    m.d[first] += extra[i].eq(plus)
            m.d[first] += used.eq((1 << len(operands)) - 1)
            if n is not None:
                m.d[first] += counted.eq(n != 0)

        p0, p1, both = _Products(0b01), _Products(0b10), _Products(0b11)
        # Every stage-1 register but the bases is written every cycle: the defaults,
        # then the case (the multipliers' operands are 0 by default). Only `counted`
        # depends on an operation's count being 0, and a base no operation sets is not
        # used, so each base is the opcode's choice of fields and nothing more (a base
        # behind the count's test and the defaults was the longest path from the
        # kernel store's block RAM).
        m.d[first] += [illegal.eq(0), used.eq(0), counted.eq(1)]
        m.d[first] += [r.eq(0) for r in (*extra, *adds)]
        with m.Switch(self.op):
            with m.Case(MicroOp.MATMUL):
                mm = a.matmul
                m.d.comb += [count[0].eq(mm.k - 1), stride[0].eq(mm.a_stride),
                             count[1].eq(mm.k - 1), stride[1].eq(mm.b_stride)]
                spans((mm.a_addr, p0), (mm.b_addr, p1), n=mm.k)
            with m.Case(MicroOp.ACC_BIAS):
                spans((a.acc_bias.addr, -(-4 * R // W) - 1))
            with m.Case(MicroOp.REQUANT):
                rq = a.requant
                m.d.comb += [count[0].eq(R - 1), stride[0].eq(rq.out_stride)]
                with m.If(rq.per_channel):
                    spans((rq.param_addr, -(-8 * R // W) - 1), (rq.out_addr, p0))
                with m.Else():
                    spans((rq.out_addr, p0))
            if not cfg.word_ops:
                # Not built (TileConfig.word_ops): illegal, whatever the operands.
                with m.Case(*sorted(WORD_OPS, key=lambda op: op.value)):
                    m.d[first] += illegal.eq(1)
            else:
                with m.Case(MicroOp.VADD):
                    va = a.vadd
                    spans((va.a_addr, va.n - 1), (va.b_addr, va.n - 1), (va.out_addr, va.n - 1),
                          n=va.n)
                with m.Case(MicroOp.VPOOL):
                    vp = a.vpool
                    pool_illegal = vp.window == 0
                    if not cfg.pool_average:
                        pool_illegal = pool_illegal | vp.average    # not built
                    m.d[first] += illegal.eq(pool_illegal)
                    m.d.comb += [count[0].eq(vp.n - 1), stride[0].eq(vp.in_step),
                                 count[1].eq(vp.window - 1), stride[1].eq(vp.in_stride)]
                    spans((vp.in_addr, both), (vp.out_addr, vp.n - 1), n=vp.n)
                with m.Case(MicroOp.VCLAMP):
                    vc = a.vclamp
                    spans((vc.in_addr, vc.n - 1), (vc.out_addr, vc.n - 1), n=vc.n)
            if not cfg.decisions:
                # Not built (TileConfig.decisions): illegal, whatever the operands.
                with m.Case(MicroOp.VCMP, MicroOp.VARGMAX):
                    m.d[first] += illegal.eq(1)
            else:
                with m.Case(MicroOp.VCMP):
                    lane_bits = (W - 1).bit_length()
                    spans((a.vcmp.addr, a.vcmp.lane >> lane_bits))
                with m.Case(MicroOp.VARGMAX):
                    va = a.vargmax
                    lane_bits = (W - 1).bit_length()
                    m.d[first] += illegal.eq(
                        (va.n == 0) | Mux(va.column, va.lane >= W, va.lane != 0) |
                        (~va.test & ((va.flag != 0) | (va.expect != 0))))
                    spans((va.addr, Mux(va.column, va.n - 1, (va.n - 1) >> lane_bits)))
            with m.Case(MicroOp.VCFG):
                m.d[first] += illegal.eq(a.vcfg.reg.as_value() >
                                       max(r.value for r in VectorCfg))

        if cfg.compact:
            outside = self._compact_ends(m, base, extra, adds, product, used, counted)
        else:
            outside = self._ends(m, base, extra, adds, product, used, counted)

        # `valid`: cycles since `start`, up to the answer's (built for area, later for
        # an instruction with products).
        slow = Signal()         # VPOOL: the sum is compared a cycle later
        m.d.comb += slow.eq(Cat(mask == 0b11 for mask in adds).any())
        if cfg.compact:
            strided = Cat(mask != 0 for mask in adds).any()
            latency = Mux(strided, cfg.check_latency(True), cfg.check_latency(False))
        else:
            latency = self.LATENCY
        with m.If(self.start):
            m.d.sync += step.eq(1)
        with m.Elif(~self.valid):
            m.d.sync += step.eq(step + 1)
        m.d.comb += [
            self.valid.eq(~self.start & (step == latency + slow)),
            self.used.eq(Mux(counted, used, 0)), self.illegal.eq(illegal),
            self.outside.eq(Cat(*outside)),
        ]
        return m

    def _ends(self, m, base, extra, adds, product, used, counted):
        """The operands outside the partition (``outside``'s bits), and their ends,
        built for speed: with no adder in front of a comparison."""
        # Stage 2 (registers): the room each partition leaves after the operand's base,
        # and whether the operand's extra reaches it.
        room = [Signal(range(-(1 << 16), 1 << 17), name=f"room{i}") for i in range(MAX_OPERANDS)]
        extra_out = Signal(MAX_OPERANDS)
        for i in range(MAX_OPERANDS):
            left = self.limit - base[i]
            m.d.sync += [room[i].eq(left), extra_out[i].eq(at_least(extra[i], left))]

        # Stage 3: each product against each room, and the sum of both products,
        # registered for VPOOL's input (compared in a fourth). (No sum overflows 32
        # bits: the largest, MATMUL's, is below (2**16 - 1) * 2**16.)
        both_sum = Signal(_END_BITS)
        m.d.sync += both_sum.eq(product[0] + product[1])
        outside = []
        for i in range(MAX_OPERANDS):
            reached = Signal(name=f"reached{i}")
            with m.Switch(adds[i]):
                with m.Case(0b00):
                    m.d.comb += reached.eq(extra_out[i])
                with m.Case(0b01):
                    m.d.comb += reached.eq(at_least(product[0], room[i]))
                with m.Case(0b10):
                    m.d.comb += reached.eq(at_least(product[1], room[i]))
                with m.Case(0b11):
                    m.d.comb += reached.eq(at_least(both_sum, room[i]))
            outside.append(used[i] & counted & reached)
            # The ends, a cycle later (they are the fault's address, read in the cycle
            # after the decision to fault).
            m.d.sync += self.ends[i].eq(base[i] + _extent(extra[i], adds[i], product, both_sum))
        return outside

    def _compact_ends(self, m, base, extra, adds, product, used, counted):
        """:meth:`_ends` built for area: each operand's end itself, ``base + extent``,
        compared with the limit in the answer's cycle (an adder and a comparison per
        operand), where the room is a subtraction and a comparison with each thing an
        end may add (its extra, a product, both). ``ends`` are those sums, with no
        register: what they add holds still while the instruction is held (a register
        after an adder that also feeds a comparison takes a logic cell per bit of its
        own on an iCE40)."""
        both_sum = Signal(_END_BITS)
        m.d.sync += both_sum.eq(product[0] + product[1])
        outside = []
        # An end is past the limit (at most 2**16) if a bit above the limit's is set,
        # or else by a comparison of the limit's width: not a carry chain of the end's.
        low = len(self.limit)
        for i in range(MAX_OPERANDS):
            end = Signal(_END_BITS + 1, name=f"end{i}")
            m.d.comb += [end.eq(base[i] + _extent(extra[i], adds[i], product, both_sum)),
                         self.ends[i].eq(end)]
            past = end[low:].any() | at_least(end[:low], self.limit)
            outside.append(used[i] & counted & past)
        return outside


def _extent(extra, adds, product, both_sum):
    """What an operand's end adds to its base: its extra, or the products it adds
    (``adds``; both: their registered sum)."""
    return Mux(adds == 0b11, both_sum,
               Mux(adds[0], product[0], 0) | Mux(adds[1], product[1], 0) | extra)


def _serial_product(m, start, turn, count, stride, name):
    """``count * stride`` (16-bit operands, held from ``start``) in a register, made a
    bit of ``count`` per cycle ``turn`` is high (the ``len(count)`` cycles after
    ``start``), and held after them while ``turn`` is low.

    The register holds the partial sum above the bits of ``count`` still to be
    taken: each turn adds ``stride`` to the top half when its lowest bit is set, and
    shifts the whole right (the shift-and-add multiplier; a 17-bit adder, no DSP).
    """
    bits = len(count)
    acc = Signal(2 * bits, name=f"{name}_acc")
    with m.If(start):
        m.d.sync += acc.eq(count)
    with m.Elif(turn):
        top = acc[bits:] + Mux(acc[0], stride, 0)
        m.d.sync += acc.eq(Cat(acc[1:bits], top))
    return acc


class _Products:
    """Which of the two products an operand's end adds (bit ``k``: product ``k``)."""

    def __init__(self, mask):
        self.mask = mask
