# amaranth: UnusedElaboratable=no

"""The vector unit's datapaths against the reference arithmetic (kernels/arith.py).

Every test streams its words back to back (with occasional bubbles) and checks each
result in the exact cycle the documented latency puts it in; most run both builds of
the unit, the deep one (:class:`VectorAlu`) and the one for area
(:class:`CompactVectorAlu`, ``TileConfig.compact``).
"""

import random

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator

from fusetile.hdl.vector import (
    VectorAlu, VectorOp, VectorRegs, requant_input_layout, vector_input_layout,
)
from fusetile.hdl.vector_compact import CompactVectorAlu, vector_alu
from fusetile.kernels import arith
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import CmpOp


MULT_EDGES = [0, 1, 2**30, 2**31 - 1]
INT8_EDGES = [-128, -127, -1, 0, 1, 126, 127]
ACC_EDGES = [-2**31, -2**31 + 1, -1, 0, 1, 2**31 - 1]


def run(dut, bench, vcd=None):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


async def stream(ctx, dut, items, collect, *, regs=None, rows=False):
    """Present ``items`` (payload dicts, or None for a bubble) one per cycle, then wait
    out the pipeline; returns ``[(cycle, payload)]`` of every valid output.
    ``regs[k]`` is presented on ``dut.regs`` with item ``k``. With ``rows``, the items
    are REQUANT rows (``rq``, ``rq_o``, ``requant`` high); the compact unit takes a
    row's zero point and bounds from ``dut.regs``, where they are presented with it
    and, as in the tile, must hold still until its result is out
    (:func:`held_scaling`). A compact unit's row holds still on ``rq`` for its passes,
    as the tile's does; otherwise a bubble's payload is another row, which must not
    matter."""
    inp, out = (dut.rq, dut.rq_o) if rows else (dut.i, dut.o)
    latency = dut.requant_latency if rows else dut.latency
    ctx.set(dut.requant, rows)
    await ctx.tick()                    # `requant` is registered before the rows need it
    outputs = []
    scaling, until = None, 0            # compact rows: the registers' and their last use
    held = 0                            # compact rows: the row's passes last until then
    noise = random.Random(len(items))
    for cycle in range(len(items) + latency + 2):
        item = items[cycle] if cycle < len(items) else None
        ctx.set(inp.valid, item is not None)
        if item is not None:
            ctx.set(inp.payload, item)
            if rows and dut.config.compact:
                held = cycle + dut.config.vector_passes
        elif rows and cycle >= held:
            ctx.set(inp.payload, random_row(noise, dut.config.word_bytes))
        if rows and dut.config.compact and item is not None:
            if _scaling(item) != scaling:
                assert cycle >= until, "a row's registers changed under the one before"
                scaling = _scaling(item)
                ctx.set(dut.regs, dict(zip(("zp_out", "lo", "hi"), scaling)))
            until = cycle + latency
        if regs is not None and item is not None:
            ctx.set(dut.regs, regs[cycle])
        assert ctx.get(inp.ready) == 1
        if ctx.get(out.valid):
            outputs.append((cycle, collect(ctx.get(out.payload))))
        await ctx.tick()
    return outputs


def with_bubbles(rng, items, rate=0.15, passes=1):
    """Interleave bubbles (None) into ``items`` (REQUANT rows, ``passes`` cycles apart
    at least); returns (stream, index of each item)."""
    out, where = [], []
    for item in items:
        while rng.random() < rate or (where and len(out) - where[-1] < passes):
            out.append(None)
        where.append(len(out))
        out.append(item)
    return out, where


def _scaling(row):
    """A REQUANT row's zero point and bounds."""
    return row["zp"], row["lo"], row["hi"]


def held_scaling(dut, items):
    """REQUANT rows ``items`` (None for a bubble) as ``dut`` may take them: built
    compact, a row whose zero point or bounds differ from the row's before waits until
    that row's result is out (they are the VCFG registers', which hold still under a
    command)."""
    if not dut.config.compact:
        return items
    out, before = [], None              # before: the last row's (scaling, cycle)
    for it in items:
        if it is not None:
            if before is not None and _scaling(it) != before[0]:
                out += [None] * (before[1] + dut.requant_latency - len(out))
            before = (_scaling(it), len(out))
        out.append(it)
    return out


def scaled(item):
    """Whether the word ``item`` goes through the lane multipliers (which take
    ``config.vector_passes`` cycles per word)."""
    return item["op"] == VectorOp.VADD or (item["op"] == VectorOp.VPOOL and
                                           item.get("average") and item.get("last"))


def result_latency(dut, op, average=False):
    """Cycles from the word completing a result of ``op`` to the result: a compact
    unit's unscaled results come sooner than its scaled ones."""
    if op == VectorOp.VADD or (op == VectorOp.VPOOL and average):
        return dut.latency
    return dut.unscaled_latency


