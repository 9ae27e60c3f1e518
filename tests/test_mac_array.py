# amaranth: UnusedElaboratable=no

import random

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator

from fusetile.hdl.mac_array import MacArray, MacStepLayout
from fusetile.kernels.arith import matmul_step
from fusetile.kernels.config import TileConfig


CFG = TileConfig()                                          # 8 x 8, 8-byte words
CONFIGS = [
    CFG,
    TileConfig(rows=4, cols=8),
    TileConfig(rows=3, cols=5),                             # row port not a power of two
    TileConfig(rows=16, cols=16, word_bytes=16),
    TileConfig(rows=1, cols=2, word_bytes=4),               # zero-width row port
]
IDS = [f"{c.rows}x{c.cols}w{c.word_bytes}" for c in CONFIGS]
LATENCY = MacArray.LATENCY


@pytest.fixture(params=[False, True], ids=["fabric", "dsp"])
def style(request):
    """Every test runs on both arrangements of the stages: accumulators in the fabric
    (the ECP5's and the simulators') and in DSP blocks (the iCE40's)."""
    return request.param


def run(dut, bench, vcd=None):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def rand_lanes(rng, n, extreme=False):
    if extreme:
        return [rng.choice((-128, 127)) for _ in range(n)]
    return [rng.randint(-128, 127) for _ in range(n)]


def idle(ctx, dut):
    ctx.set(dut.step.valid, 0)
    ctx.set(dut.bias_valid, 0)
    ctx.set(dut.abort, 0)


async def send_step(ctx, dut, a, b, first):
    """Hand one step over (waiting while not ready); return the cycle's outputs."""
    ctx.set(dut.step.payload.a, a)
    ctx.set(dut.step.payload.b, b)
    ctx.set(dut.step.payload.first, first)
    ctx.set(dut.step.valid, 1)
    while not ctx.get(dut.step.ready):
        await ctx.tick()
    outputs = (ctx.get(dut.busy), ctx.get(dut.macs))
    await ctx.tick()
    ctx.set(dut.step.valid, 0)
    return outputs


async def set_bias(ctx, dut, bias):
    """ACC_BIAS: ``bias_valid`` for a cycle, then the cycle the bias loads in, which
    ``busy`` shows."""
    ctx.set(dut.bias_value, list(bias))
    ctx.set(dut.bias_valid, 1)
    await ctx.tick()
    ctx.set(dut.bias_valid, 0)
    assert ctx.get(dut.busy)
    await ctx.tick()
    assert not ctx.get(dut.busy)


async def drain(ctx, dut, limit=LATENCY + 1):
    """Wait until ``busy`` is low; return the cycles waited."""
    cycles = 0
    while ctx.get(dut.busy):
        assert cycles < limit, "the array does not drain"
        await ctx.tick()
        cycles += 1
    return cycles


async def read_acc(ctx, dut):
    """All of ACC, one row per cycle through the registered readout."""
    cfg = dut.config
    rows = []
    for i in range(cfg.rows):
        ctx.set(dut.row, i)
        await ctx.tick()
        rows.append([ctx.get(dut.acc_row[j]) for j in range(cfg.cols)])
    return np.array(rows, dtype=np.int32)


def pad(lanes, config):
    return list(lanes) + [0] * (config.word_bytes - len(lanes))


# -- construction ----------------------------------------------------------------------

def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 4"):
        MacArray(4)
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 4"):
        MacStepLayout(4)
    with pytest.raises(ValueError,
                       match=r"config.rows must be at most config.word_bytes \(8\), not 16"):
        MacArray(TileConfig(rows=16))
    with pytest.raises(TypeError, match=r"dsp_accumulator must be a bool or None, not 1"):
        MacArray(CFG, dsp_accumulator=1)
    with pytest.raises(ValueError,
                       match=r"config.cols must be at most config.word_bytes \(4\), not 8"):
        MacArray(TileConfig(rows=4, cols=8, word_bytes=4))


