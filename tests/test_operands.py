# amaranth: UnusedElaboratable=no

"""The operand check: its gateware against :mod:`fusetile.kernels.operands`."""

import random
from dataclasses import replace

import pytest
from amaranth.sim import Simulator

from fusetile.hdl.operands import OperandCheck
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import COMPUTE_OPS, MicroInstr, MicroOp
from fusetile.kernels.model import decode_micro
from fusetile.kernels.operands import MAX_OPERANDS, check_latency, illegal_operands, operand_ends
from fusetile.kernels.program import (acc_bias, matmul, requant, vadd, vargmax, vclamp, vcmp,
                                      vpool)


def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 8"):
        OperandCheck(8)


@pytest.mark.parametrize("instr, ends", [
    (matmul(a=3, b=100, k=5, a_stride=2, b_stride=0), [11, 100]),
    (matmul(a=3, b=4, k=0), []),
    (acc_bias(10), [13]),                       # 8 rows x 4 bytes = 4 words
    (requant(out=20, out_stride=3), [41]),
    (requant(out=20, out_stride=1, per_channel=True, params=7), [14, 27]),
    (vadd(a=1, b=2, out=3, n=4), [4, 5, 6]),
    (vpool(src=5, out=50, n=3, window=4, stride=2, step=10), [5 + 20 + 6, 52]),
    (vclamp(src=9, out=9, n=0, lo=0, hi=1), []),
    (vcmp(addr=4, lane=17, op="GE", imm=0, flag=0), [6]),
    (vargmax(addr=4, n=17, index=0), [6]),
    (vargmax(addr=4, n=17, index=0, lane=7), [20]),            # column: n words
    (vargmax(addr=4, n=1, index=0, lane=0, flag=3, expect=9), [4]),
])
def test_operand_ends(instr, ends):
    """The reference, on hand-computed cases of the default 8x8 configuration."""
    op, f = decode_micro(instr)
    assert not illegal_operands(op, f)
    assert operand_ends(op, f, TileConfig()) == ends


def test_vargmax_illegal_operands():
    """VARGMAX's lane must be below word_bytes with ``column`` and 0 without it; flag
    and expect must be 0 without ``test``."""
    def raw(**fields):
        return decode_micro(MicroInstr.const({"op": MicroOp.VARGMAX, "args": {
            "vargmax": {"n": 1, **fields}}}).as_bits())[1]

    four = TileConfig(rows=4, cols=4, word_bytes=4)
    assert not illegal_operands(MicroOp.VARGMAX, raw(column=1, lane=7))
    assert illegal_operands(MicroOp.VARGMAX, raw(column=1, lane=7), four)
    assert illegal_operands(MicroOp.VARGMAX, raw(column=1, lane=8))
    for bad in ({"lane": 1}, {"flag": 1}, {"expect": 1}, {"n": 0}):
        assert illegal_operands(MicroOp.VARGMAX, raw(**bad)), bad
    assert not illegal_operands(MicroOp.VARGMAX, raw(test=1, flag=7, expect=4095))


