"""The golden model (kernels/model.py) and the ``model`` transport.

* every spine scenario of ``tests/scenarios.py`` on the model transport;
* directed tests of each compute micro-instruction, plan control flow and
  speculation, against hand-computed expectations;
* a differential test: random DMA-only programs on the model and on the RTL in
  Amaranth's simulator, compared word for word and counter for counter.
"""

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fusetile.host import open_transport
from fusetile.host.device import Device, TileFault
from fusetile.host.model_transport import ModelTransport
from fusetile.host.transport import BusError, transport_class
from fusetile.kernels.config import MAC_LATENCY, VECTOR_LATENCY, TileConfig
from fusetile.kernels.isa import (CmpOp, FaultCause, GmemBase, MicroInstr, MicroOp, PlanInstr,
                                  PlanOp, VectorCfg, TraceRecord)
from fusetile.kernels.model import TileModel
from fusetile.kernels.program import (
    acc_bias, assume, branch, call, commit, dma_load, dma_store, done, jump, mark,
    matmul, micro_nop, nop, requant, ret, switch, vadd, vargmax, vcfg, vclamp, vcmp, vpool,
    wait)

from scenarios import SCENARIOS


# As tests/test_tile.py.
CONFIG = TileConfig(gmem_bytes=4096, spad_bank_words=128, trace_depth=8)


# -- the spine scenarios ------------------------------------------------------------------

@pytest.fixture
def dev():
    with open_transport("model", config=CONFIG) as transport:
        yield Device(transport)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_scenario(dev, scenario):
    scenario(dev)


# -- the transport ---------------------------------------------------------------------------

def test_registered():
    assert transport_class("model") is ModelTransport
    with pytest.raises(TypeError, match="config must be a TileConfig"):
        ModelTransport(config=1)


def test_bus_timing_and_csr_semantics():
    t = ModelTransport(CONFIG)
    d = Device(t)
    before = t.cycles
    d.status()
    assert t.cycles == before + 2, "an access is seen in one cycle and answered in the next"
    d.transport.wait_cycles(10)
    assert t.cycles == before + 12

    # Counter LO latches HI: a HI read returns the shadow of the last LO read.
    t.model.counters["plan_retired"] = 5 << 32 | 7
    lo_addr = d.memory_map["PLAN_RETIRED"].addr
    assert t.read32(lo_addr) == 7
    t.model.counters["plan_retired"] = 9 << 32
    assert t.read32(lo_addr + 4) == 5
    with pytest.raises(BusError):
        t.write32(lo_addr, 0)

    # Read-only registers and unmapped addresses answer ERR; W1 fields read as 0.
    with pytest.raises(BusError):
        t.write32(d.regs.STATUS.addr, 0)
    with pytest.raises(BusError):
        t.read32(0x0FFC)
    assert t.read32(d.regs.CTRL.addr) == 0
    assert int(d.regs.IRQ_ENABLE.read().fault) == 1
    assert int(d.regs.HWCFG_GMEM.read().bytes) == CONFIG.gmem_bytes

    # A kernel window beyond the last slot answers ERR (the window is a power of two).
    cfg6 = TileConfig(gmem_bytes=4096, spad_bank_words=128, kernel_slots=6)
    t6 = ModelTransport(cfg6)
    with pytest.raises(BusError):
        t6.read32(Device(t6).memory_map["KERNEL[5]"].addr + cfg6.slot_depth * 16)


def test_trace_data_pops_and_refused_writes():
    d = Device(ModelTransport(CONFIG))
    d.set_partition(0, base=0, length=8)
    d.load_kernel(0, [ret()], part=0)
    d.load_plan([call(0), call(0), done()])
    d.start()
    d.wait_done(timeout_cycles=1000, poll_cycles=4)
    assert int(d.regs.TRACE_STATUS.read().level) == 2
    first = [d.regs.TRACE_DATA.read_raw() for _ in range(8)]
    assert TraceRecord.from_bits(sum(w << 32 * i for i, w in enumerate(first))).pc == 0
    assert int(d.regs.TRACE_STATUS.read().level) == 1
    assert [r.pc for r in d.read_trace()] == [1]
    assert d.regs.TRACE_DATA.read_raw() == 0, "an empty FIFO reads 0"

    active = int(d.status().active_bank)
    addr = d.memory_map[f"PLAN[{active}]"].addr + 8
    with pytest.raises(BusError):
        d.transport.write32(addr, 1)
    assert int(d.regs.REFUSED_ADDR.read().addr) == addr
    assert d.counter("refused_writes") == 1
    assert d.read_plan(active, 2)[1] == call(0), "a refused write changes nothing"


# -- directed tests of the compute micro-instructions -------------------------------------

SMALL = TileConfig(rows=4, cols=3, gmem_bytes=4096, spad_bank_words=128, trace_depth=8,
                   staging_words=8)
BASE, LENGTH = 16, 64          # partition 1 of every directed test


def word(*lanes, wb=8):
    """The bytes of a scratchpad word with int8 ``lanes`` (the rest 0)."""
    return np.array(list(lanes) + [0] * (wb - len(lanes)), dtype=np.int8).tobytes()