def test_ports(style):
    cfg = TileConfig(rows=4, cols=8)
    dut = MacArray(cfg, dsp_accumulator=style)
    assert dut.config is cfg
    assert len(dut.step.payload.a.as_value()) == cfg.word_bits
    assert len(dut.step.payload.b.as_value()) == cfg.word_bits
    assert len(dut.step.payload.first) == 1
    assert len(dut.bias_value.as_value()) == 32 * cfg.rows
    assert len(dut.acc_row.as_value()) == 32 * cfg.cols
    assert len(dut.row) == 2
    assert len(dut.macs) == 6                   # range(33)
    assert MacStepLayout(cfg) == MacStepLayout(cfg)
    assert MacStepLayout(cfg).size == 2 * cfg.word_bits + 1


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_verilog(config):
    text = verilog.convert(MacArray(config), name="mac_array")
    assert "module mac_array" in text


# -- arithmetic against kernels.arith --------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_random_matmuls(config, style):
    """Random MATMULs (overwrite or accumulate), with bubbles, checked after each."""
    rng = random.Random(config.rows * 100 + config.cols)
    dut = MacArray(config, dsp_accumulator=style)
    R, C = config.rows, config.cols
    runs = 3 if R * C > 64 else 6

    async def bench(ctx):
        idle(ctx, dut)
        model = np.zeros((R, C), dtype=np.int32)
        for run_ in range(runs):
            accumulate = run_ and rng.random() < 0.5
            k = rng.randint(1, 12)
            for t in range(k):
                a = rand_lanes(rng, config.word_bytes)
                b = rand_lanes(rng, config.word_bytes)
                first = t == 0 and not accumulate
                await send_step(ctx, dut, a, b, first)
                model = matmul_step(np.zeros_like(model) if first else model,
                                    a[:R], b[:C])
                for _ in range(rng.choice((0, 0, 0, 1, 2))):    # bubbles in `valid`
                    await ctx.tick()
            await drain(ctx, dut)
            np.testing.assert_array_equal(await read_acc(ctx, dut), model)

    run(dut, bench)


def test_back_to_back_matmuls(style):
    """A new MATMUL (first = 1) right behind the last step of the previous one."""
    rng = random.Random(7)
    dut = MacArray(CFG, dsp_accumulator=style)

    async def bench(ctx):
        idle(ctx, dut)
        for k in (1, 2, 5):
            model = None
            for t in range(k):
                a, b = rand_lanes(rng, 8), rand_lanes(rng, 8)
                await send_step(ctx, dut, a, b, t == 0)
                model = matmul_step(np.zeros((8, 8)) if t == 0 else model, a, b)
        await drain(ctx, dut)
        np.testing.assert_array_equal(await read_acc(ctx, dut), model)

    run(dut, bench)


def test_first_only_clears_on_its_step(style):
    """Steps after a `first` step add to it; `first` on a later step restarts."""
    dut = MacArray(CFG, dsp_accumulator=style)
    ones = [1] * 8

    async def bench(ctx):
        idle(ctx, dut)
        await set_bias(ctx, dut, [1000] * 8)
        await send_step(ctx, dut, ones, ones, 1)
        await send_step(ctx, dut, ones, ones, 0)
        await send_step(ctx, dut, ones, [2] * 8, 1)
        await send_step(ctx, dut, ones, ones, 0)
        await drain(ctx, dut)
        np.testing.assert_array_equal(await read_acc(ctx, dut), np.full((8, 8), 3))

    run(dut, bench)


# -- bias ------------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS[:2], ids=IDS[:2])
def test_bias_then_accumulate(config, style):
    rng = random.Random(3)
    dut = MacArray(config, dsp_accumulator=style)
    R, C = config.rows, config.cols

    async def bench(ctx):
        idle(ctx, dut)
        bias = [rng.randint(-2**31, 2**31 - 1) for _ in range(R)]
        await set_bias(ctx, dut, bias)
        model = np.repeat(np.array(bias, dtype=np.int32)[:, None], C, axis=1)
        np.testing.assert_array_equal(await read_acc(ctx, dut), model)
        for _ in range(6):
            a = rand_lanes(rng, config.word_bytes)
            b = rand_lanes(rng, config.word_bytes)
            await send_step(ctx, dut, a, b, 0)
            model = matmul_step(model, a[:R], b[:C])
        await drain(ctx, dut)
        np.testing.assert_array_equal(await read_acc(ctx, dut), model)

    run(dut, bench)


