"""The MAC array: R x C int8 multipliers feeding R x C int32 accumulators (ACC).

A MATMUL step multiplies lane ``i`` of an operand word ``a`` by lane ``j`` of an
operand word ``b`` into ``ACC[i][j]`` for every ``i < R, j < C``; the array takes one
step per cycle and never stalls. Each step goes through three register stages:

1. *operand*: the step's ``a``, ``b`` and ``first`` are registered as they are
   accepted (in the fabric, one register per lane: below);
2. *product*: every ``a[i] * b[j]`` (int8 x int8 -> int16) is registered (a
   :class:`~fusetile.hdl.multiplier.Multiplier`: on an ECP5, one MULT18X18D per MAC
   with its output register);
3. *accumulate*: ``ACC[i][j]`` becomes ``(first ? 0 : ACC[i][j]) + product``, wrapping
   at 32 bits.

Nothing but a register sits between a multiplier and its neighbours, so each stage is
one DSP multiply or one 32-bit carry chain (plus the bias / hold multiplexer). The
operand registers stay in the fabric, one per lane for a row or a column of
multipliers: as the DSP blocks' input registers a lane would be a copy in each
block of its row or column, spread over the device, and the scratchpad's read data
(13 ns into the cycle already on the ULX3S, ``docs/fpga.md``) would have to reach
all of them.

Built for an iCE40 the stages are arranged for its SB_MAC16, whose 32-bit accumulator
Yosys infers, register included, when nothing but a multiplexer sits in front of its
adder: stage 2 registers the operands again (the DSP's input registers; an operand
row with no step in it is zero) instead of the product, and stage 3 is ``ACC[i][j] =
(load ? init[i] : ACC[i][j]) + a[i] * b[j]`` in the DSP, the bias being loaded as
``init`` with a zero product. Same cycles, same results; the accumulators and their
adders leave the fabric (``docs/fpga-timing.md``, step 22). ACC is then not cleared by reset
(Yosys puts no register with both a reset and an enable into the DSP block): it holds
whatever it held until ACC_BIAS or a MATMUL's first step sets it.
"""

from amaranth.hdl import Module, Signal, Mux, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.vendor import SiliconBluePlatform

from ..kernels.config import TileConfig, MAC_LATENCY
from .copies import copy
from .multiplier import Multiplier


__all__ = ["MacStepLayout", "MacArray"]


def _check_config(config):
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")
    for name in ("rows", "cols"):
        if getattr(config, name) > config.word_bytes:
            raise ValueError(f"config.{name} must be at most config.word_bytes "
                             f"({config.word_bytes}), not {getattr(config, name)!r}")


class MacStepLayout(data.StructLayout):
    """One MATMUL step: a pair of operand words and whether the step starts afresh.

    Parameters
    ----------
    config : TileConfig

    Members
    -------
    a, b : ArrayLayout(signed(8), word_bytes)
        The operand words as int8 lanes (lane ``n`` = byte ``n``, so a scratchpad
        word can be assigned as it is read). Lanes ``a[i]`` for ``i < rows`` and
        ``b[j]`` for ``j < cols`` are used.
    first : 1
        The step overwrites ACC instead of adding to it (step 0 of a MATMUL with
        ``accumulate`` = 0).

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    """

    def __init__(self, config):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        lanes = data.ArrayLayout(signed(8), config.word_bytes)
        super().__init__({"a": lanes, "b": lanes, "first": 1})