def lanes_at(m, offset, count=1):
    """int8 lanes of ``count`` words from partition offset ``offset``."""
    raw = m.read_spad(BASE + offset, count)
    return np.frombuffer(raw, dtype=np.int8).reshape(count, -1).tolist()


def run_kernel(micro, *, m=None, config=SMALL, spad=None):
    """Run ``micro`` + RET as slot 0 bound to partition 1; returns (model, fault)."""
    m = m or TileModel(config)
    m.set_partition(1, base=BASE, length=LENGTH)
    for offset, data in (spad or {}).items():
        m.write_spad(BASE + offset, data)
    m.load_kernel(0, list(micro) + [ret()], part=1)
    m.load_plan([call(0), done()])
    return m, m.run(max_cycles=100_000)


def bias_words(values):
    return np.array(values, dtype="<i4").tobytes()


def test_matmul_overwrite_accumulate_strides():
    spad = {
        # A operand words at 0 and 2 (a_stride 2); lane 4 is beyond R and ignored.
        0: word(1, -2, 3, 4, 100), 2: word(5, 6, -7, 8),
        # B operand words at 10 and 13 (b_stride 3); lane 3 is beyond C.
        10: word(2, 1, -1, 9), 13: word(-3, 0, 4),
        20: bias_words([11, 22, 33, 44]),
    }
    m, fault = run_kernel([
        acc_bias(20),                                              # garbage to overwrite
        matmul(a=0, a_stride=2, b=10, b_stride=3, k=2),            # overwrite
        matmul(a=0, b=13, k=1, accumulate=True),                   # += outer(a0, b1)
        matmul(a=0, b=10, k=0),                                    # k = 0: no change
    ], spad=spad)
    assert fault is None
    assert m.acc.tolist() == [[-16, 1, 23], [-16, -2, 18], [18, 3, -19], [-28, 4, 44]]
    assert m.counters["macs"] == 3 * 4 * 3
    assert m.counters["mac_busy"] > 0


def test_matmul_wraps_and_acc_bias():
    m, fault = run_kernel([acc_bias(0)], spad={
        0: bias_words([-5, 7, 2**31 - 1, -2**31])})
    assert fault is None
    assert m.acc.tolist() == [[-5] * 3, [7] * 3, [2**31 - 1] * 3, [-2**31] * 3]

    m, fault = run_kernel([acc_bias(0), matmul(a=4, b=5, k=1, accumulate=True)], spad={
        0: bias_words([2**31 - 1, -2**31, 0, 5]), 4: word(1, -1, 0, 0), 5: word(1, 1, 1)})
    assert fault is None
    assert m.acc.tolist() == [[-2**31] * 3, [2**31 - 1] * 3, [0] * 3, [5] * 3]


def test_requant_per_tensor_saturates():
    m, fault = run_kernel([
        acc_bias(0),
        vcfg("MULT_A", 2**30), vcfg("SHIFT", 0), vcfg("ZP_OUT", 3), vcfg("LO", 2),
        vcfg("HI", 100),
        requant(out=20, out_stride=2),
    ], spad={0: bias_words([3, 5, -3, 1000])})
    assert fault is None
    # acc / 2 rounded half to even, + 3, clamped to [2, 100]; lanes >= C are 0.
    assert lanes_at(m, 20, 7)[::2] == [
        [5, 5, 5, 0, 0, 0, 0, 0], [5, 5, 5, 0, 0, 0, 0, 0],
        [2, 2, 2, 0, 0, 0, 0, 0], [100, 100, 100, 0, 0, 0, 0, 0]]
    assert m.counters["saturations"] == 6
    assert m.counters["vec_busy"] > 0


def test_requant_per_channel():
    table = b""
    for mult, shift in ((2**30, 0), (2**30, 2), (2**29, 1), (2**31 - 1, 0)):
        table += mult.to_bytes(4, "little") + bytes([shift, 0xAA, 0xAA, 0xAA])
    m, fault = run_kernel([acc_bias(0), requant(out=40, per_channel=True, params=30)],
                          spad={0: bias_words([64, 64, -64, 7]), 30: table})
    assert fault is None
    assert [row[:4] for row in lanes_at(m, 40, 4)] == [
        [32, 32, 32, 0], [8, 8, 8, 0], [-8, -8, -8, 0], [7, 7, 7, 0]]


def test_vadd():
    m, fault = run_kernel([
        vcfg("MULT_A", 2**30), vcfg("MULT_B", 2**30), vcfg("SHIFT", 0), vcfg("ZP_A", 1),
        vcfg("ZP_B", -2), vcfg("ZP_OUT", 5),
        vadd(a=0, b=2, out=4, n=2),
    ], spad={0: word(1, 2, 3, 127, -128, 0, 10, 11) + word(0),
             2: word(-2, -2, -2, 127, -128, 0, 1, -1) + word(0)})
    assert fault is None
    # ((a - 1) + (b + 2)) / 2, ties to even, + 5, clamped to 127.
    assert lanes_at(m, 4, 2) == [[5, 5, 6, 127, -123, 5, 11, 11], [5] * 8]
    assert m.counters["saturations"] == 1