class Words:
    """A stream of words for ``dut`` (bubbles are None) with the registers presented
    with each, and the cycle each result is due. A word whose result would come no
    later than one before it (an unscaled one after a scaled one, on a compact unit)
    waits: the unit's results must not meet."""

    def __init__(self, dut):
        self.dut, self.items, self.regs, self.due = dut, [], [], []

    def bubble(self):
        self.items.append(None)
        self.regs.append(None)

    def registers_change(self):
        """The next word comes with other registers: built compact, it waits until every
        result before it is out (the unit reads them until then; the compute unit's
        hold still under a command, and a command drains before the next)."""
        while self.dut.config.compact and self.due and len(self.items) < self.due[-1]:
            self.bubble()

    def add(self, item, regs=None):
        if item["op"] in (VectorOp.VADD, VectorOp.VCLAMP) or item.get("last"):
            latency = result_latency(self.dut, item["op"], item.get("average"))
            while self.due and len(self.items) + latency <= self.due[-1]:
                self.bubble()
            self.due.append(len(self.items) + latency)
        self.items.append(item)
        self.regs.append(regs)


# --- REQUANT ------------------------------------------------------------------------

def test_args_checked():
    with pytest.raises(TypeError, match=r"lanes must be an integer, not 'x'"):
        requant_input_layout("x")
    with pytest.raises(ValueError, match=r"lanes must be at least 1, not 0"):
        vector_input_layout(0)
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 8"):
        VectorAlu(8)


#: Both builds of the vector unit, by ``TileConfig.compact``.
BUILDS = pytest.mark.parametrize("compact", [False, True], ids=["deep", "compact"])


def requantizer(lanes, vector_lanes=None, compact=False):
    """The vector ALU of ``lanes`` lanes, which requantises rows of as many
    (``vector_lanes`` of them per cycle)."""
    return vector_alu(TileConfig(word_bytes=lanes, vector_lanes=vector_lanes, compact=compact))


def random_row(rng, lanes):
    """An ACC row and parameters, extremes and rounding ties included."""
    kind = rng.random()
    mult = rng.choice(MULT_EDGES) if rng.random() < 0.4 else rng.randrange(2**31)
    shift = rng.choice([0, 31]) if rng.random() < 0.3 else rng.randrange(32)
    if kind < 0.25:
        acc = [rng.choice(ACC_EDGES) for _ in range(lanes)]
    elif kind < 0.5:
        # acc * 2**30 / 2**(31 + shift) = acc / 2**(shift + 1): odd multiples of
        # 2**shift are exact ties, to be rounded to even.
        mult = 2**30
        m = 2**max(0, 30 - shift)
        acc = [(2 * rng.randrange(-m, m) + 1) * 2**shift for _ in range(lanes)]
        acc = [max(-2**31, min(2**31 - 1, a)) for a in acc]
    elif kind < 0.6:
        acc = [rng.randrange(-2**12, 2**12) for _ in range(lanes)]
        shift = 0
    else:
        acc = [rng.randrange(-2**31, 2**31) for _ in range(lanes)]
    zp = rng.choice(INT8_EDGES) if rng.random() < 0.5 else rng.randrange(-128, 128)
    lo, hi = sorted(rng.randrange(-128, 128) for _ in range(2))
    if rng.random() < 0.4:
        lo, hi = -128, 127
    elif rng.random() < 0.1:
        lo, hi = hi, lo                 # lo > hi: np.clip gives hi
    return {"acc": acc, "mult": mult, "shift": shift, "zp": zp, "lo": lo, "hi": hi}


def requant_reference(row):
    values, sat = arith.requantize(np.array(row["acc"], dtype=np.int32), row["mult"],
                                   row["shift"], row["zp"], row["lo"], row["hi"])
    return [int(v) for v in values], sum(int(s) << j for j, s in enumerate(sat))


def collect_requant(lanes):
    return lambda p: ([p.value[j] for j in range(lanes)], p.saturated)


def check_rows(dut, rows, lanes):
    """Stream REQUANT ``rows`` through ``dut`` back to back: each result is the
    reference's."""
    async def bench(ctx):
        outputs = await stream(ctx, dut, held_scaling(dut, rows), collect_requant(lanes),
                               rows=True)
        assert len(outputs) == len(rows)
        for row, (_, got) in zip(rows, outputs):
            assert got == requant_reference(row), row

    run(dut, bench)