class MacArray(wiring.Component):
    """``rows`` x ``cols`` int8 MAC array with wrapping int32 accumulators.

    Timing (cycle ``t`` is the one in which ``step.valid & step.ready``):

    * steps are accepted back to back, one per cycle (``step.ready`` is 1 except
      during ``abort``);
    * a step is in ACC from cycle ``t + LATENCY`` (``LATENCY`` = 3), so ``k``
      consecutive steps accepted from cycle ``t`` are all in ACC in cycle
      ``t + k - 1 + LATENCY``;
    * ``busy`` is high in cycles ``t + 1`` and ``t + 2``: it is registered, so in the
      cycle a step is handed over it does not yet show that step. Once the last step
      has been handed over, the first cycle with ``busy`` low is the first in which
      ACC holds every step (that is where a sequencer may start reading rows or load
      a bias);
    * ``macs`` is ``rows * cols`` in cycle ``t + 2``, when the step is added.

    Parameters
    ----------
    config : TileConfig
        ``rows`` and ``cols`` (each at most ``word_bytes``) give the array size.
    dsp_accumulator : bool or None
        Arrange the stages for DSP blocks with an accumulator (the iCE40's SB_MAC16;
        above). ``None``: when built for an iCE40.

    Attributes
    ----------
    step : In(stream.Signature(MacStepLayout(config)))
        MATMUL steps, valid/ready.
    bias_valid : In(1)
        At the end of the next cycle, set ``ACC[i][j] = bias_value[i]`` for every
        ``i, j`` (ACC_BIAS); ``busy`` is high in that next cycle. Must only be asserted
        while ``busy`` is low (a step handed over in the same cycle is fine: it is
        added to the bias); with a step being added in that next cycle what ACC gets
        is undefined.
    bias_value : In(ArrayLayout(signed(32), rows))
        The bias per row, held from the cycle of ``bias_valid`` through the next (the
        fabric's accumulators take it in the first, the DSP blocks' in the second); as
        bits, the little-endian int32 array ACC_BIAS reads from the scratchpad.
    row : In(range(rows))
        Row of ACC to read out (``row >= rows``: ``acc_row`` reads 0).
    acc_row : Out(ArrayLayout(signed(32), cols))
        Registered readout: in cycle ``t + 1``, row ``row`` of ACC as it was in cycle
        ``t`` (one row per cycle, like a memory read port).
    busy : Out(1)
        Accepted steps are in the pipeline, not yet in ACC, or a bias is being loaded.
    macs : Out(range(rows * cols + 1))
        Multiply-accumulates done this cycle: ``rows * cols`` or 0.
    abort : In(1)
        Drop the steps not yet multiplied (the one in the operand stage this cycle;
        ``step`` is not ready). The step in the accumulate stage is still added, so a
        step accepted two or more cycles before the abort is in ACC.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig`.
    ValueError
        If ``config.rows`` or ``config.cols`` is larger than ``config.word_bytes``.
    """

    #: Cycles from accepting a step to the first cycle ACC includes it.
    LATENCY = MAC_LATENCY

    def __init__(self, config, *, dsp_accumulator=None):
        _check_config(config)
        if dsp_accumulator is not None and not isinstance(dsp_accumulator, bool):
            raise TypeError(f"dsp_accumulator must be a bool or None, not {dsp_accumulator!r}")
        self._config = config
        self.dsp_accumulator = dsp_accumulator
        rows, cols = config.rows, config.cols
        super().__init__({
            "step":       In(stream.Signature(MacStepLayout(config))),
            "bias_valid": In(1),
            "bias_value": In(data.ArrayLayout(signed(32), rows)),
            "row":        In(range(rows)),
            "acc_row":    Out(data.ArrayLayout(signed(32), cols)),
            "busy":       Out(1),
            "macs":       Out(range(rows * cols + 1)),
            "abort":      In(1),
        })

    @property
    def config(self):
        return self._config

    def elaborate(self, platform):
        cfg = self._config
        m = Module()

        in_dsp = self.dsp_accumulator
        if in_dsp is None:
            in_dsp = isinstance(platform, SiliconBluePlatform)

        m.d.comb += self.step.ready.eq(~self.abort)
        accepted = self.step.valid & self.step.ready

        # Datapath registers load every cycle, whatever the valid bits say: no clock
        # enables or resets on the wide registers, only on the valid bits. Built for
        # the fabric, a row of `a` is zero when no step is accepted, so the product is
        # zero whenever no step is in the product stage, which is whenever a bias
        # loads: no choice between the product and zero sits between a multiplier's
        # output and its accumulator's carry chain. (That choice, a LUT after 5 to 6 ns
        # of wire from the MULT18X18D, was in the MAC array's worst paths on
        # 6fd2928's ULX3S build, 10.3 to 10.4 ns: docs/fpga-timing.md, step 47.)
        op_valid = Signal()
        op_first = Signal()
        step_a = self.step.payload.a.as_value()[:8 * cfg.rows]
        step_b = self.step.payload.b.as_value()[:8 * cfg.cols]
        m.d.sync += [
            op_valid.eq(accepted),
            op_first.eq(self.step.payload.first),
        ]

        prod_valid = Signal()
        m.d.sync += prod_valid.eq(op_valid & ~self.abort)

        # The step in the accumulate stage lands even in an abort's cycle: the abort
        # would otherwise gate the enable of every accumulator.
        adding = Signal()
        m.d.comb += adding.eq(prod_valid)

        # ACC_BIAS loads a cycle after `bias_valid`, and the accumulators' enable is a
        # register of its own: each drives all rows x cols x 32 accumulator bits, and
        # `bias_valid`, which the compute unit works out in its cycle, into them was
        # 801 of the ULX3S build's late endpoints at 100 MHz (docs/fpga-timing.md, step 30).
        # Whether ACC starts afresh (a bias, or a step marked `first`) is a register of
        # its own too: with it, what goes into an accumulator's adder is one LUT deep.
        # The enable is built once per row (`copy`): one flip-flop fanned out to all
        # rows x cols x 32 bits spent 6.5 ns in wire alone (198c8e5's ULX3S build,
        # docs/fpga-timing.md step 38). The choices in front of the adders are built once per
        # accumulator: a row's copy, fanned out to its columns' 32 LUTs each, still
        # spent 6.2 to 6.5 ns in wire (e0f2cb7's build, docs/fpga-timing.md step 41).
        acc_en = [copy(Signal(name=f"acc_en_{i}")) for i in range(cfg.rows)]
        bias_load, acc_load = ([[copy(Signal(name=f"{name}_{i}_{j}")) for j in range(cfg.cols)]
                                for i in range(cfg.rows)]
                               for name in ("bias_load", "acc_load"))
        for i in range(cfg.rows):
            m.d.sync += acc_en[i].eq(self.bias_valid | op_valid & ~self.abort)
            for j in range(cfg.cols):
                m.d.sync += [bias_load[i][j].eq(self.bias_valid),
                             acc_load[i][j].eq(self.bias_valid | op_first)]

        acc = [[Signal(signed(32), name=f"acc_{i}_{j}", reset_less=in_dsp)
                for j in range(cfg.cols)] for i in range(cfg.rows)]
        if in_dsp:
            # The operands, then again with a row of `a` zero when no step is in it
            # (so that a bias loads with a zero product), and the accumulate in the
            # DSP block.
            op_a = Signal(data.ArrayLayout(signed(8), cfg.rows), reset_less=True)
            op_b = Signal(data.ArrayLayout(signed(8), cfg.cols), reset_less=True)
            dsp_a = Signal(data.ArrayLayout(signed(8), cfg.rows), reset_less=True)
            dsp_b = Signal(data.ArrayLayout(signed(8), cfg.cols), reset_less=True)
            if cfg.compact:
                # Built for area, a row of `a` is zero from the operand stage on when
                # no step is accepted, and the DSP's stage copies it as it is: a plain
                # register, which Yosys takes into the SB_MAC16 (its input register),
                # where the choice made it 16 flip-flops of the fabric, each a logic
                # cell of the UP5K alone. An aborted step's product is not added:
                # `acc_en` is low for it, and no bias loads then (`busy` is high).
                m.d.sync += [op_a.eq(Mux(accepted, step_a, 0)), op_b.eq(step_b),
                             dsp_a.eq(op_a), dsp_b.eq(op_b)]
            else:
                m.d.sync += [op_a.eq(step_a), op_b.eq(step_b)]
                m.d.sync += [
                    dsp_a.eq(Mux(op_valid & ~self.abort, op_a, 0)),
                    dsp_b.eq(op_b),
                ]
            for i in range(cfg.rows):
                for j in range(cfg.cols):
                    init = Mux(bias_load[i][j], self.bias_value[i], 0)
                    with m.If(acc_en[i]):
                        m.d.sync += acc[i][j].eq(Mux(acc_load[i][j], init, acc[i][j]) +
                                                 dsp_a[i] * dsp_b[j])
        else:
            for i in range(cfg.rows):
                for j in range(cfg.cols):
                    # The bias, a copy per accumulator taken in `bias_valid`'s cycle:
                    # read straight from the compute unit's buffer, it crossed the array
                    # into the adders' choices (6.8 ns of wire in a 9.92 ns path of
                    # 0059dff's ULX3S build, docs/fpga-timing.md step 50).
                    bias = copy(Signal(signed(32), name=f"bias_{i}_{j}", reset_less=True))
                    m.d.sync += bias.eq(self.bias_value[i])
                    init = Mux(bias_load[i][j], bias, 0)
                    # The operands, registered for this multiplier alone (copies): a
                    # row's register shared by its columns' DSP blocks, which the
                    # placer spreads over the device, was 10 ns of wire into a DSP's
                    # input (36f2362's ULX3S build, step 51).
                    op_a = copy(Signal(signed(8), name=f"op_a_{i}_{j}", reset_less=True))
                    op_b = copy(Signal(signed(8), name=f"op_b_{i}_{j}", reset_less=True))
                    m.d.sync += [op_a.eq(Mux(accepted, step_a.word_select(i, 8), 0)),
                                 op_b.eq(step_b.word_select(j, 8))]
                    # The product register: on an ECP5 the DSP block's own.
                    m.submodules[f"mul_{i}_{j}"] = mul = Multiplier(signed(8), signed(8),
                                                                    latency=1)
                    m.d.comb += [mul.a.eq(op_a), mul.b.eq(op_b)]
                    # A bias loads as `init` plus the product, zero then (above): the
                    # choice is in front of the adder, whose carry chain then ends in
                    # the accumulator's flip-flops (a multiplexer after it, and the
                    # route from there, made the MAC array's late endpoints on the
                    # ULX3S, docs/fpga-timing.md step 35). The sum is 33 bits wide; the
                    # assignment wraps it to 32.
                    with m.If(acc_en[i]):
                        m.d.sync += acc[i][j].eq(Mux(acc_load[i][j], init, acc[i][j]) + mul.p)

        with m.Switch(self.row):
            for i in range(cfg.rows):
                with m.Case(i):
                    m.d.sync += [self.acc_row[j].eq(acc[i][j]) for j in range(cfg.cols)]
            with m.Default():
                m.d.sync += self.acc_row.eq(0)

        m.d.comb += [
            self.busy.eq(op_valid | prod_valid | bias_load[0][0]),
            self.macs.eq(Mux(adding, cfg.rows * cfg.cols, 0)),
        ]
        return m