POOL_IN = {0: word(1, -5, 3, 0, 0, 0, 0, 9) + word(2, -6, 1, 0, 0, 0, 0, -9) +
           word(*[-1] * 8) + word(-2, 0, -3, 4, 5, 6, 7, 8)}


def test_vpool_max_average_pairs():
    m, fault = run_kernel([
        vpool(src=0, out=10, n=2, window=2, stride=1, step=2),                 # max
        vcfg("MULT_A", 2**30), vcfg("SHIFT", 0),
        vpool(src=0, out=12, n=2, window=2, stride=1, step=2, average=True),   # mean of 2
        vpool(src=3, out=14, n=1, window=1, stride=0, step=0, pairs=True),     # pair max
        vcfg("MULT_A", 2**29),
        vpool(src=0, out=15, n=1, window=2, stride=1, step=0, average=True, pairs=True),
    ], spad=POOL_IN)
    assert fault is None
    assert lanes_at(m, 10, 2) == [[2, -5, 3, 0, 0, 0, 0, 9], [-1, 0, -1, 4, 5, 6, 7, 8]]
    assert lanes_at(m, 12, 2) == [[2, -6, 2, 0, 0, 0, 0, 0], [-2, 0, -2, 2, 2, 2, 3, 4]]
    assert lanes_at(m, 14) == [[0, 4, 6, 8, 0, 0, 0, 0]]
    assert lanes_at(m, 15) == [[-2, 1, 0, 0, 0, 0, 0, 0]]


def test_vclamp():
    m, fault = run_kernel([vclamp(src=0, out=1, n=1, lo=-3, hi=4)],
                          spad={0: word(-10, -3, 0, 4, 5, 127, -128, 2)})
    assert fault is None
    assert lanes_at(m, 1) == [[-3, -3, 0, 4, 4, 4, -3, 2]]


def test_vcmp_lane_and_reduce():
    m, fault = run_kernel([
        vcmp(addr=0, lane=10, op="GE", imm=9, flag=0),                  # lane 10 = 9
        vcmp(addr=0, lane=10, op=CmpOp.GT, imm=9, flag=1),
        vcmp(addr=0, lane=10, op="LT", imm=10, flag=2),
        vcmp(addr=0, lane=10, op="EQ", imm=9, flag=3),
        vcmp(addr=0, lane=10, op="GT", imm=49, flag=4, reduce=True),    # max(0..10) = 50
        vcmp(addr=0, lane=8, op="EQ", imm=7, flag=5, reduce=True),      # max(0..8) = 7
        vcmp(addr=1, lane=3, op="LT", imm=0, flag=6),                   # word 1 lane 3 = -9
    ], spad={0: word(0, 1, 2, 3, 4, 5, 6, 7) + word(-1, 50, 9, -9)})
    assert fault is None
    assert m.flags == [1, 0, 1, 1, 1, 1, 1, 0]


def test_vargmax_lowest_lane_on_ties():
    m, fault = run_kernel([vargmax(addr=0, n=9, index=2), vargmax(addr=0, n=10, index=1),
                           vargmax(addr=1, n=1, index=3)],
                          spad={0: word(1, 5, 2, 7, 0, 0, 0, 0) + word(7, 9)})
    assert fault is None
    assert m.index == [0, 9, 3, 0]


def test_vargmax_column_and_test():
    """Column mode: the word number of the largest of one lane over n words (the lowest
    on ties, other lanes ignored); ``test`` writes F[flag] = (result == expect)."""
    spad = {0: word(1, -128, 99) + word(2, -128, 99) + word(9, -128, 0) + word(9, -128, 1)
               + word(-3, -127, 127)}
    m, fault = run_kernel([
        vargmax(addr=0, n=5, index=0, lane=0),                  # 9 at words 2 and 3: 2
        vargmax(addr=0, n=4, index=1, lane=1),                  # all -128: 0
        vargmax(addr=0, n=5, index=2, lane=1, flag=6, expect=4),    # -127 at word 4: hit
        vargmax(addr=3, n=1, index=3, lane=7, flag=5, expect=1),    # n = 1: 0, a miss
        vargmax(addr=0, n=12, index=0, lane=0, flag=0, expect=0),   # packed is 2 (99)...
    ], spad=spad)
    assert fault is None
    assert m.index == [2, 0, 4, 0]
    assert m.flags == [0, 0, 0, 0, 0, 0, 1, 0]
    # ... and packed mode with test, both ways; flags may be set and cleared.
    m, fault = run_kernel([vargmax(addr=0, n=12, index=1, flag=3, expect=2),
                           vargmax(addr=0, n=12, index=2, flag=4, expect=3),
                           vargmax(addr=0, n=3, index=3, lane=2, flag=3, expect=1)],
                          m=m, spad=spad)
    assert fault is None
    assert m.index[1:] == [2, 2, 0] and m.flags[3:5] == [0, 0]
    assert m.flags[6] == 1, "flags the program does not write keep their values"

    # A column reads n words: n + VECTOR_LATENCY + 1 cycles of the vector unit, like
    # packed mode's ceil(n / W) + VECTOR_LATENCY + 1.
    m, fault = run_kernel([vargmax(addr=0, n=5, index=0, lane=2, flag=1, expect=0)], spad=spad)
    assert fault is None and m.counters["vec_busy"] == 5 + VECTOR_LATENCY + 1
    assert m.index[0] == 4 and m.flags[1] == 0
    m, fault = run_kernel([vargmax(addr=0, n=17, index=0)], spad=spad)
    assert m.counters["vec_busy"] == 3 + VECTOR_LATENCY + 1