def test_bias_with_first_step_in_same_cycle(style):
    """ACC_BIAS and the first accumulating step can be handed over together."""
    rng = random.Random(4)
    dut = MacArray(CFG, dsp_accumulator=style)

    async def bench(ctx):
        idle(ctx, dut)
        bias = [rng.randint(-1000, 1000) for _ in range(8)]
        a, b = rand_lanes(rng, 8), rand_lanes(rng, 8)
        ctx.set(dut.bias_value, bias)
        ctx.set(dut.bias_valid, 1)
        await send_step(ctx, dut, a, b, 0)
        ctx.set(dut.bias_valid, 0)
        await drain(ctx, dut)
        model = matmul_step(np.repeat(np.array(bias)[:, None], 8, axis=1), a, b)
        np.testing.assert_array_equal(await read_acc(ctx, dut), model)

    run(dut, bench)


def test_bias_after_matmul_replaces_acc(style):
    dut = MacArray(CFG, dsp_accumulator=style)

    async def bench(ctx):
        idle(ctx, dut)
        await send_step(ctx, dut, [5] * 8, [7] * 8, 1)
        await drain(ctx, dut)
        await set_bias(ctx, dut, list(range(-4, 4)))
        acc = await read_acc(ctx, dut)
        np.testing.assert_array_equal(acc, np.repeat(np.arange(-4, 4)[:, None], 8, axis=1))

    run(dut, bench)


# -- wrap-around -----------------------------------------------------------------------

@pytest.mark.parametrize("direction", ["up", "down"])
def test_wraps_on_overflow(direction, style):
    """int32 accumulators wrap like two's complement (large bias, extreme operands)."""
    dut = MacArray(CFG, dsp_accumulator=style)
    rng = random.Random(5)

    async def bench(ctx):
        idle(ctx, dut)
        if direction == "up":
            bias = [2**31 - 1 - rng.randint(0, 40000) for _ in range(8)]
            a, b = [-128] * 8, [-128] * 8                  # +16384 per step
        else:
            bias = [-2**31 + rng.randint(0, 40000) for _ in range(8)]
            a, b = [-128] * 8, [127] * 8                   # -16256 per step
        b[3] = 0                                           # one column never moves
        await set_bias(ctx, dut, bias)
        model = np.repeat(np.array(bias, dtype=np.int32)[:, None], 8, axis=1)
        for _ in range(5):
            await send_step(ctx, dut, a, b, 0)
            model = matmul_step(model, a, b)
        await drain(ctx, dut)
        acc = await read_acc(ctx, dut)
        np.testing.assert_array_equal(acc, model)
        wrapped = (acc < 0) if direction == "up" else (acc > 0)
        assert wrapped[:, [0, 1, 2, 4, 5, 6, 7]].all()
        np.testing.assert_array_equal(acc[:, 3], bias)

    run(dut, bench)


def test_extreme_operands_random(style):
    """Mixed +-128/127 operands over many back-to-back steps on a large bias."""
    rng = random.Random(6)
    dut = MacArray(CFG, dsp_accumulator=style)

    async def bench(ctx):
        idle(ctx, dut)
        bias = [rng.choice((2**31 - 1, -2**31, 2**31 - 20000)) for _ in range(8)]
        await set_bias(ctx, dut, bias)
        model = np.repeat(np.array(bias, dtype=np.int32)[:, None], 8, axis=1)
        for _ in range(40):
            a, b = rand_lanes(rng, 8, extreme=True), rand_lanes(rng, 8, extreme=True)
            await send_step(ctx, dut, a, b, 0)
            model = matmul_step(model, a, b)
        await drain(ctx, dut)
        np.testing.assert_array_equal(await read_acc(ctx, dut), model)

    run(dut, bench)


