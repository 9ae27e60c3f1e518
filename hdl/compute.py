"""The compute unit: executes compute micro-instructions against the scratchpad.

It owns the MAC array (:class:`~fusetile.hdl.mac_array.MacArray`), the vector ALU
(:mod:`fusetile.hdl.vector`; it requantises too, on the same lane multipliers) and the
vector configuration registers, and reads and writes the scratchpad through three
ports: ``a`` and ``b`` (operand reads) and ``w`` (result writes).

Every operation is a stream of *steps* through a four-part pipeline:

1. *issue*: the step's reads are presented on ``a`` (and ``b``); a read answered with
   ``stall`` is presented again in the next cycle, a performed read of a step whose
   other read stalled is kept in a hold register (so that ``a`` and ``b`` hitting the
   same bank cannot starve ``b`` forever);
2. *read*, the cycle after the step's last read: the scratchpad's words are
   registered (nothing else is done with them: a block RAM's read is most of a
   cycle); a REQUANT row, which reads no word, goes to the vector ALU's rows from here
   with its ACC row;
3. *data*: the words go to the MAC array (MATMUL), the vector ALU (VADD, VPOOL,
   VCLAMP, VCMP, VARGMAX) or the operand buffer (ACC_BIAS, REQUANT's per-channel
   table);
4. *write*: the vector ALU's words and rows have a fixed latency and no
   backpressure, so each result is written to ``w`` in the cycle it appears.

Faults are precise in program order (for each output: its inputs, then the output): a
read outside the partition stops the issue stage, every earlier result still in the
pipeline is written (a write fault among them is the one reported), then the unit
stops. A write answered with ``stall`` (which the tile never does) squashes the pipeline
and restarts the operation from the output that was not written.
"""


from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..kernels.config import TileConfig
from ..kernels.isa import MicroOp, MicroArgs, FaultCause, VectorCfg
from .compare import at_least
from .copies import copy
from .mac_array import MacArray
from .scratchpad import SpadPortSignature, point as spad_point, registered_word
from .vector import VectorOp, VectorRegs
from .vector_compact import vector_alu


__all__ = ["ComputeCommand", "port_starts", "vector_steps", "ComputeUnit"]


_ADDR_BITS = 17     # a 16-bit offset plus one bit: an offset that ran past 2**16 is
                    # seen (and faults) instead of aliasing. Addresses grow monotonically
                    # from a checked one by at most 2**16, so one extra bit is enough.


class ComputeCommand(data.Struct):
    """One compute micro-instruction, as the kernel sequencer hands it over."""
    op:   MicroOp      #: MATMUL, ACC_BIAS, REQUANT, VADD, VPOOL, VCLAMP, VCMP, VARGMAX, VCFG
    args: MicroArgs    #: the micro-instruction's operands (the member named after ``op``)
    part: 4            #: the calling slot's scratchpad partition
    #: The first word each of the unit's ports reads or writes (``_ADDR_BITS`` wide: an
    #: offset past 2**16 faults): ``a`` MATMUL's ``a_addr``, ACC_BIAS's ``addr``,
    #: REQUANT's ``param_addr``, VADD's ``a_addr``, VPOOL's and VCLAMP's ``in_addr``,
    #: VCMP's first word (``addr``, plus its lane's word without ``reduce``) and
    #: VARGMAX's ``addr``; ``b`` MATMUL's and VADD's ``b_addr``; ``w`` the ``out_addr``
    #: of REQUANT, VADD, VPOOL and VCLAMP; 0 for a stream the operation does not have.
    #: The issuer chooses them from its instruction register (:func:`port_starts`), so
    #: that the unit's acceptance makes one partition test per port, with no adder in
    #: front of it (VCMP's was the worst path of step 36's best ULX3S build) and no
    #: choice by opcode after it (that choice, in front of the pointers' other
    #: updates, was `a_out`, `b_out` and `w_out`'s routed paths at ce9846f, 10.0 to
    #: 10.5 ns; docs/fpga-timing.md, step 48).
    a_first: _ADDR_BITS
    b_first: _ADDR_BITS
    w_first: _ADDR_BITS
    #: VCMP and VARGMAX: the words they read (:func:`vector_steps`), likewise worked out
    #: by the issuer: the shift and adder in front of the unit's step count (`total`)
    #: were 10.08 ns of e0f2cb7's routed paths (docs/fpga-timing.md, step 42).
    steps: 16


def port_starts(m, op, args, word_bytes):
    """The first words of the ``a``, ``b`` and ``w`` streams of the compute
    micro-instruction ``op`` with ``args`` (a :class:`MicroArgs` view), for
    :attr:`ComputeCommand.a_first`, ``b_first`` and ``w_first``: three signals, driven
    in ``m``'s comb domain."""
    lane_bits = (word_bytes - 1).bit_length()       # word_bytes is a power of two
    a, b, w = (Signal(_ADDR_BITS, name=f"{port}_first") for port in "abw")
    with m.Switch(op):
        with m.Case(MicroOp.MATMUL):
            m.d.comb += [a.eq(args.matmul.a_addr), b.eq(args.matmul.b_addr)]
        with m.Case(MicroOp.ACC_BIAS):
            m.d.comb += a.eq(args.acc_bias.addr)
        with m.Case(MicroOp.REQUANT):
            m.d.comb += [a.eq(args.requant.param_addr), w.eq(args.requant.out_addr)]
        with m.Case(MicroOp.VADD):
            m.d.comb += [a.eq(args.vadd.a_addr), b.eq(args.vadd.b_addr),
                         w.eq(args.vadd.out_addr)]
        with m.Case(MicroOp.VPOOL):
            m.d.comb += [a.eq(args.vpool.in_addr), w.eq(args.vpool.out_addr)]
        with m.Case(MicroOp.VCLAMP):
            m.d.comb += [a.eq(args.vclamp.in_addr), w.eq(args.vclamp.out_addr)]
        with m.Case(MicroOp.VCMP):
            vcmp = args.vcmp
            m.d.comb += a.eq(vcmp.addr + Mux(vcmp.reduce, 0, vcmp.lane >> lane_bits))
        with m.Case(MicroOp.VARGMAX):
            m.d.comb += a.eq(args.vargmax.addr)
    return a, b, w


def vector_steps(op, args, word_bytes):
    """The words VCMP or VARGMAX (``op``) with ``args`` (a :class:`MicroArgs` view)
    reads, for :attr:`ComputeCommand.steps`: VCMP's one word, or with ``reduce`` the
    words up to its lane's; VARGMAX's ``n`` words of a column, or the words ``n``
    lanes take."""
    lane_bits = (word_bytes - 1).bit_length()
    vcmp, vargmax = args.vcmp, args.vargmax
    return Mux(op == MicroOp.VCMP,
               Mux(vcmp.reduce, (vcmp.lane >> lane_bits) + 1, 1),
               Mux(vargmax.column, vargmax.n, ((vargmax.n - 1) >> lane_bits) + 1))