@pytest.mark.parametrize("vector_lanes", [None, 2])
def test_compact_vector_unit_cycles(vector_lanes):
    """Built for area (``TileConfig.compact``), the scaled vector instructions (VADD,
    an average VPOOL) take 5 cycles fewer and REQUANT 2, and the unscaled ones
    (VCLAMP, a maximum VPOOL, VCMP, VARGMAX) 9 fewer, and 3 more with 4 passes (their
    results do not wait for the passes), as the RTL's do (``tests/test_compute.py``,
    test_timing_in_passes); the results are the same. Those with products in their
    operand check (REQUANT, VPOOL) spend 15 cycles more in it (``hdl/operands.py``)."""
    deep = dataclasses.replace(SMALL, vector_lanes=vector_lanes)
    compact = dataclasses.replace(deep, compact=True)
    spad = {0: bytes(range(0, 256, 3))}
    kernels = {
        "requant": [vcfg(VectorCfg.MULT_A, 2**30), requant(out=40)],
        "vadd": [vcfg(VectorCfg.MULT_A, 2**30), vcfg(VectorCfg.MULT_B, 2**29),
                 vadd(a=0, b=7, out=40, n=6)],
        "vclamp": [vclamp(src=0, out=40, n=5, lo=-3, hi=9)],
        "vpool": [vpool(src=0, stride=2, step=1, out=40, n=3, window=2, average=1)],
        "vpool max": [vpool(src=0, stride=2, step=1, out=40, n=3, window=2)],
        "vcmp": [vcmp(addr=0, lane=1, flag=2, op=CmpOp.GT, imm=5)],
        "vargmax": [vargmax(addr=0, n=9, index=1)],
    }
    for name, micro in kernels.items():
        (md, _), (mc, _) = (run_kernel(micro, config=c, spad=spad) for c in (deep, compact))
        scaled = name in ("requant", "vadd", "vpool")
        passes = deep.vector_passes
        less = {"requant": 2}.get(name, 5) if scaled else 9 + passes - 1
        checking = 15 if name.startswith(("requant", "vpool")) else 0
        assert compact.check_latency(True) - compact.check_latency(False) == 15
        assert mc.counters["vec_busy"] == md.counters["vec_busy"] - less > 0, name
        assert mc.counters["active_cycles"] == \
            md.counters["active_cycles"] - less + checking, name
        assert mc.read_spad(BASE + 40, 8) == md.read_spad(BASE + 40, 8), name
        assert (mc.flags, mc.index) == (md.flags, md.index), name


def test_vargmax_column_partition_fault():
    """A column's operand ends n - 1 words on (packed: ceil(n / W) - 1): checked whole,
    before anything is written."""
    m, fault = run_kernel([vargmax(addr=LENGTH - 4, n=4, index=1, lane=3, flag=2, expect=7)])
    assert fault is None and m.index[1] == 0 and m.flags[2] == 0
    m, fault = run_kernel([vargmax(addr=LENGTH - 4, n=5, index=1, lane=3, flag=2, expect=0)])
    assert (fault.cause, fault.addr, fault.part, fault.micro_pc) == \
        (FaultCause.PARTITION, LENGTH, 1, 0)
    assert m.flags[2] == 0, "a faulting VARGMAX writes no flag"
    m, fault = run_kernel([vargmax(addr=LENGTH - 4, n=32, index=1)])
    assert fault is None


def _raw(op, field, args):
    return MicroInstr.const({"op": op, "args": {field: args}}).as_bits()


@pytest.mark.parametrize("args", [
    {"n": 3, "column": 1, "lane": SMALL.word_bytes},            # the lane is not in a word
    {"n": 3, "column": 1, "lane": 255, "test": 1},
    {"n": 3, "lane": 1},                                        # a lane without column
    {"n": 3, "flag": 2},                                        # flag / expect without test
    {"n": 3, "column": 1, "expect": 5},
    {"n": 0, "column": 1, "test": 1},
])
def test_vargmax_illegal_encodings(args):
    instr = _raw(MicroOp.VARGMAX, "vargmax", args)
    m, fault = run_kernel([micro_nop(), instr])
    assert fault.cause == FaultCause.ILLEGAL_MICRO and fault.micro_pc == 1
    assert fault.addr == instr & 0xFFFF_FFFF and fault.in_kernel
    assert m.index == [0] * 4 and m.flags == [0] * 8
    assert m.counters["micro_retired"] == 1
    # The largest lane of a word is legal, on every word size.
    wide = TileConfig(word_bytes=16, rows=4, cols=3, gmem_bytes=4096, spad_bank_words=128)
    assert run_kernel([vargmax(addr=0, n=1, index=0, lane=15)], config=wide)[1] is None
    assert run_kernel([vargmax(addr=0, n=1, index=0, lane=15)])[1].cause == \
        FaultCause.ILLEGAL_MICRO