def test_instructions_not_built_are_illegal():
    """Without ``decisions`` every VCMP and VARGMAX is illegal, whatever its operands;
    without ``word_ops`` every VADD, VPOOL and VCLAMP; without ``pool_average`` a VPOOL
    that averages; the other operations are not."""
    def fields(op, **args):
        return decode_micro(MicroInstr.const({"op": op, "args": {
            op.name.lower(): args}}).as_bits())[1]

    lean = TileConfig(rows=2, cols=2, word_bytes=4, decisions=False, pool_average=False)
    vcmp = fields(MicroOp.VCMP, lane=1)
    vargmax = fields(MicroOp.VARGMAX, n=3)
    average = fields(MicroOp.VPOOL, n=1, window=2, average=1)
    maximum = fields(MicroOp.VPOOL, n=1, window=2)
    for op, f in ((MicroOp.VCMP, vcmp), (MicroOp.VARGMAX, vargmax), (MicroOp.VPOOL, average)):
        assert not illegal_operands(op, f, replace(lean, decisions=True, pool_average=True))
        assert illegal_operands(op, f, lean), op
    assert not illegal_operands(MicroOp.VPOOL, maximum, lean)
    assert illegal_operands(MicroOp.VCMP, vcmp, replace(lean, pool_average=True))
    assert not illegal_operands(MicroOp.VPOOL, average, replace(lean, pool_average=True))
    # Without word_ops: VADD, VPOOL and VCLAMP, whatever their operands.
    no_words = replace(lean, word_ops=False)
    for op, f in ((MicroOp.VADD, fields(MicroOp.VADD, n=2)), (MicroOp.VPOOL, maximum),
                  (MicroOp.VCLAMP, fields(MicroOp.VCLAMP, n=2, lo=-3, hi=3))):
        assert not illegal_operands(op, f, lean), op
        assert illegal_operands(op, f, no_words), op
    for op, f in ((MicroOp.MATMUL, fields(MicroOp.MATMUL, k=2)),
                  (MicroOp.REQUANT, fields(MicroOp.REQUANT))):
        assert not illegal_operands(op, f, no_words), op


def _random_instructions(rng, count):
    """Compute micro-instructions with every field random: extremes, small values and
    the illegal operand values mixed in."""
    out = []
    for _ in range(count):
        op = rng.choice(COMPUTE_OPS)
        raw = rng.getrandbits(120)
        if rng.random() < 0.5:
            # Small fields make zero counts (no-ops, illegal operands) frequent.
            raw &= int("0F" * 15, 16)
        out.append(op.value | raw << 8)
    return out


@pytest.mark.parametrize("config", [TileConfig(), TileConfig(rows=4, cols=4, word_bytes=4),
                                    TileConfig(rows=2, cols=2, word_bytes=4, compact=True),
                                    TileConfig(rows=2, cols=2, word_bytes=4, compact=True,
                                               decisions=False, pool_average=False, word_ops=False)],
                         ids=["8x8", "4x4", "2x2-compact", "2x2-left-out"])
def test_gateware_matches_reference(config):
    """Legality, ends and which ends are outside the partition, the partition's limit
    often at an end or one either side of it (the comparison's edges)."""
    dut = OperandCheck(config)
    rng = random.Random(7)
    instructions = _random_instructions(rng, 3000)

    def limit_for(ends):
        if ends and rng.random() < 0.7:
            return max(0, min(rng.choice(ends) + rng.choice((-1, 0, 1)), (1 << 17) - 1))
        return rng.choice((0, 1 << 16, (1 << 17) - 1, rng.randrange(1 << 17)))

    async def bench(ctx):
        for bits in instructions:
            op, f = decode_micro(bits)
            illegal = illegal_operands(op, f, config)
            ends = [] if illegal else operand_ends(op, f, config)
            limit = limit_for(ends)
            # Held, as the control unit holds its instruction register after `start`:
            # the answer is the configuration's latency later (built for area, later for
            # the operations with products), VPOOL's a cycle more, the ends a cycle after
            # the answer.
            ctx.set(dut.op, bits & 0xFF)
            ctx.set(dut.args.raw, bits >> 8)
            ctx.set(dut.limit, limit)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            latency = check_latency(op, config)
            for _ in range(latency - 1):
                assert not ctx.get(dut.valid), (op, f)
                await ctx.tick()
            assert ctx.get(dut.valid), (op, f)
            assert ctx.get(dut.illegal) == illegal, (op, f)
            if illegal:
                continue
            used = ctx.get(dut.used)
            assert used == (1 << len(ends)) - 1, (op, f)
            outside = sum(1 << i for i, end in enumerate(ends) if end >= limit)
            assert ctx.get(dut.outside) == outside, (op, f, limit)
            await ctx.tick()
            assert ctx.get(dut.valid) and ctx.get(dut.outside) == outside, (op, f)
            got = [ctx.get(dut.ends[i]) for i in range(MAX_OPERANDS) if used >> i & 1]
            assert got == ends, (op, f)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