class _Step(data.Struct):
    """A step as it goes down the read and data stages."""
    valid:  1
    hold_a: 1       # its `a` word is in the hold register, not on the port
    hold_b: 1
    first:  1
    last:   1
    idx:    16


def _shift_reg(m, name, length, data_in, clear):
    """A ``length``-bit shift register (bit 0 in first); returns (register, last bit)."""
    reg = Signal(length, name=name)
    m.d.sync += reg.eq(Cat(data_in, reg[:-1]))
    with m.If(clear):
        m.d.sync += reg.eq(0)
    return reg, reg[-1]


def _result_pipe(m, name, alu, steps, scaled, clear):
    """The ``steps`` whose results the vector unit ``alu`` has in flight: a shift
    register of its latency; returns (register, last bit). A unit whose unscaled
    results come sooner (``alu.unscaled_latency``: the compact build) gets one of that
    length beside it for them; ``scaled`` says which the command's are (one command
    runs at a time, so the two never have bits at once)."""
    if alu.unscaled_latency == alu.latency:
        return _shift_reg(m, name, alu.latency, steps, clear)
    slow, slow_out = _shift_reg(m, name, alu.latency, steps & scaled, clear)
    fast, fast_out = _shift_reg(m, f"{name}_unscaled", alu.unscaled_latency,
                                steps & ~scaled, clear)
    return Cat(slow, fast), slow_out | fast_out