def test_vcfg_truncates_and_reserved_fields_are_illegal():
    m, fault = run_kernel([
        _raw(MicroOp.VCFG, "vcfg", {"reg": VectorCfg.SHIFT, "value": 0x123}),
        _raw(MicroOp.VCFG, "vcfg", {"reg": VectorCfg.ZP_OUT, "value": 0x1FF}),
        vcfg("LO", -7), vcfg("MULT_B", 2**31 - 1),
    ])
    assert fault is None
    assert m.vcfg[VectorCfg.SHIFT] == 3 and m.vcfg[VectorCfg.ZP_OUT] == -1
    assert m.vcfg[VectorCfg.LO] == -7 and m.vcfg[VectorCfg.HI] == 127
    assert m.vcfg[VectorCfg.MULT_B] == 2**31 - 1

    reserved_reg = _raw(MicroOp.VCFG, "raw", 9)            # reg field = 9
    for instr in (reserved_reg, _raw(MicroOp.VARGMAX, "vargmax", {"n": 0}),
                  _raw(MicroOp.VPOOL, "vpool", {"n": 1, "window": 0})):
        m, fault = run_kernel([micro_nop(), instr])
        assert fault.cause == FaultCause.ILLEGAL_MICRO and fault.micro_pc == 1
        assert fault.addr == instr & 0xFFFF_FFFF and fault.in_kernel


def test_compute_unit_runs_beside_the_sequencer():
    spad = {0: word(1, 1, 1, 1), 1: word(1, 1, 1)}
    m, fault = run_kernel([matmul(a=0, b=1, k=20, a_stride=0, b_stride=0), micro_nop(),
                           wait(compute=True)], spad=spad)
    assert fault is None and m.acc.tolist() == [[20] * 3] * 4
    c = m.counters
    busy = 20 + MAC_LATENCY + 1         # k steps, the array's latency, then drained
    assert c["mac_busy"] == busy and c["stall_compute"] > 0 and c["micro_retired"] == 4
    record, = m.trace_records()
    assert record.mac_busy == busy

    # A second compute instruction waits for the unit; RET waits for it too.
    m, fault = run_kernel([matmul(a=0, b=1, k=20, a_stride=0, b_stride=0),
                           matmul(a=0, b=1, k=20, accumulate=True, a_stride=0, b_stride=0)],
                          spad=spad)
    assert fault is None and m.acc.tolist() == [[40] * 3] * 4
    assert m.counters["mac_busy"] == 2 * busy and m.counters["stall_compute"] >= 2 * busy - 4
    assert m.slot_cycles[0] > 2 * busy


def test_compute_partition_fault_is_precise():
    """An instruction with an operand past its partition faults before it does
    anything, with the end of that operand as the address; what came before it
    completed."""
    m, fault = run_kernel([vclamp(src=0, out=LENGTH - 2, n=4, lo=-1, hi=1)],
                          spad={0: word(*[5] * 8) * 4, LENGTH - 2: word(*[9] * 8) * 3})
    assert fault.cause == FaultCause.PARTITION
    assert (fault.part, fault.addr, fault.slot, fault.micro_pc) == (1, LENGTH + 1, 0, 0)
    assert lanes_at(m, LENGTH - 2, 2) == [[9] * 8, [9] * 8], "nothing was written"
    assert m.counters["micro_retired"] == 0

    spad = {0: word(1, 1, 1, 1), LENGTH - 1: word(2, 2, 2, 2)}
    m, fault = run_kernel([matmul(a=0, b=0, k=1), matmul(a=LENGTH - 1, a_stride=1, b=0, k=3,
                                                         accumulate=True)], spad=spad)
    assert fault.cause == FaultCause.PARTITION and fault.addr == LENGTH + 1
    assert fault.micro_pc == 1 and m.counters["micro_retired"] == 1
    assert m.acc.tolist() == [[1] * 3] * 4, "only the first MATMUL took effect"

    # The first operand (in checking order) that does not fit is the one reported.
    m, fault = run_kernel([vadd(a=LENGTH - 1, b=LENGTH, out=0, n=2)])
    assert (fault.cause, fault.addr) == (FaultCause.PARTITION, LENGTH)
    m, fault = run_kernel([vadd(a=0, b=LENGTH - 1, out=LENGTH + 5, n=2)])
    assert (fault.cause, fault.addr) == (FaultCause.PARTITION, LENGTH)


@pytest.mark.parametrize("micro", [vclamp(src=0, out=8, n=1, lo=0, hi=1),
                                   dma_load(gmem=0, spad=0)])