@BUILDS
@pytest.mark.parametrize("lanes, vector_lanes", [(8, None), (16, None), (4, 1), (8, 2)])
def test_requantizer_random_back_to_back(lanes, vector_lanes, compact):
    """Rows one per cycle, or one per ``word_bytes / vector_lanes`` cycles."""
    dut = requantizer(lanes, vector_lanes, compact)
    passes = dut.config.vector_passes
    rng = random.Random(lanes)
    rows = [random_row(rng, lanes) for _ in range(600 // passes)]
    if compact:
        # A command's rows share the VCFG registers' zero point and bounds: runs of
        # rows back to back, a wait for the results where they change.
        for before, row in zip(rows, rows[1:]):
            if rng.random() < 0.9:
                row.update(zip(("zp", "lo", "hi"), _scaling(before)))
    items = held_scaling(dut, with_bubbles(rng, rows, passes=passes)[0])
    where = [k for k, it in enumerate(items) if it is not None]

    async def bench(ctx):
        outputs = await stream(ctx, dut, items, collect_requant(lanes), rows=True)
        assert dut.requant_latency == type(dut).REQUANT_LATENCY + passes - 1
        assert type(dut) is (CompactVectorAlu if compact else VectorAlu)
        assert [c for c, _ in outputs] == [w + dut.requant_latency for w in where]
        for row, (_, got) in zip(rows, outputs):
            assert got == requant_reference(row), row

    run(dut, bench)


@BUILDS
def test_requantizer_extremes_exhaustive(compact):
    """Every combination of extreme accumulator, multiplier, shift and zero point."""
    lanes = 8
    dut = requantizer(lanes, compact=compact)
    acc = ACC_EDGES + [-2**30, 2**30]
    rows = [{"acc": acc, "mult": mult, "shift": shift, "zp": zp, "lo": lo, "hi": hi}
            for mult in MULT_EDGES for shift in (0, 1, 30, 31) for zp in (-128, 0, 127)
            for lo, hi in ((-128, 127), (0, 127), (-5, 5))]
    check_rows(dut, rows, lanes)


@BUILDS
def test_requantizer_rounding_width_edges(compact):
    """``t = p >> (30 + shift)`` on both sides of the compact unit's width (11 bits:
    a wider ``t`` is replaced by the nearest one inside), with each rounding case and
    the zero points and bounds that bring ``y`` nearest the int8 range."""
    lanes = 8
    dut = requantizer(lanes, compact=compact)
    # mult 2**30: p = acc * 2**30, so t = acc >> shift.
    accs = []
    for shift in (0, 1, 3, 20, 31):
        for t in (511, 512, 1022, 1023, 1024, 1025, 2047, 2048):
            for sign in (1, -1):
                for low in sorted({0, (1 << shift) >> 1, (1 << shift) - 1}):
                    acc = sign * t * 2**shift + low
                    if -2**31 <= acc < 2**31:
                        accs.append((shift, acc))
    rows = []
    for zp in (-128, 127):
        for lo, hi in ((-128, 127), (5, -5)):
            for shift in sorted({s for s, _ in accs}):
                batch = [acc for s, acc in accs if s == shift]
                for k in range(0, len(batch), lanes):
                    acc = (batch[k:k + lanes] + [0] * lanes)[:lanes]
                    rows.append({"acc": acc, "mult": 2**30, "shift": shift, "zp": zp,
                                 "lo": lo, "hi": hi})
    check_rows(dut, rows, lanes)


@BUILDS
def test_requantizer_full_32bit_multiplier(compact):
    """Beyond the ISA's range (mult >= 2**31) the datapath is still exact."""
    lanes = 4
    dut = requantizer(lanes, compact=compact)
    rng = random.Random(7)
    rows = [{**random_row(rng, lanes), "mult": rng.choice([2**31, 2**32 - 1,
                                                            rng.randrange(2**31, 2**32)])}
            for _ in range(40)]
    check_rows(dut, rows, lanes)


@BUILDS
def test_requantizer_saturation_flags(compact):
    lanes = 4
    dut = requantizer(lanes, compact=compact)
    # mult 2**31 - 1 ~ 1.0: acc passes through (rounded) and is clamped to [-3, 3].
    row = {"acc": [100, -100, 2, -3], "mult": 2**31 - 1, "shift": 0, "zp": 0,
           "lo": -3, "hi": 3}

    async def bench(ctx):
        [(_, got)] = await stream(ctx, dut, [row], collect_requant(lanes), rows=True)
        assert got == ([3, -3, 2, -3], 0b0011)
        assert got == requant_reference(row)

    run(dut, bench)


@BUILDS
def test_requantizer_clamp_corners(compact):
    """The clamp's comparisons side by side: every lane on, next to and between the
    bounds, ordinary (lo < hi, lo == hi) and inverted (lo > hi, where np.clip gives hi
    and a lane equal to hi is not saturated)."""
    ys = [-128, -7, -6, -5, -4, -3, 0, 1, 2, 3, 4, 5, 6, 7, 100, 127]
    dut = requantizer(len(ys), compact=compact)
    # mult 2**30, shift 0: y = acc / 2, exact for even acc.
    rows = [{"acc": [2 * y for y in ys], "mult": 2**30, "shift": 0, "zp": 0,
             "lo": lo, "hi": hi}
            for lo, hi in ((-5, 5), (4, 4), (5, -5), (4, -6), (127, -128), (-128, 127))]

    async def bench(ctx):
        outputs = await stream(ctx, dut, held_scaling(dut, rows), collect_requant(len(ys)),
                               rows=True)
        assert len(outputs) == len(rows)
        for row, (_, got) in zip(rows, outputs):
            assert got == requant_reference(row), row

    run(dut, bench)


# --- VectorAlu ----------------------------------------------------------------------

def random_regs(rng):
    def int8():
        return rng.choice(INT8_EDGES) if rng.random() < 0.4 else rng.randrange(-128, 128)

    def mult():
        return rng.choice(MULT_EDGES) if rng.random() < 0.4 else rng.randrange(2**31)

    lo, hi = sorted((int8(), int8()))
    if rng.random() < 0.3:
        lo, hi = -128, 127
    return {"mult_a": mult(), "mult_b": mult(),
            "shift": rng.choice([0, 31]) if rng.random() < 0.3 else rng.randrange(32),
            "zp_a": int8(), "zp_b": int8(), "zp_out": int8(), "lo": lo, "hi": hi}


def random_word(rng, lanes, values=None):
    if values is not None:
        return [rng.choice(values) for _ in range(lanes)]
    if rng.random() < 0.2:
        return [rng.choice(INT8_EDGES) for _ in range(lanes)]
    return [rng.randrange(-128, 128) for _ in range(lanes)]


def item(lanes, op, a=None, **fields):
    return {"op": op, "a": a if a is not None else [0] * lanes, **fields}


def expected(lanes, op, word=None, sat=None, flag=0, index=0):
    """A result as the collector returns it."""
    word = [0] * lanes if word is None else [int(v) for v in word]
    sat_bits = 0 if sat is None else sum(int(s) << j for j, s in enumerate(sat))
    return (op, word, sat_bits, bin(sat_bits).count("1"), flag, index)


def collect_alu(lanes):
    return lambda p: (p.op, [p.word[j] for j in range(lanes)], p.saturated,
                      p.sat_count, p.flag, p.index)


def op_vadd(rng, lanes, regs):
    if rng.random() < 0.3:
        # (a - zp_a) * 2**30 / 2**31: odd differences are ties.
        regs = {**regs, "mult_a": 2**30, "mult_b": 0, "shift": 0}
    a, b = random_word(rng, lanes), random_word(rng, lanes)
    out, sat = arith.vadd(a, b, mult_a=regs["mult_a"], mult_b=regs["mult_b"],
                          shift=regs["shift"], zp_a=regs["zp_a"], zp_b=regs["zp_b"],
                          zp_out=regs["zp_out"], lo=regs["lo"], hi=regs["hi"])
    return [item(lanes, VectorOp.VADD, a, b=b)], expected(lanes, VectorOp.VADD, out, sat), regs


def op_vpool(rng, lanes, regs):
    window = rng.randrange(1, 16)
    average, pairs = rng.random() < 0.6, rng.random() < 0.5
    if average and rng.random() < 0.3:
        regs = {**regs, "mult_a": 2**30, "shift": rng.choice([0, 1])}
    words = [random_word(rng, lanes) for _ in range(window)]
    out, sat = arith.vpool(np.array(words), average=average, pairs=pairs,
                           mult=regs["mult_a"], shift=regs["shift"], zp_in=regs["zp_a"],
                           zp_out=regs["zp_out"], lo=regs["lo"], hi=regs["hi"])
    items = [item(lanes, VectorOp.VPOOL, w, first=t == 0, last=t == window - 1,
                  average=average, pairs=pairs) for t, w in enumerate(words)]
    return items, expected(lanes, VectorOp.VPOOL, out, sat), regs


def op_vclamp(rng, lanes, regs):
    a = random_word(rng, lanes)
    lo, hi = rng.randrange(-128, 128), rng.randrange(-128, 128)
    if rng.random() < 0.7:
        lo, hi = min(lo, hi), max(lo, hi)
    out = arith.vclamp(a, lo, hi)
    return ([item(lanes, VectorOp.VCLAMP, a, lo=lo, hi=hi)],
            expected(lanes, VectorOp.VCLAMP, out), regs)


def op_vcmp(rng, lanes, regs):
    lane = rng.randrange(0, 4 * lanes)
    reduce = rng.random() < 0.6
    words = [random_word(rng, lanes) for _ in range(lane // lanes + 1)]
    flat = [v for w in words for v in w]
    value = max(flat[:lane + 1]) if reduce else flat[lane]
    cmp = rng.choice(list(CmpOp))
    imm = rng.choice([value, value - 1, value + 1, -128, 127, rng.randrange(-128, 128)])
    imm = max(-128, min(127, imm))
    flag = arith.vcmp(value, cmp, imm)
    if not reduce:
        words = words[-1:]
    items = [item(lanes, VectorOp.VCMP, w, first=t == 0, last=t == len(words) - 1,
                  reduce=reduce, lane=lane % lanes, cmp=cmp, imm=imm)
             for t, w in enumerate(words)]
    return items, expected(lanes, VectorOp.VCMP, flag=int(flag)), regs


def _expect(rng, index):
    """VARGMAX's ``expect``: mostly the result or a near miss, any 16-bit value too."""
    return rng.choice([index, index, index + 1, max(0, index - 1), 0,
                       rng.randrange(1 << 16)]) & 0xFFFF


def op_vargmax(rng, lanes, regs):
    n = rng.randrange(1, 4 * lanes + 1)
    # Few distinct values: ties are the rule; the lowest index must win.
    values = rng.choice([None, [-128, 127], [-128], [3, 5, -7], [127]])
    words = [random_word(rng, lanes, values) for _ in range((n - 1) // lanes + 1)]
    flat = [v for w in words for v in w]
    index = arith.vargmax(flat[:n])
    expect = _expect(rng, index)
    items = [item(lanes, VectorOp.VARGMAX, w, first=t == 0, last=t == len(words) - 1,
                  lane=(n - 1) % lanes, expect=expect) for t, w in enumerate(words)]
    return items, expected(lanes, VectorOp.VARGMAX, index=index,
                           flag=int(arith.vargmax_test(index, expect))), regs


def op_vargmax_column(rng, lanes, regs):
    """VARGMAX with ``column``: the word number of the largest lane ``lane``; the other
    lanes (random, often larger) must not matter."""
    n = rng.choice([1, 2, rng.randrange(1, 4 * lanes + 1), rng.randrange(1, 40)])
    lane = rng.choice([0, lanes - 1, rng.randrange(lanes)])
    values = rng.choice([None, [-128, 127], [-128], [3, 5, -7], [127]])
    words = [random_word(rng, lanes, values) for _ in range(n)]
    for w in words:                     # the other lanes: anything
        for j in range(lanes):
            if j != lane and rng.random() < 0.5:
                w[j] = rng.choice([127, rng.randrange(-128, 128)])
    index = arith.vargmax_column(words, lane)
    expect = _expect(rng, index)
    items = [item(lanes, VectorOp.VARGMAX, w, first=t == 0, last=t == n - 1, column=1,
                  lane=lane, expect=expect) for t, w in enumerate(words)]
    return items, expected(lanes, VectorOp.VARGMAX, index=index,
                           flag=int(arith.vargmax_test(index, expect))), regs


OPS = {"vadd": op_vadd, "vpool": op_vpool, "vclamp": op_vclamp, "vcmp": op_vcmp,
       "vargmax": op_vargmax, "vargmax_column": op_vargmax_column}


def check_program(config, ops, seed, count, bubble_rate=0.1):
    """Run ``count`` random operations drawn from ``ops`` back to back, the vector
    registers changing between operations, and the words that are scaled
    ``config.vector_passes`` cycles apart at least; check every result and its cycle."""
    lanes = config.word_bytes
    dut = vector_alu(config)
    rng = random.Random(seed)
    words, results = Words(dut), []
    last_scaled = -config.vector_passes
    op_regs = None
    for _ in range(count):
        # The compact unit reads the registers until a scaled word's result is out
        # (they hold still under a command): an operation with registers of its own
        # waits for the results before it; half of them keep the registers, as a
        # command's words do, and need not.
        held = config.compact and op_regs is not None and rng.random() < 0.5
        before = op_regs
        op_items, result, op_regs = rng.choice(ops)(rng, lanes,
                                                    before if held else random_regs(rng))
        if op_regs != before:
            words.registers_change()
        for it in op_items:
            while rng.random() < bubble_rate or \
                    (scaled(it) and len(words.items) - last_scaled < config.vector_passes):
                words.bubble()
            words.add(it, op_regs)
            if scaled(it):
                last_scaled = len(words.items) - 1
        results.append(result)

    async def bench(ctx):
        outputs = await stream(ctx, dut, words.items, collect_alu(lanes), regs=words.regs)
        assert dut.latency == type(dut).LATENCY + config.vector_passes - 1
        assert [c for c, _ in outputs] == words.due
        for want, (_, got) in zip(results, outputs):
            assert got == want

    run(dut, bench)


@pytest.mark.parametrize("word_bytes, compact", [(8, False), (16, False), (4, True), (8, True)])
@pytest.mark.parametrize("op", sorted(OPS))
def test_alu_op_random(op, word_bytes, compact):
    count = {"vpool": 150, "vcmp": 200, "vargmax": 200, "vargmax_column": 150}.get(op, 500)
    check_program(TileConfig(word_bytes=word_bytes, compact=compact), [OPS[op]],
                  seed=sorted(OPS).index(op), count=count * 8 // max(word_bytes, 8))


@pytest.mark.parametrize("word_bytes, compact", [(4, False), (8, False), (16, False),
                                                 (32, False), (4, True), (16, True)])
def test_alu_mixed_back_to_back(word_bytes, compact):
    """All operations one after another with no gap: one word per cycle. (32 lanes:
    two levels of the lane tree per stage.)"""
    check_program(TileConfig(word_bytes=word_bytes, compact=compact), list(OPS.values()),
                  seed=word_bytes, count=300, bubble_rate=0)


@BUILDS
@pytest.mark.parametrize("word_bytes, vector_lanes", [(4, 1), (8, 2), (8, 4), (16, 4)])
def test_alu_mixed_in_passes(word_bytes, vector_lanes, compact):
    """Fewer lane multipliers than lanes: a scaled word every ``word_bytes /
    vector_lanes`` cycles, the other words one per cycle in between (VPOOL's words
    before its last among them; built compact, only an operation's own), every result
    exact and in its cycle."""
    config = TileConfig(word_bytes=word_bytes, vector_lanes=vector_lanes, compact=compact)
    check_program(config, list(OPS.values()), seed=word_bytes + vector_lanes, count=300,
                  bubble_rate=0)


@BUILDS
def test_alu_vadd_extremes(compact):
    """Zero points at the int8 edges, multiplier 0 and 2**31 - 1, shift 0 and 31."""
    config = TileConfig(word_bytes=8, compact=compact)
    lanes = config.word_bytes
    dut = vector_alu(config)
    words = [[-128, 127, 0, -1, 1, -128, 127, 64], [127, -128, 0, 1, -1, -128, 127, -64]]
    stream_words, results = Words(dut), []
    for mult_a in (0, 2**31 - 1):
        for mult_b in (0, 2**31 - 1):
            for shift in (0, 31):
                for zp_a, zp_b in ((-128, 127), (127, -128), (0, 0)):
                    for zp_out, lo, hi in ((0, -128, 127), (-128, -128, 127),
                                           (127, -128, 127), (0, -10, 10)):
                        r = {"mult_a": mult_a, "mult_b": mult_b, "shift": shift,
                             "zp_a": zp_a, "zp_b": zp_b, "zp_out": zp_out, "lo": lo,
                             "hi": hi}
                        a, b = words if (shift + zp_out) % 2 else words[::-1]
                        out, sat = arith.vadd(a, b, **r)
                        stream_words.registers_change()
                        stream_words.add(item(lanes, VectorOp.VADD, a, b=b), r)
                        results.append(expected(lanes, VectorOp.VADD, out, sat))

    async def bench(ctx):
        outputs = await stream(ctx, dut, stream_words.items, collect_alu(lanes),
                               regs=stream_words.regs)
        assert [got for _, got in outputs] == results
        # The extremes do saturate: the counter sees it.
        assert sum(got[3] for _, got in outputs) > 0

    run(dut, bench)


@BUILDS
def test_alu_saturation_count(compact):
    config = TileConfig(word_bytes=8, compact=compact)
    dut = vector_alu(config)
    # VADD at ~1.0 scale: a + b clamped to [-128, 127] -> lanes 0, 1, 2 saturate.
    r = {"mult_a": 2**31 - 1, "mult_b": 2**31 - 1, "shift": 0, "zp_a": 0, "zp_b": 0,
         "zp_out": 0, "lo": -128, "hi": 127}
    a = [100, -100, 127, 5, 0, 0, 0, 0]
    b = [100, -100, 127, 5, 0, 0, 0, 0]

    async def bench(ctx):
        [(_, got)] = await stream(ctx, dut, [item(8, VectorOp.VADD, a, b=b)],
                                  collect_alu(8), regs=[r])
        assert got == (VectorOp.VADD, [127, -128, 127, 10, 0, 0, 0, 0], 0b111, 3, 0, 0)

    run(dut, bench)


@BUILDS
def test_alu_reduction_with_interleaved_words(compact):
    """VADD / VCLAMP words may come between the words of a reduction, and bubbles."""
    config = TileConfig(word_bytes=8, compact=compact)
    lanes = config.word_bytes
    dut = vector_alu(config)
    rng = random.Random(3)
    r = random_regs(rng)
    words, results = Words(dut), []
    for _ in range(60):
        red_items, red_result, _ = rng.choice([op_vpool, op_vcmp, op_vargmax,
                                               op_vargmax_column])(rng, lanes, r)
        for it in red_items:
            while rng.random() < 0.5:
                if rng.random() < 0.5:
                    extra = rng.choice([op_vadd, op_vclamp])
                    [extra_item], extra_result, _ = extra(rng, lanes, r)
                    words.add(extra_item, r)
                    # op_vadd may pick its own registers (for ties): recompute with r.
                    results.append(vadd_result(lanes, extra_item, r)
                                   if extra is op_vadd else extra_result)
                else:
                    words.bubble()
            words.add(it, r)
        results.append(red_result)

    async def bench(ctx):
        outputs = await stream(ctx, dut, words.items, collect_alu(lanes), regs=words.regs)
        assert [c for c, _ in outputs] == words.due
        assert [got for _, got in outputs] == results

    run(dut, bench)


def vadd_result(lanes, it, r):
    out, sat = arith.vadd(it["a"], it["b"], **r)
    return expected(lanes, VectorOp.VADD, out, sat)


@BUILDS
@pytest.mark.parametrize("word_bytes", [4, 8])
def test_alu_vargmax_column_directed(word_bytes, compact):
    """Column argmax on hand-picked words: n = 1, ties (the lowest word wins), all
    -128, the other lanes larger; back to back with packed VARGMAX and VCMP words, so
    neither mode leaks state into the other. Each result's flag tests ``expect``."""
    config = TileConfig(word_bytes=word_bytes, compact=compact)
    lanes = config.word_bytes
    dut = vector_alu(config)
    W = lanes

    def word(*values, fill=0):
        return list(values) + [fill] * (W - len(values))

    cases = [   # (words, lane, expect)
        ([word(5)], 0, 0),                                           # n = 1
        ([word(5)], W - 1, 1),
        ([word(-128, -128)] * 3, 1, 0),                              # all -128: word 0
        ([word(1, 7), word(2, 9), word(3, 9), word(127, 8)], 1, 1),  # tie: word 1
        ([word(0, -128, fill=127), word(0, -127)], 1, 1),            # other lanes ignored
        ([word(-5, fill=127)] * 2 + [word(-4, fill=-128)], 0, 2),
        ([word(*[-128] * W)] * 5 + [word(*[-127] * W)], W - 1, 4),   # the last word wins
    ]
    items, results, last = [], [], []
    for words, lane, expect in cases:
        index = arith.vargmax_column(words, lane)
        items += [item(W, VectorOp.VARGMAX, w, first=t == 0, last=t == len(words) - 1,
                       column=1, lane=lane, expect=expect) for t, w in enumerate(words)]
        last.append(len(items) - 1)
        results.append(expected(W, VectorOp.VARGMAX, index=index,
                                flag=int(index == expect)))
        # A packed VARGMAX over the same words, and a VCMP, right behind it.
        flat = [v for w in words for v in w]
        n = min(len(flat), W + 1)
        packed = words[:-(-n // W)]
        items += [item(W, VectorOp.VARGMAX, w, first=t == 0, last=t == len(packed) - 1,
                       lane=(n - 1) % W, expect=arith.vargmax(flat[:n]))
                  for t, w in enumerate(packed)]
        last.append(len(items) - 1)
        results.append(expected(W, VectorOp.VARGMAX, index=arith.vargmax(flat[:n]), flag=1))
        items.append(item(W, VectorOp.VCMP, words[0], first=1, last=1, lane=lane,
                          cmp=CmpOp.EQ, imm=words[0][lane]))
        last.append(len(items) - 1)
        results.append(expected(W, VectorOp.VCMP, flag=1))
    assert [r[5] for r in results[::3]] == [0, 0, 0, 1, 1, 2, 5]

    async def bench(ctx):
        outputs = await stream(ctx, dut, items, collect_alu(W))
        assert [c for c, _ in outputs] == [i + dut.unscaled_latency for i in last]
        assert [got for _, got in outputs] == results

    run(dut, bench)


@BUILDS
def test_rows_and_words_share_the_multipliers(compact):
    """REQUANT rows and vector words as close together as ``requant`` allows (a row
    needs it high in the cycles ``REQUANT_HIGH`` from the one it is presented in, a
    scaled word low in ``REQUANT_LOW``; the two ports may even take an item in the
    same cycle), ``requant`` random whenever nothing needs the multipliers: every
    result exact, in its cycle."""
    lanes = 8
    dut = vector_alu(TileConfig(word_bytes=lanes, compact=compact))
    rng = random.Random(11)
    # Built compact, the unit reads the registers until a result is out, a row's zero
    # point and bounds among them: one command's registers for every item.
    common = random_regs(rng) if compact else None
    need = {}                           # cycle -> the `requant` it must have
    rows, words = {}, {}                # cycle -> (payload, expected[, regs])
    cursor = {"row": 1, "word": 1}
    due = set()                         # the cycles the words' results come in
    at = 1
    for _ in range(60):
        kind = rng.choice(["row", "word"])
        if kind == "row":
            row = random_row(rng, lanes)
            if compact:
                row.update(zp=common["zp_out"], lo=common["lo"], hi=common["hi"])
            payload, want, mode, regs = row, requant_reference(row), (dut.REQUANT_HIGH, 1), None
        else:
            make = rng.choice([op_vadd, op_vadd, op_vclamp])
            [payload], want, regs = make(rng, lanes, common or random_regs(rng))
            while compact and regs != common:       # (VADD's own multipliers)
                [payload], want, regs = make(rng, lanes, common)
            mode = (dut.REQUANT_LOW, 0) if payload["op"] == VectorOp.VADD else None
        at = max(at, cursor[kind])
        while (mode is not None and any(need.get(at + k, mode[1]) != mode[1]
                                        for k in mode[0])) or \
                (kind == "word" and at + result_latency(dut, payload["op"]) in due):
            at += 1
        if kind == "word":
            due.add(at + result_latency(dut, payload["op"]))
        if mode is not None:
            need.update((at + k, mode[1]) for k in mode[0])
        (rows if kind == "row" else words)[at] = (payload, want, regs)
        cursor[kind] = at + 1
        at += rng.choice([0, 0, 0, 1, 2])
    # Both kinds came within a cycle of each other, and in the same cycle.
    assert any(c in words for c in rows)
    assert any(c + 1 in words or c - 1 in words for c in rows)
    end = max(max(rows), max(words)) + dut.latency + 2

    async def bench(ctx):
        got_rows, got_words = {}, {}
        if compact:
            ctx.set(dut.regs, common)
        for cycle in range(end):
            ctx.set(dut.requant, need.get(cycle, rng.randrange(2)))
            ctx.set(dut.rq.valid, cycle in rows)
            if cycle in rows:
                ctx.set(dut.rq.payload, rows[cycle][0])
            ctx.set(dut.i.valid, cycle in words)
            if cycle in words:
                ctx.set(dut.i.payload, words[cycle][0])
                ctx.set(dut.regs, words[cycle][2])
            if ctx.get(dut.rq_o.valid):
                got_rows[cycle - dut.requant_latency] = \
                    collect_requant(lanes)(ctx.get(dut.rq_o.payload))
            if ctx.get(dut.o.valid):
                got = collect_alu(lanes)(ctx.get(dut.o.payload))
                got_words[cycle - result_latency(dut, got[0])] = got
            await ctx.tick()
        assert got_rows == {c: want for c, (_, want, _) in rows.items()}
        assert got_words == {c: want for c, (_, want, _) in words.items()}

    run(dut, bench)


@BUILDS
def test_alu_busy(compact):
    config = TileConfig(word_bytes=8, compact=compact)
    dut = vector_alu(config)

    async def bench(ctx):
        assert ctx.get(dut.busy) == 0
        ctx.set(dut.i.payload, item(8, VectorOp.VPOOL, [1] * 8, first=1, last=0))
        ctx.set(dut.i.valid, 1)
        await ctx.tick()
        ctx.set(dut.i.payload, item(8, VectorOp.VPOOL, [2] * 8, first=0, last=1))
        await ctx.tick()
        ctx.set(dut.i.valid, 0)
        busy = []
        for _ in range(dut.unscaled_latency + 1):
            busy.append((ctx.get(dut.busy), ctx.get(dut.o.valid)))
            await ctx.tick()
        # The result of the word presented in cycle 1 is out in cycle 1 +
        # UNSCALED_LATENCY (LATENCY, deep); busy covers every cycle before it.
        assert busy == [(1, 0)] * (dut.unscaled_latency - 1) + [(0, 1), (0, 0)]

    run(dut, bench)


def test_layouts():
    assert requant_input_layout(8).size == 8 * 32 + 32 + 5 + 24
    assert VectorRegs.as_shape().size == 32 + 32 + 5 + 5 * 8
    assert vector_input_layout(16).size == 3 + 2 * 128 + 6 + 4 + 2 + 3 * 8 + 16
    dut = VectorAlu(TileConfig(word_bytes=16))
    assert len(dut.i.payload.a.as_value()) == 128
    assert len(dut.i.payload.lane) == 4


@BUILDS
@pytest.mark.parametrize("word_bytes", [4, 8, 16])
def test_verilog_converts(word_bytes, compact):
    text = verilog.convert(vector_alu(TileConfig(word_bytes=word_bytes, compact=compact)),
                           name="vector_alu")
    assert "module vector_alu" in text