# -- readout ---------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_readout_every_row(config, style):
    """Each row is distinct; reading is one row per cycle, one cycle late."""
    dut = MacArray(config, dsp_accumulator=style)
    R, C = config.rows, config.cols

    async def bench(ctx):
        idle(ctx, dut)
        # ACC[i][j] = 1000 * i + (j + 1) * (i + 1): the bias and one step.
        await set_bias(ctx, dut, [1000 * i for i in range(R)])
        await send_step(ctx, dut, pad(range(1, R + 1), config),
                        pad(range(1, C + 1), config), 0)
        await drain(ctx, dut)
        order = list(range(R)) + list(reversed(range(R)))
        for i in order:
            ctx.set(dut.row, i)
            await ctx.tick()
            want = [1000 * i + (j + 1) * (i + 1) for j in range(C)]
            assert [ctx.get(dut.acc_row[j]) for j in range(C)] == want

    run(dut, bench)


def test_readout_out_of_range_row_reads_zero(style):
    config = TileConfig(rows=3, cols=5)
    dut = MacArray(config, dsp_accumulator=style)

    async def bench(ctx):
        idle(ctx, dut)
        await set_bias(ctx, dut, [7, 8, 9])
        ctx.set(dut.row, 3)
        await ctx.tick()
        assert [ctx.get(dut.acc_row[j]) for j in range(5)] == [0] * 5

    run(dut, bench)


# -- timing ----------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 7])
def test_throughput_busy_and_macs(k, style):
    """k back-to-back steps from cycle 0 are all in ACC in cycle k - 1 + LATENCY; busy
    covers cycles 1 .. k - 1 + LATENCY - 1 exactly; macs reports R*C per step."""
    dut = MacArray(CFG, dsp_accumulator=style)
    rng = random.Random(k)
    steps = [(rand_lanes(rng, 8), rand_lanes(rng, 8)) for _ in range(k)]
    model = np.zeros((8, 8), dtype=np.int32)
    for a, b in steps:
        model = matmul_step(model, a, b)

    async def bench(ctx):
        idle(ctx, dut)
        await set_bias(ctx, dut, [0] * 8)
        busy, macs, ready = [], [], []
        done = k - 1 + LATENCY
        for cycle in range(done + 3):
            if cycle < k:
                a, b = steps[cycle]
                ctx.set(dut.step.payload.a, a)
                ctx.set(dut.step.payload.b, b)
                ctx.set(dut.step.payload.first, cycle == 0)
                ctx.set(dut.step.valid, 1)
            else:
                ctx.set(dut.step.valid, 0)
            ctx.set(dut.row, 0)
            busy.append(ctx.get(dut.busy))
            macs.append(ctx.get(dut.macs))
            ready.append(ctx.get(dut.step.ready))
            await ctx.tick()
            # acc_row now shows row 0 as it was in `cycle`.
            row0 = [ctx.get(dut.acc_row[j]) for j in range(8)]
            if cycle == done - 1:
                assert row0 != list(model[0])
            if cycle >= done:
                assert row0 == list(model[0])
        assert all(ready)
        assert busy == [0] + [1] * (done - 1) + [0] * 3
        assert macs == [0, 0] + [64] * k + [0] * (len(macs) - k - 2)
        np.testing.assert_array_equal(await read_acc(ctx, dut), model)

    run(dut, bench)


def test_single_step_latency(style):
    """A step accepted in cycle t is first visible in ACC in cycle t + LATENCY."""
    dut = MacArray(CFG, dsp_accumulator=style)

    async def bench(ctx):
        idle(ctx, dut)
        ctx.set(dut.row, 2)
        assert (ctx.get(dut.busy), ctx.get(dut.macs)) == (0, 0)
        await send_step(ctx, dut, [3] * 8, [-5] * 8, 1)      # cycle t
        seen = []
        for _ in range(LATENCY + 1):                         # cycles t+1 .. t+LATENCY+1
            seen.append((ctx.get(dut.busy), ctx.get(dut.macs)))
            await ctx.tick()
            seen[-1] += (ctx.get(dut.acc_row[0]),)           # ACC in that cycle
        assert seen == [(1, 0, 0), (1, 64, 0), (0, 0, -15), (0, 0, -15)]

    run(dut, bench)