def test_partition_off_a_bank_row_has_no_words(micro):
    """A partition must start at a multiple of ``spad_banks`` (an offset alone names
    its bank); one that does not has no words, as in the scratchpad."""
    m = TileModel(SMALL)
    m.set_partition(1, base=BASE + 1, length=LENGTH)
    m.load_kernel(0, [micro, ret()], part=1)
    m.load_plan([call(0), done()])
    fault = m.run(max_cycles=10_000)
    assert (fault.cause, fault.part, fault.addr) == (FaultCause.PARTITION, 1, 0)


# -- plan control flow ----------------------------------------------------------------------

FLAG_KERNEL = [vcmp(addr=0, lane=0, op="GE", imm=1, flag=3),     # F3 = 1
               vargmax(addr=0, n=8, index=1)]                    # X1 = 2
FLAG_SPAD = {0: word(1, 0, 9, 3)}


def _plan(op, **fields):
    return PlanInstr.const({"op": op, **fields}).as_bits()


def test_branch_jump_switch():
    m, _ = run_kernel(FLAG_KERNEL, spad=FLAG_SPAD)
    m.load_plan([
        branch(3, 3, if_set=False),    # 0: F3 is set: not taken
        branch(3, 4),                  # 1: taken
        mark(0xBAD),                   # 2
        mark(0xBAD),                   # 3
        switch(1, 6, 3),               # 4: X1 = 2 -> 8
        mark(0xBAD),                   # 5
        jump(11), jump(11),            # 6, 7: table entries 0, 1
        jump(10),                      # 8: table entry 2
        mark(0xBAD),                   # 9
        mark(0x600D),                  # 10
        done(),                        # 11
    ])
    m.clear_counters()
    assert m.run() is None
    assert m.mark == 0x600D
    assert (m.branch_taken[3], m.branch_not_taken[3]) == (1, 1)
    assert m.counters["plan_retired"] == 6

    m.load_plan([nop(), switch(1, 0, 2), done()])
    fault = m.run()
    assert fault.cause == FaultCause.SWITCH_RANGE and fault.addr == 2 and fault.plan_pc == 1
    m.clear_fault()
    m.load_plan([jump(SMALL.plan_depth + 5), done()])
    fault = m.run()
    assert fault.cause == FaultCause.PLAN_RANGE and fault.addr == SMALL.plan_depth + 5
    assert fault.plan_pc == 0
    m.clear_fault()
    bad = _plan(PlanOp.BRANCH, sel=8)
    m.load_plan([bad, done()])
    fault = m.run()
    assert fault.cause == FaultCause.ILLEGAL_PLAN and fault.addr == bad & 0xFFFF_FFFF
    m.clear_fault()
    m.load_plan([_plan(PlanOp.JUMP, cond=1), done()])
    assert m.run().cause == FaultCause.ILLEGAL_PLAN


# -- speculation ----------------------------------------------------------------------------

def _spec_model(config=SMALL):
    """A model with GMEM words 0..3 random, partition 0 and two kernels:
    slot 0 (speculative): load 4 words, store them to word 100, wait, VCMP F2 = (lane 0 >= 0),
    store them to word 120; slot 1 (fallback): store zeros to word 140.."""
    m = TileModel(config)
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 4 * config.word_bytes, dtype=np.uint8).tobytes()
    data = bytes([5]) + data[1:]                         # lane 0 of word 0 is 5 >= 0
    m.write_gmem(0, data)
    m.write_gmem(100 * config.word_bytes, bytes(range(200)) * 2)
    m.set_partition(0, base=0, length=64)
    m.load_kernel(0, [dma_load(gmem=0, spad=0, cols=4), wait(),
                      dma_store(gmem=100, spad=0, cols=4), wait(),
                      vcmp(addr=0, lane=0, op="GE", imm=0, flag=2),
                      dma_store(gmem=120, spad=0, cols=4), ret()], part=0)
    m.load_kernel(1, [dma_store(gmem=140, spad=32, cols=2), ret()], part=0)
    return m, data


FALLBACK = [mark(0x11), mark(0x12), call(1), mark(0x13), done()]


def _install(m, plan, fallback=FALLBACK):
    home = m.load_plan(plan)
    m.write_plan(1 - home, fallback)
    m.clear_counters()
    return home


def _unspeculated(config=SMALL, resume=1):
    """GMEM after the fallback alone from ``resume`` (what a miss must leave)."""
    m, _ = _spec_model(config)
    m.load_plan(FALLBACK[resume:])
    assert m.run() is None
    return m.read_gmem(0, config.gmem_bytes)


def test_assume_hit_publishes_staged_stores_at_commit():
    m, data = _spec_model()
    original = m.read_gmem(0, SMALL.gmem_bytes)
    home = _install(m, [assume(2, 1), call(0), commit(), mark(1), done()])
    m.start()
    while not (m.speculating and not m.in_kernel and m.plan_pc == 2):
        m.step()
        assert m.running
    assert m.read_gmem(0, SMALL.gmem_bytes) == original, "stores wait in the staging buffer"
    assert len(m.staging) == 8
    m.run_until_idle()
    assert not m.faulted and m.mark == 1
    wb = SMALL.word_bytes
    assert m.read_gmem(100 * wb, 4 * wb) == data and m.read_gmem(120 * wb, 4 * wb) == data
    assert m.counters["spec_hits"] == 1 and m.counters["spec_misses"] == 0
    assert m.active_bank == m.exec_bank == home and not m.speculating


