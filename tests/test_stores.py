# amaranth: UnusedElaboratable=no

import random
from dataclasses import replace

import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator

from fusetile.hdl.regmap import tile_memory_map, PLAN_BASE, SLOT_BASE
from fusetile.hdl.stores import PlanStore, KernelStore
from fusetile.kernels.config import TileConfig

from wb_helpers import wb_read, wb_write


CFG = TileConfig(plan_depth=16, slot_depth=8, kernel_slots=3)
#: Both builds of the host's read path: the instruction registered whole, then its word
#: (the default), or its word alone (built for area, ``compact``).
CONFIGS = pytest.mark.parametrize("cfg", [CFG, replace(CFG, compact=True)],
                                  ids=["deep", "compact"])


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 'x'"):
        PlanStore("x")
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 'x'"):
        KernelStore("x")


@pytest.mark.parametrize("config", [TileConfig(), CFG])
def test_windows_match_memory_map(config):
    mm = tile_memory_map(config)
    plan, kern = PlanStore(config), KernelStore(config)
    assert mm["PLAN[1]"].addr - mm["PLAN[0]"].addr == plan.span
    assert mm["KERNEL[1]"].addr - mm["KERNEL[0]"].addr == kern.span
    assert 4 << len(plan.bus.adr) == 2 * plan.span
    assert 4 << len(kern.bus.adr) >= config.kernel_slots * kern.span


@CONFIGS
def test_plan_round_trip_and_read_port(cfg):
    dut = PlanStore(cfg)
    rng = random.Random(2)
    half = dut.span // 4                        # host words per bank

    async def bench(ctx):
        ctx.set(dut.active_bank, 1)
        model = {}
        for bank in (0,):
            for i in range(CFG.plan_depth):
                v = rng.getrandbits(64)
                assert await wb_write(ctx, dut.bus, bank * half + 2 * i, v & 0xFFFFFFFF) == "ack"
                assert await wb_write(ctx, dut.bus, bank * half + 2 * i + 1, v >> 32) == "ack"
                model[bank, i] = v
        ctx.set(dut.active_bank, 0)
        for i in range(CFG.plan_depth):
            v = rng.getrandbits(64)
            assert await wb_write(ctx, dut.bus, half + 2 * i, v & 0xFFFFFFFF) == "ack"
            assert await wb_write(ctx, dut.bus, half + 2 * i + 1, v >> 32) == "ack"
            model[1, i] = v
        # Host reads of either bank at any time (bank 0 is active now).
        for (bank, i), v in model.items():
            assert await wb_read(ctx, dut.bus, bank * half + 2 * i) == (v & 0xFFFFFFFF, "ack")
            assert await wb_read(ctx, dut.bus, bank * half + 2 * i + 1) == (v >> 32, "ack")
        # Control-unit read port: one cycle latency, back to back.
        order = list(model)
        rng.shuffle(order)
        for bank, i in order:
            ctx.set(dut.rd_bank, bank)
            ctx.set(dut.rd_pc, i)
            ctx.set(dut.rd_en, 1)
            await ctx.tick()
            assert ctx.get(dut.rd_data) == model[bank, i]

    run(dut, bench)