class ComputeUnit(wiring.Component):
    """Executes MATMUL, ACC_BIAS, REQUANT, VADD, VPOOL, VCLAMP, VCMP, VARGMAX and VCFG.

    Semantics are those of ``docs/isa.md`` / :mod:`fusetile.kernels.isa`, bit-exact
    against :mod:`fusetile.kernels.arith`.

    *Commands.* ``cmd.ready`` is high when the unit holds no command and no fault
    (from registers only): one command is executed at a time, and the next one may be
    accepted in the cycle after ``busy`` falls. ``busy`` is
    high from the cycle after a command is accepted until (excluding) the first cycle in
    which all its effects are visible: the last result written, the MAC pipeline drained (ACC holds
    every step), the flag or index register written, or ``fault`` high. VCFG, a no-op
    (MATMUL with ``k`` = 0, VADD / VPOOL / VCLAMP with ``n`` = 0) and the illegal
    commands below complete in the cycle they are accepted (``busy`` stays low; VCFG's
    register changes at the end of that cycle).

    Cycles of ``busy`` with no stalls (R = rows, W = ``word_bytes``):

    =========  =========================================================
    MATMUL     ``k + 4`` (one step per cycle)
    ACC_BIAS   ``ceil(4R / W) + 2``
    REQUANT    ``R + 8``; per-channel ``ceil(8R / W) + 3`` more (the table is
               read first)
    VADD       ``n + 12``
    VCLAMP     ``n + 12``
    VPOOL      ``n * window + 12``
    VCMP       words read ``+ 12`` (1 word without ``reduce``)
    VARGMAX    ``ceil(n / W) + 12``; with ``column`` ``n + 12``
    VCFG       0
    =========  =========================================================

    With fewer vector lanes than lanes in a word (P = ``config.vector_passes`` > 1), a
    REQUANT row, a VADD word and the last word of a VPOOL average's window issue at
    most one per P cycles (the lane multipliers take P cycles over each), and every
    vector result comes P - 1 cycles later: REQUANT ``R * P + 8`` (and the table),
    VADD ``n * P + 12``, VPOOL with ``average`` ``(n - 1) * max(window, P) + window +
    11 + P``, the others ``P - 1`` more than above. (The MAC array's and the vector
    unit's latencies are :mod:`fusetile.kernels.config`'s.) Built for area
    (``config.compact``: :class:`~fusetile.hdl.vector_compact.CompactVectorAlu`) the
    vector unit's scaled results come 5 cycles sooner and the requantiser's 2, and
    its unscaled ones do not wait for the scaling: REQUANT ``R * P + 6``, VADD and an
    average VPOOL 5 cycles fewer than above, VCLAMP ``n + 5``, a maximum VPOOL ``n *
    window + 5``, VCMP and VARGMAX words read ``+ 5``, whatever P.

    Each stalled read adds a cycle. Reads of ``a`` and ``b`` in the same bank in the
    same cycle make ``b`` stall, so a MATMUL or VADD whose two operands are always in
    the same bank takes two cycles per step (the compiler should put them in different
    banks, e.g. ``b_addr - a_addr`` odd with unit strides).

    Overlap: reads run up to 11 + P words ahead of writes, so an output may overwrite an
    input of the same operation only if that input has been read already: exactly in
    place (VADD, VCLAMP output = an input) is fine, as is any layout in which no input
    word is read after an output overwrote it; other overlaps give results that depend
    on timing (the model reads every input first).

    *Illegal commands* are the issuer's to refuse: in the tile the control unit's
    operand check (:mod:`fusetile.hdl.operands`, the one decoder of what is legal)
    faults them with ILLEGAL_MICRO before they issue. The unit does not decode them
    again (that decode, from the command register into the fault registers and
    ``running``, was the worst path of step 37's last ULX3S build: docs/fpga-timing.md, step
    38). Given one anyway, it neither hangs nor reaches outside its partition: an
    opcode that is not a compute operation, VPOOL with ``window`` 0, VARGMAX with ``n``
    0 and VCFG of a register other than the 8 of
    :class:`~fusetile.kernels.isa.VectorCfg` do nothing; VARGMAX's other illegal
    encodings (a ``lane`` beyond the word, a ``flag`` or ``expect`` without ``test``)
    run with their fields as they are, every access checked.

    *Faults.* In the tile the operand check also faults an access outside the
    partition before the instruction gets here, so this is a second line of defence
    that keeps the unit safe on its own. Built for area (:attr:`TileConfig.compact`),
    the unit leaves it out and never faults: in the tile no command it takes reaches
    outside its partition (the operand check refuses any that would, and the
    partition's entry refuses host writes while its kernel runs), and the scratchpad
    performs no access outside the partition, so given one anyway the unit still
    neither hangs nor reaches outside: its accesses there are not performed (a read
    there gives what the scratchpad answers; ``tests/checked_tile.py`` asserts that
    none is presented in the tile). On the iCEBreaker's build that is 280 logic cells
    (docs/fpga-timing.md, step 58). Its offsets are then as wide as the scratchpad's
    (step 63), so an offset past the scratchpad wraps around it: an access there may
    be performed at the wrapped offset, if that is inside the partition.

    * PARTITION: the first access (in program order: for each output its inputs, then
      the output) outside the partition; ``fault_addr`` = its offset (offsets past
      0xFFFF included), ``fault_part`` = ``part``. Outputs before it are written
      (MATMUL steps before it are in ACC), none after it; ACC_BIAS does not change
      ACC, a per-channel REQUANT whose table faults writes nothing, VCMP / VARGMAX
      write no register. The unit makes the scratchpad's partition test itself, as it
      sets a pointer (the offset against ``limit``, registered with it), and presents
      no access that it finds outside: nothing it decides waits for the scratchpad's
      ``fault``, which was in front of its pointers, its step counters and its fault
      registers (step 33 of docs/fpga-timing.md).

    ``fault`` stays high (``cmd.ready`` low) until ``abort``. ``abort`` drops the
    current command in that cycle (its scratchpad accesses of that cycle are cancelled
    by :attr:`Scratchpad.abort`, wired to the same signal, and so is a flag or index
    write; the MAC array is aborted too: ACC keeps the steps already added and the one
    being added), clears the fault and makes the unit idle; results still in the vector
    pipelines are discarded, so a command may be accepted the next cycle. A command
    accepted in the cycle of an ``abort`` is dropped with it, a VCFG too (``ready`` does
    not wait for ``abort``; in the tile the control unit issues a command whatever else
    faults in its cycle, and the abort a cycle later drops it).

    *Ports.* ``a``, ``b`` and ``w`` use partition ``part`` of the command, which must be
    open in the scratchpad, ``limit`` its, from the cycle the command is accepted until
    it completes (``fault`` is then never raised). ``a.we`` and ``b.we`` are 0,
    ``w.we`` is 1. ``a`` and ``b`` may stall (``b`` against ``a``, never ``a``
    against ``b``: that would starve a step whose two reads meet in one bank);
    ``rdata_parts`` is used only in the cycle after a performed read (``rdata`` not at
    all). ``w`` is expected never to stall; if
    it does, the operation restarts from the output that was not written (correct for
    every operation whose output does not overlap its inputs other than in place).

    Parameters
    ----------
    config : TileConfig
        ``rows`` x ``cols`` MAC array, ``word_bytes`` lanes per word.

    Attributes
    ----------
    cmd : In(stream.Signature(ComputeCommand))
        Commands, valid/ready.
    a, b : Out(SpadPortSignature(config))
        Operand reads: MATMUL and VADD read their ``a`` and ``b`` operands on ``a`` and
        ``b``; every other read (ACC_BIAS, the per-channel REQUANT table, VPOOL,
        VCLAMP, VCMP, VARGMAX) is made on ``a``.
    w : Out(SpadPortSignature(config))
        Result writes (REQUANT, VADD, VPOOL, VCLAMP).
    limit : In(17)
        :attr:`Scratchpad.limit`: the offsets inside the open partition.
    busy : Out(1)
        A command is in progress (see above).
    fault : Out(1)
        Sticky: the unit stopped on a fault. Cleared by ``abort``.
    fault_cause : Out(FaultCause)
        PARTITION while ``fault``; NONE otherwise.
    fault_addr : Out(32)
    fault_part : Out(4)
    abort : In(1)
        Drop the current command at once, clear the fault.
    flag_we : Out(1)
        One-cycle pulse: VCMP, or VARGMAX with ``test`` (in the cycle of ``index_we``),
        writes ``flag_value`` to flag register ``flag_sel``. This port and the five
        after it exist only on a tile with ``config.decisions``.
    flag_sel : Out(3)
    flag_value : Out(1)
    index_we : Out(1)
        One-cycle pulse: VARGMAX writes ``index_value`` to index register ``index_sel``.
    index_sel : Out(2)
    index_value : Out(16)
    vector_regs : Out(VectorRegs)
        The vector configuration registers (VCFG); reset values 0 except LO = -128,
        HI = 127. They persist across commands; ``abort`` does not change them.
    mac_busy : Out(1)
        Counter event: a MATMUL is in progress (``busy`` with MATMUL).
    vec_busy : Out(1)
        Counter event: ACC_BIAS, REQUANT or a vector operation is in progress.
    macs : Out(range(rows * cols + 1))
        Counter event: multiply-accumulates done this cycle.
    saturations : Out(range(word_bytes + 1))
        Counter event: lanes clamped in the result written this cycle (REQUANT lanes
        ``< cols``, VADD, VPOOL average).
    stalls : Out(1)
        Counter event: an access on ``a``, ``b`` or ``w`` was stalled this cycle.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    ValueError
        If ``config.rows`` or ``config.cols`` is larger than ``config.word_bytes``.
    """

    def __init__(self, config):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        for name in ("rows", "cols"):
            if getattr(config, name) > config.word_bytes:
                raise ValueError(f"config.{name} must be at most config.word_bytes "
                                 f"({config.word_bytes}), not {getattr(config, name)!r}")
        self._config = config
        super().__init__({
            "cmd":         In(stream.Signature(ComputeCommand)),
            "a":           Out(SpadPortSignature(config)),
            "b":           Out(SpadPortSignature(config)),
            "w":           Out(SpadPortSignature(config)),
            "limit":       In(17),
            "busy":        Out(1),
            "fault":       Out(1),
            "fault_cause": Out(FaultCause),
            "fault_addr":  Out(32),
            "fault_part":  Out(4),
            "abort":       In(1),
            **({
                "flag_we":     Out(1),
                "flag_sel":    Out(3),
                "flag_value":  Out(1),
                "index_we":    Out(1),
                "index_sel":   Out(2),
                "index_value": Out(16),
            } if config.decisions else {}),
            "vector_regs": Out(VectorRegs, init={"lo": -128, "hi": 127}),
            "mac_busy":    Out(1),
            "vec_busy":    Out(1),
            "macs":        Out(range(config.rows * config.cols + 1)),
            "saturations": Out(range(config.word_bytes + 1)),
            "stalls":      Out(1),
        })

    @property
    def config(self):
        return self._config

    @property
    def bias_words(self):
        """Words ACC_BIAS reads: ``ceil(4 * rows / word_bytes)``."""
        return -(-4 * self._config.rows // self._config.word_bytes)

    @property
    def table_words(self):
        """Words of a per-channel REQUANT table: ``ceil(8 * rows / word_bytes)``."""
        return -(-8 * self._config.rows // self._config.word_bytes)

    def elaborate(self, platform):
        cfg = self._config
        R, C, wb = cfg.rows, cfg.cols, cfg.word_bytes
        word_bits = cfg.word_bits
        m = Module()

        m.submodules.mac = mac = MacArray(cfg)
        m.submodules.alu = alu = vector_alu(cfg)
        regs = self.vector_regs

        # -- the command being executed ---------------------------------------------------
        args = Signal(MicroArgs)
        part = Signal(4)
        running = Signal()      # accepted, not finished, not faulted
        load = Signal()         # phase: reading words into `buf` (ACC_BIAS, REQUANT table)

        mm, vpool = args.matmul, args.vpool
        # VPOOL averages only where it is built (`TileConfig.pool_average`).
        average = vpool.average if cfg.pool_average else Const(0)
        vclamp, vcmp, vargmax, requant = args.vclamp, args.vcmp, args.vargmax, args.requant

        # -- issue stage --------------------------------------------------------------
        idx = Signal(16)        # step (MATMUL), word, output (VPOOL) or row (REQUANT)
        # ... and its row bits again, for REQUANT's reads: the MAC array's row and the
        # table's entry, a copy for each (`hdl/copies.py`). From `idx`, shared with the
        # issue stage, the wire to the first LUT of the two selections was 4.7 ns of
        # 36f2362's routed ULX3S build (10.90 ns into `rq_mult`, step 51). Only the
        # rows phase reads them, where `idx` is below `rows`.
        row_bits = max(1, (R - 1).bit_length())
        mac_row = copy(Signal(row_bits, name="mac_row"))
        table_row = copy(Signal(row_bits, name="table_row"))

        total = Signal(16)      # steps of the current phase
        more = copy(Signal(name="more"))    # idx != total: kept in a register, set
                                            # with idx, so that the ports' enables do
                                            # not wait for a comparison
        # ... and again for the operand ports' enables alone (`hdl/copies.py`): `more`
        # also starts the issue stage's decisions, and from there its wire to the
        # ports was the first 1.35 ns of 9f60a10's routed path into a scratchpad bank's
        # read address, through the ports' enables and the bank's choice of port
        # (10.31 ns, docs/fpga-timing.md step 52).
        port_more = copy(Signal(name="port_more"))

        def set_idx(value, more_value):
            """Set the step to ``value``; ``more_value``: whether it is below ``total``."""
            return [idx.eq(value), mac_row.eq(value), table_row.eq(value),
                    more.eq(more_value), port_more.eq(more_value)]
        win_t = Signal(4)       # VPOOL: word of the window
        # ... and its last, `window - 1`, set when the command is accepted: worked out
        # from the operands in every cycle, it was in front of the window's end, the
        # pointers' step and the partition test (`scripts/timing_paths.py`'s worst
        # paths at 4fd65f9, into ptr_a and a_out; docs/fpga-timing.md, step 44).
        win_last = Signal(4)
        # Each operand port reads at a running pointer, the offset of the step's word,
        # stepped as the step advances by a stride chosen when the command is accepted
        # (MATMUL's strides, VPOOL's stride within a window, else 1): the offset on
        # the port is a register, with no adder or selection between it and the
        # scratchpad's arbitration. Built for area, the pointers (and every offset
        # and stride register below that one is set from) are only as wide as a
        # scratchpad offset: the operand check has found every word the command uses
        # inside the partition, and arithmetic modulo 2**n is exact below it (on the
        # iCEBreaker's core, 157 LUT4, 49 carry cells and 72 flip-flops with the
        # hierarchy kept, 55 logic cells in the flat build; docs/fpga-timing.md, step
        # 63).
        addr_bits = max(1, (cfg.spad_words - 1).bit_length()) if cfg.compact else _ADDR_BITS
        stride_bits = min(16, addr_bits)
        ptr_a = Signal(addr_bits)
        ptr_b = Signal(addr_bits)
        step_a = Signal(stride_bits)
        step_b = Signal(stride_bits)
        # Where a unit-stride stream restarts (after a stalled write, and REQUANT's
        # rows after its table): its word for the first output not yet written, the
        # stream's start plus `w_count`, kept in step with `w_count` rather than added
        # at the restart (the adder and the partition test after it, into `a_out`,
        # were 10.03 ns of e0f2cb7's routed paths; docs/fpga-timing.md step 42).
        base_a = Signal(addr_bits)
        base_b = Signal(addr_bits)
        row_addr = Signal(addr_bits)   # VPOOL: word (o, 0)
        # The room a step leaves in the partition, `limit - step`, set with the step
        # when the command is accepted (the limit holds still under a command): a
        # pointer that steps is outside exactly when the old pointer is at or past it,
        # so the partition test of a step is a comparison beside the pointer's adder,
        # not after it (`ptr_a + step_a` through the test into `a_out` was the worst
        # path of step 37's best ULX3S build, 11.09 ns). `room_row` is VPOOL's, for
        # the step from one output's window to the next (`in_step`). Built for area,
        # the rooms are not read (step(), below), and not built.
        room_a = Signal(signed(_ADDR_BITS + 1))
        room_b = Signal(signed(_ADDR_BITS + 1))
        room_row = Signal(signed(_ADDR_BITS + 1))
        a_out = Signal()        # ptr_a is outside the partition (and so on): see point()
        b_out = Signal()
        a_have = Signal()       # this step's `a` word was read (held in hold_a)
        b_have = Signal()
        cap_a = Signal()        # a read performed last cycle goes to the hold register
        cap_b = Signal()
        cap_a_1 = Signal()      # ... from the read stage's registers, in this cycle
        cap_b_1 = Signal()
        hold_a = Signal(word_bits, reset_less=True)     # datapath: no reset
        hold_b = Signal(word_bits, reset_less=True)
        rfault = Signal()       # a read faulted: issue stopped, pipeline draining
        rfault_addr = Signal(_ADDR_BITS)

        # -- read stage (the scratchpad answers; its words are registered), then the
        # data stage: the step that issued, one and two cycles later ---------------------
        r_step = Signal(_Step, name="r_step")
        d_step = Signal(_Step, name="d_step")

        # -- write stage ------------------------------------------------------------
        w_addr = Signal(addr_bits)
        w_out = Signal()
        w_stride = Signal(stride_bits)
        room_w = Signal(signed(_ADDR_BITS + 1))     # limit - w_stride: see step()
        w_count = Signal(16)    # outputs written: where a restart resumes
        w_row = Signal(addr_bits)    # VPOOL: input word (o, 0) of the next output

        n_buf = max(self.bias_words, self.table_words)
        buf = Signal(n_buf * word_bits, reset_less=True)

        squash = Signal()       # drop every step in flight (abort, fault, restart)

        def point(ptr, out, value):
            """Set ``ptr`` to ``value`` and ``out`` to its partition test. Built for
            area, the unit makes no partition test (``out`` stays 0): see *Faults*."""
            if cfg.compact:
                return [ptr.eq(Value.cast(value)[:len(ptr)])]
            return spad_point(ptr, out, value, self.limit)

        def step(ptr, out, start, stride, room):
            """Set ``ptr`` to ``start + stride`` and ``out`` to its partition test, made
            against ``room`` (``limit - stride``) from ``start`` (a carry chain, as in
            point()). Built for area, no test, as in point(): the rooms, and their
            subtractions, are not built either."""
            if cfg.compact:
                return [ptr.eq((start + stride)[:len(ptr)])]
            return [ptr.eq((start + stride)[:len(ptr)]), out.eq(at_least(start, room))]

        # The opcode, decoded as the command is accepted (below): one flip-flop per
        # operation, so that the issue and data stages start from registers rather
        # than from a six-bit comparison.
        # An operation the tile does not build (`TileConfig.decisions`, `word_ops`) is
        # never one.
        absent = ((() if cfg.decisions else (MicroOp.VCMP, MicroOp.VARGMAX)) +
                  (() if cfg.word_ops else (MicroOp.VADD, MicroOp.VPOOL, MicroOp.VCLAMP)))
        decoded = {o: Signal(name=f"is_{o.name.lower()}") for o in MicroOp
                   if o not in (MicroOp.NOP, MicroOp.RET, MicroOp.DMA_LOAD,
                                MicroOp.DMA_STORE, MicroOp.WAIT, *absent)}
        is_op = {**decoded, **{o: Const(0) for o in absent}}
        vec_op = Signal(VectorOp)
        # Which operand words a step reads, likewise registers: REQUANT's rows phase
        # (after its table, if any) reads none, every other step an `a` word, and
        # MATMUL's and VADD's a `b` word too. Worked out from `load` and the opcode,
        # they were a LUT in front of the ports' requests, which go through the
        # scratchpad's arbitration into the DMA engine's decisions.
        rows_phase = Signal()
        reads_b = Signal()
        # Whether a result writes a flag, and which (see `written`, below).
        writes_flag = Signal()
        flag_sel = Signal(3)

        issuing = Signal()
        m.d.comb += issuing.eq(running & ~rfault & more)
        wait_pass = Signal()    # a scaled step waits for the multipliers' passes (below)
        issue_now = issuing & ~wait_pass

        need_a = ~rows_phase
        need_b = reads_b
        want_a = issue_now & need_a & ~a_have
        want_b = issue_now & need_b & ~b_have
        # The ports' enables are `want_a` and `want_b` less the partition test, with
        # `port_more` for `more` (the same value).
        port_issue = running & ~rfault & port_more & ~wait_pass
        for port, need, have, off, out in ((self.a, need_a, a_have, ptr_a, a_out),
                                           (self.b, need_b, b_have, ptr_b, b_out)):
            m.d.comb += [
                port.part.eq(part),
                port.offset.eq(off[:16]),
                port.en.eq(port_issue & need & ~have & ~out),
                port.we.eq(0),
            ]
        a_done = Signal()
        b_done = Signal()
        a_bad = Signal()
        b_bad = Signal()
        a_performed = self.a.en & ~self.a.stall
        b_performed = self.b.en & ~self.b.stall
        m.d.comb += [
            a_bad.eq(want_a & a_out),
            b_bad.eq(want_b & b_out),
            a_done.eq(~need_a | a_have | a_performed),
            b_done.eq(~need_b | b_have | b_performed),
        ]
        advance = Signal()
        m.d.comb += advance.eq(issue_now & a_done & b_done & ~a_bad & ~b_bad)

        vpool_last_t = win_t == win_last
        first = Signal()
        last = Signal()
        with m.If(is_op[MicroOp.VPOOL]):
            m.d.comb += [first.eq(win_t == 0), last.eq(vpool_last_t)]
        with m.Elif(is_op[MicroOp.MATMUL]):
            m.d.comb += first.eq((idx == 0) & ~mm.accumulate)
        with m.Else():
            m.d.comb += [first.eq(idx == 0), last.eq(idx == total - 1)]

        # With fewer vector lanes than a word has, a row or a scaled word keeps the lane
        # multipliers for `passes` cycles: the next one issues no sooner.
        passes = cfg.vector_passes
        if passes > 1:
            pace = Signal(range(passes))
            scaled_step = rows_phase | is_op[MicroOp.VADD] | \
                (is_op[MicroOp.VPOOL] & average & last)
            m.d.comb += wait_pass.eq(scaled_step & (pace != 0))
            with m.If(advance & scaled_step):
                m.d.sync += pace.eq(passes - 1)
            with m.Elif(pace != 0):
                m.d.sync += pace.eq(pace - 1)

        # ACC row readout for REQUANT: registered, so it arrives with the read stage
        # (a row reads no scratchpad word, so it goes to the requantiser from there).
        # Built for area with more than one pass, the vector unit reads a row where it
        # comes, in each of its passes (`CompactVectorAlu`): the readout and the
        # table's entry stay on the row issued, `passing_row`, while they go on (idx
        # is the next row's from the issue).
        read_row, entry_row = mac_row, table_row
        if passes > 1 and cfg.compact:
            passing_row = Signal(row_bits)
            with m.If(advance):
                m.d.sync += passing_row.eq(idx)
            read_row = Mux(pace != 0, passing_row, mac_row)
            entry_row = Mux(pace != 0, passing_row, table_row)
        m.d.comb += mac.row.eq(read_row)

        m.d.sync += [
            cap_a.eq(a_performed & ~advance),
            cap_b.eq(b_performed & ~advance),
            r_step.valid.eq(advance),
            r_step.hold_a.eq(a_have),
            r_step.hold_b.eq(b_have),
            r_step.first.eq(first),
            r_step.last.eq(last),
            r_step.idx.eq(idx),
            d_step.eq(r_step),
        ]

        with m.If(advance):
            m.d.sync += [a_have.eq(0), b_have.eq(0)]
            with m.If(is_op[MicroOp.VPOOL]):
                with m.If(vpool_last_t):
                    m.d.sync += [
                        win_t.eq(0),
                        *set_idx(idx + 1, idx + 1 != total),
                        row_addr.eq(row_addr + vpool.in_step),
                        *step(ptr_a, a_out, row_addr, vpool.in_step, room_row),
                    ]
                with m.Else():
                    m.d.sync += [
                        win_t.eq(win_t + 1),
                        *step(ptr_a, a_out, ptr_a, step_a, room_a),
                    ]
            with m.Else():
                m.d.sync += [
                    *set_idx(idx + 1, idx + 1 != total),
                    *step(ptr_a, a_out, ptr_a, step_a, room_a),
                    *step(ptr_b, b_out, ptr_b, step_b, room_b),
                ]
        with m.Elif(issuing):
            m.d.sync += [
                a_have.eq(a_have | a_performed),
                b_have.eq(b_have | b_performed),
            ]
            with m.If(a_bad | b_bad):
                m.d.sync += [
                    rfault.eq(1),
                    rfault_addr.eq(Mux(a_bad, ptr_a, ptr_b)),
                    a_have.eq(0),
                    b_have.eq(0),
                ]

        # -- read and data stages -----------------------------------------------------
        # The words the scratchpad answers are registered before anything uses them: a
        # block RAM's clock-to-output is half of a 100 MHz cycle, and its words fan
        # out to the MAC array's operands, the vector unit and the operand buffer. They
        # are registered in the scratchpad's parts (`rdata_parts`: one LUT from the
        # block RAMs) and put together after the registers, in the data stage's
        # choice below (10.26 to 10.34 ns with the bank selection's two LUTs in front
        # of the registers, c475267's ULX3S build: docs/fpga-timing.md, step 39). A held word
        # stays in its hold register until the data stage has used it (the next
        # step's read is captured three cycles after it issues, at the earliest).
        if cfg.compact:
            # Built for area, a port's registers take a word only in the cycle after a
            # read it performed, and so keep the last word it read: that is the
            # held word. A step whose word waits (for the other port's) reads no other
            # on its port before it issues, and the next step's first read is
            # registered three cycles after this one issues, a cycle after its data
            # stage. No hold registers, and no choice (a copy of every word took a
            # logic cell per bit of the UP5K, loaded from another register).
            words = []
            for port, performed, name in ((self.a, a_performed, "rdata_a"),
                                          (self.b, b_performed, "rdata_b")):
                answered = Signal(name=f"{name}_answered")
                m.d.sync += answered.eq(performed)
                words.append(registered_word(m, port, name, load=answered))
            word_a, word_b = words
        else:
            rdata_a = registered_word(m, self.a, "rdata_a")
            rdata_b = registered_word(m, self.b, "rdata_b")
            # The hold registers take their word from there, a cycle after it came:
            # the step that holds it issues the cycle after the read at the earliest,
            # so its data stage is two cycles after that.
            m.d.sync += [cap_a_1.eq(cap_a), cap_b_1.eq(cap_b)]
            with m.If(cap_a_1):
                m.d.sync += hold_a.eq(rdata_a)
            with m.If(cap_b_1):
                m.d.sync += hold_b.eq(rdata_b)
            # Which of the two is the data stage's word: `d_step.hold_a` (`hold_b`),
            # in a copy per byte lane. One flip-flop choosing all of a word's bits,
            # for the MAC array and the vector unit, was 2 to 2.6 ns of wire at the
            # start of the vector unit's comparisons (step 37's ULX3S builds,
            # docs/fpga-timing.md step 38).
            word_a = Signal(word_bits)
            word_b = Signal(word_bits)
            for word, held, rdata, name in ((word_a, hold_a, rdata_a, "hold_a"),
                                            (word_b, hold_b, rdata_b, "hold_b")):
                for j in range(wb):
                    choose_held = copy(Signal(name=f"d_{name}_{j}"))
                    m.d.sync += choose_held.eq(getattr(r_step, name))
                    lane = slice(8 * j, 8 * (j + 1))
                    m.d.comb += word[lane].eq(Mux(choose_held, held[lane], rdata[lane]))

        # MAC array.
        m.d.comb += [
            mac.step.valid.eq(d_step.valid & is_op[MicroOp.MATMUL]),
            mac.step.payload.a.eq(word_a),
            mac.step.payload.b.eq(word_b),
            mac.step.payload.first.eq(d_step.first),
            mac.bias_value.eq(buf[:32 * R]),
            mac.abort.eq(self.abort),
        ]

        # Operand buffer (ACC_BIAS: the bias; REQUANT: the per-channel table). Its
        # steps are its words, so built for area the choice reads only the bits of
        # `idx` a word's number has, and the read and data stages carry no more.
        loaded_word = d_step.idx[:max(1, (n_buf - 1).bit_length())] if cfg.compact else d_step.idx
        with m.If(d_step.valid & load):
            with m.Switch(loaded_word):
                for j in range(n_buf):
                    with m.Case(j):
                        m.d.sync += buf[j * word_bits:(j + 1) * word_bits].eq(word_a)

        # Requantiser (the vector ALU's rows): one ACC row per step, from the read
        # stage. A command is drained before the next starts, so REQUANT holds the
        # lane multipliers alone.
        # A row's multiplier and shift are registers, read out with its ACC row from
        # the step's `idx`: the vector unit takes a row straight into its multipliers'
        # operand registers.
        table = Array(buf[64 * i:64 * i + 64] for i in range(R))
        entry = table[entry_row]
        rq_mult = Signal(32)
        rq_shift = Signal(5)
        m.d.sync += [
            rq_mult.eq(Mux(requant.per_channel, entry[:32], regs.mult_a)),
            rq_shift.eq(Mux(requant.per_channel, entry[32:37], regs.shift)),
        ]
        rq_in = alu.rq.payload
        m.d.comb += [
            alu.requant.eq(is_op[MicroOp.REQUANT]),
            alu.rq.valid.eq(r_step.valid & rows_phase),
            rq_in.acc.as_value().eq(mac.acc_row.as_value()),   # lanes >= cols: 0
            rq_in.mult.eq(rq_mult),
            rq_in.shift.eq(rq_shift),
            rq_in.zp.eq(regs.zp_out),
            rq_in.lo.eq(regs.lo),
            rq_in.hi.eq(regs.hi),
        ]
        rq_pipe, rq_out = _shift_reg(m, "rq_pipe", alu.requant_latency,
                                     r_step.valid & rows_phase, squash)

        # Vector ALU.
        vector = (is_op[MicroOp.VADD] | is_op[MicroOp.VPOOL] | is_op[MicroOp.VCLAMP] |
                  is_op[MicroOp.VCMP] | is_op[MicroOp.VARGMAX])
        writes_word = is_op[MicroOp.VADD] | is_op[MicroOp.VCLAMP]
        alu_in = alu.i.payload
        m.d.comb += [
            alu.i.valid.eq(d_step.valid & vector),
            alu_in.op.eq(vec_op),
            alu_in.a.as_value().eq(word_a),
            alu_in.b.as_value().eq(word_b),
            alu_in.first.eq(d_step.first),
            alu_in.last.eq(d_step.last),
            alu_in.average.eq(average),
            alu_in.pairs.eq(vpool.pairs),
            alu_in.reduce.eq(vcmp.reduce),
            alu_in.column.eq(vargmax.column),
            alu_in.lane.eq(Mux(is_op[MicroOp.VCMP], vcmp.lane,
                               Mux(vargmax.column, vargmax.lane,
                                   vargmax.n - 1))[:len(alu_in.lane)]),
            alu_in.cmp.eq(vcmp.op),
            alu_in.imm.eq(vcmp.imm),
            alu_in.expect.eq(vargmax.expect),
            alu_in.lo.eq(vclamp.lo),
            alu_in.hi.eq(vclamp.hi),
            alu.regs.eq(regs),
        ]
        # A compact vector unit's unscaled results come sooner than its scaled ones:
        # which the command's are.
        scaled = is_op[MicroOp.VADD] | (is_op[MicroOp.VPOOL] & average)
        alu_pipe, alu_out = _result_pipe(m, "alu_pipe", alu,
                                         d_step.valid & vector & (writes_word | d_step.last),
                                         scaled, squash)
        # The steps whose result is a word to write (VADD's and VCLAMP's every step,
        # VPOOL's last of a window), in a pipe of their own beside `alu_pipe`. The ALU's
        # and the requantiser's `valid` come in the same cycles as these pipes' bits
        # (the same latency, from the same steps) but are not cleared by `squash`, so
        # they add nothing to a pipe's last bit. With them and the choice by operation,
        # the write port's request had eleven inputs, on the way through the
        # scratchpad's arbitration into the DMA engine's decisions
        # (`scripts/timing_paths.py --deepest`, docs/fpga-timing.md step 46); it has
        # four. One command runs at a time, so only its own pipe has bits.
        _, word_out = _result_pipe(m, "word_pipe", alu,
                                   d_step.valid & (writes_word |
                                                   (is_op[MicroOp.VPOOL] & d_step.last)),
                                   scaled, squash)

        # -- write stage ----------------------------------------------------------------
        result = Signal()       # a result word is due this cycle
        wdata = Signal(word_bits)
        sat = Signal(range(wb + 1))
        rq_value = alu.rq_o.payload.value.as_value()
        rq_sat = alu.rq_o.payload.saturated
        m.d.comb += result.eq(rq_out | word_out)
        with m.If(rows_phase):
            m.d.comb += [
                wdata.eq(rq_value[:8 * C]),             # lanes >= cols are 0
                sat.eq(sum(rq_sat[j] for j in range(C))),
            ]
        with m.Else():
            m.d.comb += [
                wdata.eq(alu.o.payload.word.as_value()),
                sat.eq(alu.o.payload.sat_count),
            ]
        m.d.comb += [
            self.w.part.eq(part),
            self.w.offset.eq(w_addr[:16]),
            self.w.en.eq(result & running & ~w_out),
            self.w.we.eq(1),
            self.w.wdata.eq(wdata),
        ]
        w_bad = Signal()
        w_done = Signal()
        w_stalled = Signal()
        m.d.comb += [
            w_bad.eq(result & running & w_out),
            w_done.eq(self.w.en & ~self.w.stall),
            w_stalled.eq(self.w.en & self.w.stall),
            self.saturations.eq(Mux(w_done, sat, 0)),
        ]
        with m.If(w_done):
            m.d.sync += [
                *step(w_addr, w_out, w_addr, w_stride, room_w),
                w_count.eq(w_count + 1),
                w_row.eq(w_row + vpool.in_step),
                base_a.eq(base_a + 1),
                base_b.eq(base_b + 1),
            ]

        # Flag and index registers: a VARGMAX with `test` writes both in one cycle.
        # An abort cancels them as the scratchpad cancels the cycle's accesses. Whether
        # a result writes a flag, and which, are registers set as the command is
        # accepted (`writes_flag`, `flag_sel`), and the ALU's `valid` comes with
        # `alu_out` (see `word_pipe`): the flag write goes to the control unit's
        # speculation guard, the miss decision and all that a miss abandons, the routed
        # worst path of step 46's ULX3S build (docs/fpga-timing.md).
        if cfg.decisions:
            written = running & alu_out & ~self.abort
            m.d.comb += [
                self.flag_we.eq(written & writes_flag),
                self.flag_sel.eq(flag_sel),
                self.flag_value.eq(alu.o.payload.flag),
                self.index_we.eq(written & is_op[MicroOp.VARGMAX]),
                self.index_sel.eq(vargmax.index),
                self.index_value.eq(alu.o.payload.index),
            ]

        # -- completion -----------------------------------------------------------------
        drained = Signal()
        m.d.comb += drained.eq(running & ~issuing & ~r_step.valid & ~d_step.valid &
                               ~rq_pipe.any() & ~alu_pipe.any() & ~mac.busy)
        last_phase = ~(load & is_op[MicroOp.REQUANT])
        finishing = Signal()    # the last cycle of a command that completes normally
        m.d.comb += [
            finishing.eq(drained & last_phase & ~rfault),
            # On a fault, `busy` falls in the cycle `fault` rises.
            self.busy.eq(running & ~finishing),
            self.mac_busy.eq(self.busy & is_op[MicroOp.MATMUL]),
            self.vec_busy.eq(self.busy & ~is_op[MicroOp.MATMUL]),
            self.macs.eq(mac.macs),
            self.stalls.eq((self.a.en & self.a.stall) | (self.b.en & self.b.stall) |
                           w_stalled),
        ]
        # ACC_BIAS loads the bias when its words are in and the MAC array is idle:
        # `drained` less the vector unit's pipes, which a command starts only once the
        # one before has drained, and which ACC_BIAS puts nothing in. (`drained`'s wide
        # ORs of the pipes' bits, in front of the bias's fan-out to every accumulator's
        # load, were 10.9 to 11.0 ns of 6fd2928's ULX3S build: docs/fpga-timing.md,
        # step 47.)
        m.d.comb += mac.bias_valid.eq(running & ~rfault & ~more & ~r_step.valid &
                                      ~d_step.valid & ~mac.busy & load &
                                      is_op[MicroOp.ACC_BIAS])

        # `fault` is read by the control unit's fault decision alone; the unit's own
        # acceptance reads a copy (`stopped`). With both on one register, it sat between
        # the two units: 1.7 ns of wire to the decision's first LUT, on 9f60a10's
        # routed paths into the control unit's `state` (10.10 ns, docs/fpga-timing.md
        # step 52).
        stopped = copy(Signal(name="stopped"))
        copy(self.fault)

        def stop(cause, addr, part_):
            m.d.sync += [
                running.eq(0),
                self.fault.eq(1),
                stopped.eq(1),
                self.fault_cause.eq(cause),
                self.fault_addr.eq(addr),
                self.fault_part.eq(part_),
            ]

        with m.If(w_bad):
            m.d.comb += squash.eq(1)
            stop(FaultCause.PARTITION, w_addr, part)
        with m.Elif(w_stalled):
            # Restart from the output that was not written. Its inputs were read
            # (it has a result), so they are inside the partition: the pointers go
            # back to them untested.
            m.d.comb += squash.eq(1)
            m.d.sync += [
                *set_idx(w_count, w_count != total),
                ptr_a.eq(Mux(is_op[MicroOp.VPOOL], w_row, base_a)),
                ptr_b.eq(base_b),
                a_out.eq(0),
                b_out.eq(0),
                win_t.eq(0),
                row_addr.eq(w_row),
                rfault.eq(0),
            ]
        with m.Elif(drained):
            with m.If(rfault):
                stop(FaultCause.PARTITION, rfault_addr, part)
            with m.Elif(load & is_op[MicroOp.REQUANT]):
                # (The rows read no word: the pointers stay where the table left them.)
                m.d.sync += [load.eq(0), rows_phase.eq(1), *set_idx(0, 1),
                             total.eq(R)]
            with m.Else():
                m.d.sync += [running.eq(0), load.eq(0)]

        # -- acceptance -----------------------------------------------------------------
        # The next command may be accepted once `running` has fallen, the cycle after
        # `busy` did: acceptance then starts at registers (`busy` is the completion
        # logic; in the tile the control unit issues a command only when it has seen
        # the unit idle, later still).
        m.d.comb += self.cmd.ready.eq(~running & ~stopped)
        p = self.cmd.payload
        pa = p.args

        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [sig.eq(p.op == o) for o, sig in decoded.items()]
            m.d.sync += vec_op.eq(0)
            for o, v in ((MicroOp.VADD, VectorOp.VADD), (MicroOp.VPOOL, VectorOp.VPOOL),
                         (MicroOp.VCLAMP, VectorOp.VCLAMP), (MicroOp.VCMP, VectorOp.VCMP),
                         (MicroOp.VARGMAX, VectorOp.VARGMAX)):
                if o in absent:
                    continue
                with m.If(p.op == o):
                    m.d.sync += vec_op.eq(v)
            m.d.sync += [
                args.eq(pa),
                part.eq(p.part),
                *set_idx(0, 1),     # every command that runs has a step
                win_t.eq(0),
                load.eq(0),
                rows_phase.eq(0),
                reads_b.eq((p.op == MicroOp.MATMUL) | (p.op == MicroOp.VADD)),
                *([writes_flag.eq((p.op == MicroOp.VCMP) |
                                  ((p.op == MicroOp.VARGMAX) & pa.vargmax.test)),
                   flag_sel.eq(Mux(p.op == MicroOp.VARGMAX, pa.vargmax.flag, pa.vcmp.flag))]
                  if cfg.decisions else []),
                rfault.eq(0),
                w_count.eq(0),
                w_stride.eq(1),
                room_w.eq(self.limit - 1),
                step_a.eq(1),
                step_b.eq(1),
                room_a.eq(self.limit - 1),
                room_b.eq(self.limit - 1),
                *point(ptr_a, a_out, p.a_first),
                *point(ptr_b, b_out, p.b_first),
                *point(w_addr, w_out, p.w_first),
                base_a.eq(p.a_first),
                base_b.eq(p.b_first),
                row_addr.eq(p.a_first),
                w_row.eq(p.a_first),
            ]
            with m.Switch(p.op):
                with m.Case(MicroOp.MATMUL):
                    m.d.sync += [
                        running.eq(pa.matmul.k != 0),
                        total.eq(pa.matmul.k),
                        step_a.eq(pa.matmul.a_stride),
                        step_b.eq(pa.matmul.b_stride),
                        room_a.eq(self.limit - pa.matmul.a_stride),
                        room_b.eq(self.limit - pa.matmul.b_stride),
                    ]
                with m.Case(MicroOp.ACC_BIAS):
                    m.d.sync += [
                        running.eq(1),
                        load.eq(1),
                        total.eq(self.bias_words),
                    ]
                with m.Case(MicroOp.REQUANT):
                    rqa = pa.requant
                    m.d.sync += [
                        running.eq(1),
                        load.eq(rqa.per_channel),
                        rows_phase.eq(~rqa.per_channel),
                        total.eq(Mux(rqa.per_channel, self.table_words, R)),
                        w_stride.eq(rqa.out_stride),
                        room_w.eq(self.limit - rqa.out_stride),
                    ]
                if cfg.word_ops:        # (else they do not run: they do nothing)
                    with m.Case(MicroOp.VADD):
                        m.d.sync += [
                            running.eq(pa.vadd.n != 0),
                            total.eq(pa.vadd.n),
                        ]
                    with m.Case(MicroOp.VPOOL):
                        runs = (pa.vpool.n != 0) & (pa.vpool.window != 0)
                        if not cfg.pool_average:
                            runs = runs & ~pa.vpool.average    # (not built: does nothing)
                        m.d.sync += [
                            running.eq(runs),
                            total.eq(pa.vpool.n),
                            win_last.eq(pa.vpool.window - 1),
                            step_a.eq(pa.vpool.in_stride),
                            room_a.eq(self.limit - pa.vpool.in_stride),
                            room_row.eq(self.limit - pa.vpool.in_step),
                        ]
                    with m.Case(MicroOp.VCLAMP):
                        m.d.sync += [
                            running.eq(pa.vclamp.n != 0),
                            total.eq(pa.vclamp.n),
                        ]
                if cfg.decisions:       # (else they do not run: they do nothing)
                    with m.Case(MicroOp.VCMP):
                        m.d.sync += [
                            running.eq(1),
                            total.eq(p.steps),
                        ]
                    with m.Case(MicroOp.VARGMAX):
                        va = pa.vargmax
                        m.d.sync += [
                            running.eq(va.n != 0),
                            total.eq(p.steps),
                        ]
                with m.Case(MicroOp.VCFG):
                    value = pa.vcfg.value
                    with m.Switch(pa.vcfg.reg):
                        for reg, field in ((VectorCfg.MULT_A, regs.mult_a),
                                           (VectorCfg.MULT_B, regs.mult_b),
                                           (VectorCfg.SHIFT, regs.shift),
                                           (VectorCfg.ZP_A, regs.zp_a),
                                           (VectorCfg.ZP_B, regs.zp_b),
                                           (VectorCfg.ZP_OUT, regs.zp_out),
                                           (VectorCfg.LO, regs.lo),
                                           (VectorCfg.HI, regs.hi)):
                            with m.Case(reg):
                                with m.If(~self.abort):
                                    m.d.sync += field.eq(value[:len(field)])

        # -- abort wins over everything -------------------------------------------------
        with m.If(self.abort):
            m.d.comb += squash.eq(1)
            m.d.sync += [
                running.eq(0),
                load.eq(0),
                self.fault.eq(0),
                stopped.eq(0),
                self.fault_cause.eq(FaultCause.NONE),
            ]
        with m.If(squash):
            m.d.sync += [
                r_step.valid.eq(0),
                d_step.valid.eq(0),
                a_have.eq(0),
                b_have.eq(0),
            ]
        # Nothing of an aborted command reaches the scratchpad in the abort cycle: the
        # scratchpad cancels the cycle's accesses at its banks (`Scratchpad.abort`,
        # the same signal), so the ports here do not wait for `abort`. Nor does a flag
        # or index write land (above): in the tile `abort` is the control unit's
        # register, set the cycle after the fault or miss that decides it (a flag
        # that fails a speculation guard lands in the miss's cycle).
        return m