def test_assume_miss_on_vcmp_rolls_back_to_the_other_bank():
    m, _ = _spec_model()
    # Guess F2 == 0; the kernel's VCMP sets F2 = 1: a miss when the VCMP completes.
    home = _install(m, [nop(), assume(2, 1, expect=False), call(0), commit(), mark(1), done()])
    assert m.run() is None
    assert m.read_gmem(0, SMALL.gmem_bytes) == _unspeculated(resume=1)
    assert m.mark == 0x13 and m.miss_pc == 1
    assert m.exec_bank == 1 - home and m.active_bank == home
    c = m.counters
    assert (c["spec_misses"], c["spec_hits"], c["spec_faults"], c["faults"]) == (1, 0, 0, 0)
    assert c["kernel_calls"] == 1 and c["rollback_cycles"] == 5   # miss to fallback
    abandoned, fallback = m.trace_records()
    assert (abandoned.slot, abandoned.faulted) == (0, 1)
    assert (fallback.slot, fallback.faulted, fallback.bank) == (1, 0, 1 - home)
    # The miss lands when the VCMP completes (as in the RTL), by which time the second
    # store has begun: its words went to the staging buffer and were discarded (GMEM
    # equals the unspeculated run's, above).
    assert abandoned.bytes_out > 4 * SMALL.word_bytes

    # The next run starts in the installed (speculative) bank again, and misses again.
    assert m.run() is None and m.counters["spec_misses"] == 2 and m.mark == 0x13


def test_assume_miss_on_vargmax_test():
    """A VARGMAX with ``test`` writing the guarded flag: a miss as with VCMP when the
    argmax is not the one expected; a hit (at COMMIT) when it is."""
    for expect, hit in ((0, True), (3, False)):
        m, data = _spec_model()
        # Lane 0 of word 0 is 5, of words 1..3 random: put the column's max in word 0.
        m.write_gmem(0, bytes([127]) + data[1:])
        m.write_gmem(SMALL.word_bytes, bytes([0]) + data[SMALL.word_bytes + 1:])
        m.write_gmem(2 * SMALL.word_bytes, bytes([0]) + data[2 * SMALL.word_bytes + 1:])
        m.write_gmem(3 * SMALL.word_bytes, bytes([0]) + data[3 * SMALL.word_bytes + 1:])
        m.load_kernel(0, [dma_load(gmem=0, spad=0, cols=4), wait(),
                          dma_store(gmem=100, spad=0, cols=4), wait(),
                          vargmax(addr=0, n=4, index=2, lane=0, flag=2, expect=expect),
                          wait(compute=True), ret()], part=0)
        _install(m, [assume(2, 1), call(0), commit(), mark(1), done()])
        assert m.run() is None
        c = m.counters
        assert (c["spec_hits"], c["spec_misses"]) == ((1, 0) if hit else (0, 1))
        assert m.mark == (1 if hit else 0x13)
        assert m.index[2] == 0, "the index register is written either way"
        wb = SMALL.word_bytes
        stored = m.read_gmem(100 * wb, 4 * wb)
        assert (stored[:1] == bytes([127])) == hit, "staged stores: published or discarded"


def test_assume_miss_at_commit():
    m, _ = _spec_model()
    _install(m, [assume(5, 0), call(0), commit(), mark(1), done()])   # F5 is 0: guess 1
    assert m.run() is None
    assert m.read_gmem(0, SMALL.gmem_bytes) == _unspeculated(resume=0)
    assert m.mark == 0x13 and m.counters["spec_misses"] == 1
    assert m.counters["kernel_calls"] == 2, "the speculative call completed before COMMIT"


def test_staging_overflow_is_a_miss():
    m, _ = _spec_model()
    m.load_kernel(0, [dma_store(gmem=100, spad=0, cols=SMALL.staging_words + 1), ret()], part=0)
    _install(m, [assume(2, 0), call(0), commit(), done()], [call(1), mark(0x13), done()])
    assert m.run() is None
    assert m.read_gmem(0, SMALL.gmem_bytes) == _unspeculated(resume=2)
    c = m.counters
    assert (c["spec_misses"], c["spec_faults"], c["faults"]) == (1, 0, 0) and m.mark == 0x13