@CONFIGS
@pytest.mark.parametrize("store", [PlanStore, KernelStore])
def test_shared_read_port(store, cfg):
    """With ``shared_read`` the host reads through the control unit's port: a read waits
    while ``rd_en`` is high (the control unit fetching, its word out the next cycle as
    always) and is answered two cycles after the first cycle ``rd_en`` is low."""
    dut = store(cfg, shared_read=True)
    rng = random.Random(7)
    plan = store is PlanStore
    words = 2 if plan else 4                    # host words per instruction
    depth = CFG.plan_depth if plan else CFG.slot_depth
    units = 2 if plan else CFG.kernel_slots
    span = dut.span // 4

    def rd_addr(ctx, unit, i):
        ctx.set(dut.rd_bank if plan else dut.rd_slot, unit)
        ctx.set(dut.rd_pc if plan else dut.rd_upc, i)

    async def bench(ctx):
        if plan:
            ctx.set(dut.active_bank, 1)
        model = {}
        for unit in range(units):
            if plan:
                ctx.set(dut.active_bank, 1 - unit)
            for i in range(depth):
                v = rng.getrandbits(32 * words)
                for w in range(words):
                    addr = unit * span + words * i + w
                    assert await wb_write(ctx, dut.bus, addr, v >> 32 * w & 0xFFFFFFFF) == "ack"
                model[unit, i] = v
        # The control unit reads for 5 cycles while the host's read waits.
        (unit, i), (cu, ci) = rng.sample(sorted(model), 2)
        bus = dut.bus
        ctx.set(bus.cyc, 1); ctx.set(bus.stb, 1); ctx.set(bus.we, 0); ctx.set(bus.sel, 0xF)
        ctx.set(bus.adr, unit * span + words * i + 1)
        ctx.set(dut.rd_en, 1)
        rd_addr(ctx, cu, ci)
        for _ in range(5):
            await ctx.tick()
            assert not ctx.get(bus.ack)
            assert ctx.get(dut.rd_data) == model[cu, ci]
        ctx.set(dut.rd_en, 0)
        await ctx.tick()        # the host's read gets the port: its word comes out
        assert not ctx.get(bus.ack)
        await ctx.tick()        # ...is registered (whole, or its word when compact)
        assert not ctx.get(bus.ack)
        await ctx.tick()        # ...and is answered, its word registered
        assert ctx.get(bus.ack)
        assert ctx.get(bus.dat_r) == model[unit, i] >> 32 & 0xFFFFFFFF
        ctx.set(bus.cyc, 0); ctx.set(bus.stb, 0)
        await ctx.tick()
        # Idle control unit: host reads at once, everything back.
        for (unit, i), v in model.items():
            for w in range(words):
                assert await wb_read(ctx, bus, unit * span + words * i + w) == \
                    (v >> 32 * w & 0xFFFFFFFF, "ack")

    run(dut, bench)


def test_plan_refused_and_errors():
    dut = PlanStore(CFG)
    half = dut.span // 4

    async def bench(ctx):
        assert await wb_write(ctx, dut.bus, half + 6, 0x1234) == "ack"     # bank 1
        ctx.set(dut.active_bank, 1)
        refused = []

        async def write(adr, data, sel=0xF):
            ctx.set(dut.bus.cyc, 1); ctx.set(dut.bus.stb, 1); ctx.set(dut.bus.we, 1)
            ctx.set(dut.bus.adr, adr); ctx.set(dut.bus.dat_w, data); ctx.set(dut.bus.sel, sel)
            await ctx.tick()
            status = (ctx.get(dut.bus.ack), ctx.get(dut.bus.err), ctx.get(dut.refused))
            ctx.set(dut.bus.stb, 0); ctx.set(dut.bus.cyc, 0)
            await ctx.tick()
            assert not ctx.get(dut.refused)
            return status

        assert await write(half + 6, 0x5678) == (0, 1, 1)
        assert await wb_read(ctx, dut.bus, half + 6) == (0x1234, "ack")
        assert await write(6, 0x5678) == (1, 0, 0)                        # inactive bank
        assert await wb_read(ctx, dut.bus, 6) == (0x5678, "ack")
        # Partial words: ERR without the refused pulse, memory unchanged.
        assert await write(6, 0xFFFFFFFF, sel=0x3) == (0, 1, 0)
        assert await wb_read(ctx, dut.bus, 6) == (0x5678, "ack")
        # The control unit still reads the active bank.
        ctx.set(dut.rd_bank, 1); ctx.set(dut.rd_pc, 3); ctx.set(dut.rd_en, 1)
        await ctx.tick()
        assert ctx.get(dut.rd_data) == 0x1234

    run(dut, bench)


def test_plan_out_of_range():
    # plan_depth is a power of two, so the windows are exactly full: every address of
    # the 2 * span window is backed. Out-of-range accesses exist only for kernel slots.
    dut = PlanStore(CFG)
    assert 4 << len(dut.bus.adr) == 2 * CFG.plan_depth * 8