def test_drain_then_read_matches_after_bubbly_stream(style):
    """The sequencer's protocol: steps, wait for busy low, then read rows at once."""
    rng = random.Random(11)
    dut = MacArray(CFG, dsp_accumulator=style)

    async def bench(ctx):
        idle(ctx, dut)
        model = np.zeros((8, 8), dtype=np.int32)
        for t in range(10):
            a, b = rand_lanes(rng, 8), rand_lanes(rng, 8)
            await send_step(ctx, dut, a, b, t == 0)
            model = matmul_step(np.zeros_like(model) if t == 0 else model, a, b)
            if t % 3 == 2:
                await ctx.tick()
        waited = await drain(ctx, dut)
        assert waited == LATENCY - 1
        np.testing.assert_array_equal(await read_acc(ctx, dut), model)

    run(dut, bench)


def test_abort_drops_steps_in_flight(style):
    dut = MacArray(CFG, dsp_accumulator=style)

    async def bench(ctx):
        idle(ctx, dut)
        await set_bias(ctx, dut, [100] * 8)
        await send_step(ctx, dut, [1] * 8, [1] * 8, 0)       # lands: 101
        await drain(ctx, dut)
        await send_step(ctx, dut, [1] * 8, [1] * 8, 0)       # in the product stage
        await send_step(ctx, dut, [1] * 8, [1] * 8, 1)       # in the operand stage
        ctx.set(dut.step.valid, 1)                           # offered during abort
        ctx.set(dut.abort, 1)
        assert ctx.get(dut.step.ready) == 0
        assert ctx.get(dut.macs) == 64                       # the product stage's lands
        await ctx.tick()
        ctx.set(dut.abort, 0)
        ctx.set(dut.step.valid, 0)
        assert not ctx.get(dut.busy)
        for _ in range(LATENCY):
            assert ctx.get(dut.macs) == 0
            await ctx.tick()
        # 101 + 1: the step that was in the product stage; not the one that was in the
        # operand stage (first=1 would have cleared ACC to 1).
        np.testing.assert_array_equal(await read_acc(ctx, dut), np.full((8, 8), 102))

    run(dut, bench)


def test_built_for_area_in_dsp_blocks_as_in_the_fabric():
    """Built for area (``compact``), the DSP arrangement copies its operand stage into
    the DSP's as it is: ACC, ``busy`` and ``macs`` are the fabric's, cycle by cycle,
    under random steps, biases (while ``busy`` is low, as the contract asks) and
    aborts (the bias held through the cycle after ``bias_valid``)."""
    from amaranth.hdl import Module

    compact = TileConfig(rows=2, cols=2, word_bytes=4, compact=True)
    area = MacArray(compact, dsp_accumulator=True)
    fabric = MacArray(TileConfig(rows=2, cols=2, word_bytes=4), dsp_accumulator=False)
    top = Module()
    top.submodules.area, top.submodules.fabric = area, fabric
    rng = random.Random(11)

    async def bench(ctx):
        bias = 0
        for cycle in range(600):
            valid = int(rng.random() < 0.6)
            payload = rng.getrandbits(65)
            held = ctx.get(fabric.bias_valid)   # the bias holds through the next cycle
            bias_valid = int(not ctx.get(fabric.busy) and rng.random() < 0.1)
            bias = bias if held else rng.getrandbits(64)
            abort = int(rng.random() < 0.05)
            row = rng.randrange(2)
            for dut in (area, fabric):
                ctx.set(dut.step.valid, valid)
                ctx.set(dut.step.payload.as_value(), payload)
                ctx.set(dut.bias_valid, bias_valid)
                ctx.set(dut.bias_value.as_value(), bias)
                ctx.set(dut.abort, abort)
                ctx.set(dut.row, row)
            await ctx.tick()
            assert [ctx.get(area.acc_row.as_value()), ctx.get(area.busy),
                    ctx.get(area.macs)] == [ctx.get(fabric.acc_row.as_value()),
                                            ctx.get(fabric.busy), ctx.get(fabric.macs)], cycle

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