def test_illegal_speculation():
    # COMMIT with no open region stops the tile.
    m, _ = _spec_model()
    _install(m, [nop(), commit(), done()])
    fault = m.run()
    assert fault.cause == FaultCause.ILLEGAL_PLAN and fault.plan_pc == 1
    assert m.counters["faults"] == 1
    m.clear_fault()

    # ASSUME with a flag beyond F7 outside a region stops the tile.
    _install(m, [_plan(PlanOp.ASSUME, sel=8), done()])
    assert m.run().cause == FaultCause.ILLEGAL_PLAN
    m.clear_fault()

    # Inside a region a nested ASSUME (or DONE) is an illegal plan instruction, and like
    # every fault inside a region (hdl/control.py) it rolls back instead of stopping.
    for plan in ([assume(0, 0, expect=False), assume(1, 0), commit(), done()],
                 [assume(0, 0, expect=False), done()]):
        _install(m, plan)
        assert m.run() is None and m.mark == 0x13
        c = m.counters
        assert (c["spec_misses"], c["spec_faults"], c["faults"]) == (1, 1, 0)


# -- differential: the model against the RTL ----------------------------------------------

# A small GMEM: Amaranth's simulator moves about a thousand bus words a second.
DIFF = TileConfig(gmem_bytes=512, spad_bank_words=32, trace_depth=8)


@pytest.fixture(scope="module")
def model_and_rtl():
    """One model and one RTL session for all examples: each example leaves both in the
    same state, so they stay comparable (and are built only once)."""
    with open_transport("model", config=DIFF) as model, \
            open_transport("amaranth", config=DIFF) as rtl:
        yield Device(model), Device(rtl)


def _random_program(rng):
    """A random DMA-only program for DIFF: two kernels of DMAs (some out of their
    partition or off the end of GMEM), WAITs and NOPs; a plan of CALLs, MARKs and NOPs,
    half the time inside an ASSUME .. COMMIT region (flags are 0: the guess is right or
    wrong by its ``cond``) with a fallback plan in the other bank."""
    def dma():
        return (dma_load if rng.random() < 0.5 else dma_store)(
            gmem=rng.randrange(DIFF.gmem_words + 6), spad=rng.randrange(40),
            rows=rng.randrange(4), cols=rng.randrange(7), gmem_stride=rng.randrange(9),
            spad_stride=rng.randrange(9), base=rng.choice(list(GmemBase)),
            token=rng.randrange(4))

    def micro():
        r = rng.random()
        return dma() if r < 0.6 else wait(rng.randrange(16)) if r < 0.85 else micro_nop()

    def plan_item():
        r = rng.random()
        if r < 0.7:
            return call(rng.randrange(2), a=rng.randrange(40), b=rng.randrange(40))
        return mark(rng.randrange(256)) if r < 0.85 else nop()

    body = [plan_item() for _ in range(rng.randrange(1, 5))]
    fallback = None
    if rng.random() < 0.5:
        body = [assume(rng.randrange(8), rng.randrange(4), expect=rng.random() < 0.5)] + \
            body + [commit()]
        fallback = [mark(0x10 + i) for i in range(rng.randrange(3))] + [plan_item(), done()]
    return {
        "parts": [(rng.randrange(100) // DIFF.spad_banks * DIFF.spad_banks, rng.randrange(40))
                  for _ in range(2)],
        "kernels": [[micro() for _ in range(rng.randrange(1, 7))] + [ret()]
                    for _ in range(2)],
        "plan": body + [mark(5), done()],
        "fallback": fallback,
        "gmem": bytes(rng.randrange(256) for _ in range(DIFF.gmem_bytes)),
    }


#: Counters that are architectural, hence exact on every target.
EXACT = ("plan_retired", "micro_retired", "dma_bytes_in", "dma_bytes_out", "kernel_calls",
         "inferences", "swaps", "faults", "refused_writes")


def _run_program(dev, program):
    dev.write_window("GMEM", 0, program["gmem"])
    for i, (base, length) in enumerate(program["parts"]):
        dev.set_partition(i, base=base, length=length)
    for slot, body in enumerate(program["kernels"]):
        dev.load_kernel(slot, body, part=slot)
    dev.read_trace()
    dev.clear_counters()
    home = dev.load_plan(program["plan"])
    if program["fallback"]:
        dev.write_plan(1 - home, program["fallback"])
    dev.start()
    try:
        dev.wait_done(timeout_cycles=20_000, poll_cycles=5)
        fault = None
    except TileFault as e:
        fault = {k: v for k, v in vars(e).items() if k != "args"}
        dev.clear_fault()
    counters = dev.counters()
    return {
        "fault": fault,
        "counters": {name: counters[name] for name in EXACT},
        "slot_calls": [s["calls"] for s in dev.slot_counters()],
        "gmem": dev.read_window("GMEM", 0, DIFF.gmem_bytes),
        "trace": [(r.slot, r.pc, r.faulted, r.bytes_in, r.bytes_out) for r in dev.read_trace()],
        "mark": int(dev.regs.MARK.read().value),
        "status": {f: int(getattr(dev.status(), f)) for f in ("active_bank", "exec_bank")},
        "spec": {name: counters[name] for name in ("spec_hits", "spec_misses", "spec_faults")},
    }


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_model_matches_rtl_on_dma_programs(model_and_rtl, seed):
    model, rtl = model_and_rtl
    program = _random_program(random.Random(seed))
    expected = _run_program(rtl, program)
    got = _run_program(model, program)
    for key in expected:
        assert got[key] == expected[key], key