@CONFIGS
def test_kernel_round_trip_lock_and_range(cfg):
    dut = KernelStore(cfg)
    span = dut.span // 4
    rng = random.Random(3)

    async def bench(ctx):
        model = {}
        for slot in range(CFG.kernel_slots):
            for i in range(CFG.slot_depth):
                v = rng.getrandbits(128)
                for w in range(4):
                    adr = slot * span + 4 * i + w
                    assert await wb_write(ctx, dut.bus, adr, (v >> 32 * w) & 0xFFFFFFFF) == "ack"
                model[slot, i] = v
        for (slot, i), v in list(model.items())[::5]:
            for w in range(4):
                assert await wb_read(ctx, dut.bus, slot * span + 4 * i + w) == \
                    ((v >> 32 * w) & 0xFFFFFFFF, "ack")
        # Read port: 1-cycle latency, back to back.
        keys = list(model)
        rng.shuffle(keys)
        for slot, i in keys:
            ctx.set(dut.rd_slot, slot); ctx.set(dut.rd_upc, i); ctx.set(dut.rd_en, 1)
            await ctx.tick()
            assert ctx.get(dut.rd_data) == model[slot, i]
        ctx.set(dut.rd_en, 0)
        # Slot 3 does not exist (kernel_slots = 3): ERR both ways.
        assert await wb_write(ctx, dut.bus, 3 * span, 1) == "err"
        assert (await wb_read(ctx, dut.bus, 3 * span + 5))[1] == "err"
        assert await wb_write(ctx, dut.bus, 0, 1, sel=0xE) == "err"
        # Locked slot: ERR, unchanged, refused pulse aligned with ERR.
        ctx.set(dut.lock, 1); ctx.set(dut.locked_slot, 1)
        ctx.set(dut.bus.cyc, 1); ctx.set(dut.bus.stb, 1); ctx.set(dut.bus.we, 1)
        ctx.set(dut.bus.adr, span + 4); ctx.set(dut.bus.dat_w, 0); ctx.set(dut.bus.sel, 0xF)
        await ctx.tick()
        assert (ctx.get(dut.bus.ack), ctx.get(dut.bus.err), ctx.get(dut.refused)) == (0, 1, 1)
        ctx.set(dut.bus.stb, 0); ctx.set(dut.bus.cyc, 0)
        await ctx.tick()
        assert not ctx.get(dut.refused) and not ctx.get(dut.bus.err)
        assert await wb_read(ctx, dut.bus, span + 4) == (model[1, 1] & 0xFFFFFFFF, "ack")
        # Other slots stay writable; unlocking makes slot 1 writable again.
        assert await wb_write(ctx, dut.bus, 2 * span, 7) == "ack"
        ctx.set(dut.lock, 0)
        assert await wb_write(ctx, dut.bus, span + 4, 9) == "ack"
        assert await wb_read(ctx, dut.bus, span + 4) == (9, "ack")
        # While `hold` is high a write waits, unanswered; a read does not.
        ctx.set(dut.hold, 1)
        ctx.set(dut.bus.cyc, 1); ctx.set(dut.bus.stb, 1); ctx.set(dut.bus.we, 1)
        ctx.set(dut.bus.adr, span + 4); ctx.set(dut.bus.dat_w, 11); ctx.set(dut.bus.sel, 0xF)
        for _ in range(3):
            await ctx.tick()
            assert not ctx.get(dut.bus.ack) and not ctx.get(dut.bus.err)
        ctx.set(dut.hold, 0)
        await ctx.tick()
        assert ctx.get(dut.bus.ack)
        ctx.set(dut.bus.stb, 0); ctx.set(dut.bus.cyc, 0)
        await ctx.tick()
        ctx.set(dut.hold, 1)
        assert await wb_read(ctx, dut.bus, span + 4) == (11, "ack")
        ctx.set(dut.hold, 0)

    run(dut, bench)


def test_verilog():
    verilog.convert(PlanStore(CFG), name="plan_store")
    verilog.convert(KernelStore(CFG), name="kernel_store")
