"""Differential verification of the whole ISA: the golden model against the RTL.

Random valid programs (``tests/programs.py``: DMA with tokens and WAITs, every compute
micro-instruction, VCFG of every register, BRANCH / JUMP / SWITCH on the flags and
index registers the kernels set, CALLs of several slots, MARK, speculative regions
with a fallback bank, and now and then a deliberate fault) run on the model and on
the RTL; everything architectural they leave must be equal: all of GMEM (including a
dump of every scratchpad partition used), FLAGS, INDEX, MARK, MISS_PC, STATUS, the
fault record, the architectural counters, the per-flag branch and per-slot call
counters and the trace records' slot, PC, bank, faulted and byte counts. Cycle counts
are estimates in the model and are not compared.

* model vs the RTL in Amaranth's simulator: hypothesis-chosen seeds, small config; the
  tile simulated there (``tests/checked_tile.py``) also asserts, every cycle, that no
  instruction store or scratchpad read meets a write of its word (the bitstream
  builds let such a collision read anything);
* model vs Verilator and vs Icarus (``cocotb`` marker): a fixed regression set of
  seeds on the default config (the model other RTL tests have already built).

Directed cases: compute faults are precise (the control unit checks a compute
instruction's operands before it issues; ``kernels/operands.py``), in and out of a
speculative region, a VCFG right behind a VCMP keeps the VCMP's flag, and a VARGMAX
with a flag test guarding a region hits and misses.
"""

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fusetile.host import open_transport
from fusetile.host.device import Device
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import FaultCause, MicroInstr, MicroOp
from fusetile.kernels.program import (assume, branch, call, commit, dma_load, dma_store, done,
                                      jump, mark, matmul, nop, requant, ret, switch, vargmax,
                                      vcfg, vclamp, vcmp, wait)

from checked_tile import CheckedTile
from conftest import require_simulator
from programs import SPAN_WORDS, Program, differences, random_program, run_program


SMALL = TileConfig(gmem_bytes=2048, spad_bank_words=64, trace_depth=8)

#: Seeds of the Verilator / Icarus regression set: picked from 1000..2799 (on the
#: default config) to cover speculation hits (one guarded by a VARGMAX flag test),
#: misses at COMMIT, in mid-kernel (by a VCMP and by a testing VARGMAX) and by a fault,
#: taken branches, saturating requantisation, programs of 4+ calls, VARGMAX in column
#: mode and with a flag test, and every planted fault: DMA PARTITION and GMEM_RANGE,
#: compute PARTITION and ILLEGAL_MICRO (bad operand, an illegal VARGMAX encoding among
#: them), reserved micro-op, ILLEGAL_PLAN, PLAN_RANGE, SWITCH_RANGE, SLOT_INVALID (a
#: miss inside a region).
REGRESSION_SEEDS = [1002, 1003, 1011, 1020, 1021, 1023, 1030, 1192, 1198, 1202, 1283, 1311,
                    1316, 1325, 1331, 1492, 1702, 1761, 1907, 2274]


def check(model, rtl, program, *, whole_gmem=True):
    """Run ``program`` on both, assert they agree and return what it left."""
    expected = run_program(rtl, program, whole_gmem=whole_gmem)
    got = run_program(model, program, whole_gmem=whole_gmem)
    diffs = differences(expected, got, rtl.config.word_bytes)
    assert not diffs, "model and RTL differ:\n" + "\n".join(diffs) + \
        "\n" + program.describe()
    return expected


# -- the model against the RTL in Amaranth's simulator ------------------------------------

@pytest.fixture(scope="module")
def amaranth_pair():
    """One model and one RTL session for every example: each program starts with a
    prologue that puts the architectural registers and the scratchpad in a known state,
    so examples do not depend on each other."""
    with open_transport("model", config=SMALL) as model, \
            open_transport("amaranth", config=SMALL, top=CheckedTile(SMALL)) as rtl:
        yield Device(model), Device(rtl)


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow,
                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_model_matches_amaranth_rtl(amaranth_pair, seed):
    model, rtl = amaranth_pair
    check(model, rtl, random_program(seed, SMALL))


#: SMALL with a vector unit of 2 lanes for 8: rows and scaled words take 4 passes.
PASSES = TileConfig(gmem_bytes=2048, spad_bank_words=64, trace_depth=8, vector_lanes=2)


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_model_matches_rtl_in_passes(seed):
    """Fewer vector lanes change when results come, never what they are."""
    with open_transport("model", config=PASSES) as model, \
            open_transport("amaranth", config=PASSES, top=CheckedTile(PASSES)) as rtl:
        model, rtl = Device(model), Device(rtl)
        for k in range(3):
            check(model, rtl, random_program(seed * 10 + k, PASSES))


#: SMALL with its units built for area, as the iCEBreaker's are.
COMPACT = replace(SMALL, compact=True)


@pytest.fixture(scope="module")
def compact_pair():
    """As ``amaranth_pair``, with the units built for area."""
    with open_transport("model", config=COMPACT) as model, \
            open_transport("amaranth", config=COMPACT, top=CheckedTile(COMPACT)) as rtl:
        yield Device(model), Device(rtl)


@pytest.fixture(params=["deep", "compact"])
def either_pair(request):
    """``amaranth_pair`` and ``compact_pair`` in turn: for what the build for area
    makes with other logic (SWITCH's index register selected before its adder and
    comparison; compute faults found by the operand check alone)."""
    return request.getfixturevalue("amaranth_pair" if request.param == "deep"
                                   else "compact_pair")


@pytest.mark.parametrize("seed, left_out", [(21, False), (22, False), (23, False),
                                             (24, True), (33, True)])
def test_model_matches_rtl_with_the_small_boards_memories(seed, left_out):
    """The tile as the iCEBreaker builds it: the instruction stores read through the
    control unit's port only when it fetches (every way into a fetch must ask for
    the read), GMEM behind one port, a DMA queue of one command, the units built for
    area and a vector unit that scales a word in passes; with no DMA queue, no trace
    FIFO, no speculation, no VCMP or VARGMAX, no VADD, VPOOL or VCLAMP, no slot
    version tags and no watchdog (the iCEBreaker's:
    ASSUME is
    illegal, and seed 33's three programs stop with ILLEGAL_PLAN at their regions; the
    programs make no VCMP, VARGMAX, VADD, VPOOL or VCLAMP but where a fault is meant),
    and with
    all of them, the trace FIFO written a quarter of a record per cycle (the traces
    compared too)."""
    config = replace(COMPACT, dma_queue=1, vector_lanes=2)
    if left_out:
        config = replace(config, trace_depth=0, staging_words=0, decisions=False,
                         pool_average=False, dma_queue=0, slot_versions=False, word_ops=False,
                         watchdog=False)
    top = CheckedTile(config, gmem_ports="single", store_ports="shared", trace_width=64)
    with open_transport("model", config=config) as model, \
            open_transport("amaranth", config=config, top=top) as rtl:
        model, rtl = Device(model), Device(rtl)
        for k in range(3):
            check(model, rtl, random_program(seed * 10 + k, config))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_compute_faults(either_pair, seed):
    """Random programs whose compute instruction faults (PARTITION, ILLEGAL_MICRO): on
    a tile built for area too, whose compute unit leaves the partition test to the
    operand check (the checked tile asserts that it presents no access outside)."""
    model, rtl = either_pair
    check(model, rtl, random_program(seed, SMALL, fault_rate=1,
                                     fault_kinds=("compute_partition", "compute_operand")))


def _minimal(kernel, plan, fallback=None):
    """A hand-written program: ``kernel`` in slot 0 on a 16-word partition 0."""
    rng = random.Random(1)
    image = bytes(rng.randrange(256) for _ in range(SPAN_WORDS * SMALL.word_bytes))
    return Program(seed=None, gmem=image, parts=[(0, 16)], kernels={0: (0, kernel)},
                   plan=plan, fallback=fallback)


#: The spine's timing counters: cycle-exact in the model (``kernels/model.py``).
SPINE_COUNTERS = ("active_cycles", "stall_dma", "dma_busy", "rollback_cycles")


def test_the_spine_is_cycle_exact(amaranth_pair):
    """Plan sequencing (MARK, JUMP, BRANCH, SWITCH, CALL, a miss at COMMIT and its
    rollback), DMA-only kernels with WAIT and RET: the model counts the RTL's cycles."""
    model, rtl = amaranth_pair
    kernel = [dma_load(gmem=0, spad=0, cols=4), dma_load(gmem=8, spad=4, cols=3, token=1),
              wait(tokens=0b10), dma_store(gmem=100, spad=0, cols=5), wait(), ret()]
    plan = [mark(1), jump(2), branch(3, 3, if_set=False), switch(0, 4, 1), call(0),
            assume(1, 7, expect=True), call(0), commit(), done()]
    fallback = [done()] * 7 + [mark(7), call(0), done()]
    program = _minimal(kernel, plan, fallback)
    result = check(model, rtl, program)
    assert result["mark"] == 7 and result["counters"]["spec_misses"] == 1
    counts = [{name: dev.counters()[name] for name in SPINE_COUNTERS} for dev in (rtl, model)]
    assert counts[0] == counts[1] and counts[0]["rollback_cycles"] > 0


def test_a_queue_of_one_command():
    """With ``dma_queue`` 1 (the iCEBreaker's) the queue is one register: the third of
    three loads in a row waits until the engine has taken the second, and the work
    after them starts that much later. The model counts the RTL's cycles, and the
    kernel takes longer than behind a queue of four commands."""
    config = replace(SMALL, dma_queue=1)
    kernel = [dma_load(gmem=0, spad=0, cols=4), dma_load(gmem=8, spad=4, cols=4, token=1),
              dma_load(gmem=16, spad=8, cols=4, token=2), *[nop()] * 8, wait(), ret()]
    program = _minimal(kernel, [call(0), done()])
    with open_transport("model", config=config) as model, \
            open_transport("amaranth", config=config, top=CheckedTile(config)) as rtl:
        model, rtl = Device(model), Device(rtl)
        check(model, rtl, program)
        one = [{name: dev.counters()[name] for name in SPINE_COUNTERS} for dev in (rtl, model)]
    with open_transport("model", config=SMALL) as model:
        deep = Device(model)
        run_program(deep, program)
        four = {name: deep.counters()[name] for name in SPINE_COUNTERS}
    assert one[0] == one[1]
    assert one[0]["active_cycles"] > four["active_cycles"]
    assert one[0]["dma_busy"] == four["dma_busy"]


def test_no_queue():
    """With ``dma_queue`` 0 (the iCEBreaker's) there is no queue: the engine takes a
    load in the cycle it executes, and the next load waits there until the engine is
    idle. The model counts the RTL's cycles; against a queue of one command, the kernel
    (three loads in a row) takes longer and its sequencer waits for the engine, whose
    busy cycles are the same."""
    kernel = [dma_load(gmem=0, spad=0, cols=4), dma_load(gmem=8, spad=4, cols=4, token=1),
              dma_load(gmem=16, spad=8, cols=4, token=2), *[nop()] * 8, wait(), ret()]
    program = _minimal(kernel, [call(0), done()])
    counts = {}
    for depth in (0, 1):
        config = replace(SMALL, dma_queue=depth)
        with open_transport("model", config=config) as model, \
                open_transport("amaranth", config=config, top=CheckedTile(config)) as rtl:
            model, rtl = Device(model), Device(rtl)
            check(model, rtl, program)
            counts[depth] = [{name: dev.counters()[name] for name in SPINE_COUNTERS}
                             for dev in (rtl, model)]
        assert counts[depth][0] == counts[depth][1], depth
    none, one = counts[0][0], counts[1][0]
    assert none["active_cycles"] > one["active_cycles"]
    assert none["stall_dma"] > one["stall_dma"]
    assert none["dma_busy"] == one["dma_busy"]


# A fault or a miss aborts the units the cycle after it (the control unit's register,
# `ControlUnit.dma_abort`): a transfer still moving words moves that cycle's word and
# no later one. GMEM, the partition's dump and the byte counters say how many moved.

def test_a_stop_aborts_a_transfer_in_flight(amaranth_pair):
    """A precise compute fault stops the tile in the middle of a DMA store."""
    model, rtl = amaranth_pair
    kernel = [dma_store(gmem=100, spad=0, cols=14), nop(), nop(),
              vclamp(src=0, out=14, n=3, lo=-5, hi=5), wait(), ret()]
    result = check(model, rtl, _minimal(kernel, [call(0), done()]))
    assert result["fault"]["cause"] == FaultCause.PARTITION
    assert SMALL.word_bytes < result["counters"]["dma_bytes_out"] < 14 * SMALL.word_bytes


def test_a_miss_aborts_a_transfer_in_flight(amaranth_pair):
    """The same fault inside a speculative region rolls back in the middle of a DMA
    load. (A miss by a flag is not timed exactly: the model's compute latencies are
    estimates.)"""
    model, rtl = amaranth_pair
    kernel = [dma_load(gmem=20, spad=0, cols=14), nop(), nop(),
              vclamp(src=0, out=14, n=3, lo=-5, hi=5), wait(), ret()]
    program = _minimal(kernel, [assume(0, 0, expect=False), call(0), commit(), done()],
                       [mark(7), done()])
    result = check(model, rtl, program)
    assert result["mark"] == 7 and result["counters"]["spec_faults"] == 1
    assert SMALL.word_bytes < result["counters"]["dma_bytes_in"] < 14 * SMALL.word_bytes


def test_a_staging_overflow_aborts_the_store_a_cycle_later(amaranth_pair):
    """A speculative store of more words than the staging buffer holds: the word after
    the first that does not fit moves too (the miss comes the cycle after the
    overflow, the abort the cycle after that), and nothing reaches GMEM."""
    model, rtl = amaranth_pair
    words = SMALL.staging_words + 6
    kernel = [dma_store(gmem=100, spad=0, rows=words // 2, cols=2, spad_stride=0),
              wait(), ret()]
    program = _minimal(kernel, [assume(0, 0, expect=False), call(0), commit(), done()],
                       [mark(7), done()])
    result = check(model, rtl, program)
    assert result["mark"] == 7 and result["counters"]["spec_misses"] == 1
    assert result["counters"]["dma_bytes_out"] == (SMALL.staging_words + 2) * SMALL.word_bytes


#: Compute faults behind a MATMUL still running: a VCLAMP whose output runs one word
#: past the end of its 16-word partition (PARTITION), a VARGMAX with n = 0
#: (ILLEGAL_MICRO), a column VARGMAX whose n words run one past the end (PARTITION:
#: packed, the same n would fit), a column VARGMAX of a lane beyond the word and a
#: VARGMAX with a flag but no test (ILLEGAL_MICRO). Each faults with its own micro PC,
#: not retired, after the MATMUL completed, and the DMA store after it never runs.
_BEHIND = [matmul(a=0, b=1, k=12)]


def _raw_vargmax(**fields):
    return MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": fields}}).as_bits()


COMPUTE_FAULT_KERNELS = {
    "partition": _BEHIND + [vclamp(src=0, out=14, n=3, lo=-5, hi=5)],
    "illegal": _BEHIND + [_raw_vargmax(n=0)],
    "column_partition": _BEHIND + [vargmax(addr=10, n=7, index=1, lane=3, flag=2, expect=0)],
    "illegal_lane": _BEHIND + [_raw_vargmax(n=2, column=1, lane=SMALL.word_bytes)],
    "illegal_untested_flag": _BEHIND + [_raw_vargmax(n=2, column=1, flag=3)],
}
_AFTER = [requant(out=2), dma_store(gmem=0, spad=0, cols=4), wait(), ret()]


@pytest.mark.parametrize("kind", COMPUTE_FAULT_KERNELS)
def test_compute_fault_is_precise(amaranth_pair, kind):
    model, rtl = amaranth_pair
    program = _minimal(COMPUTE_FAULT_KERNELS[kind] + _AFTER, [call(0), done()])
    result = check(model, rtl, program)
    assert result["fault"]["micro_pc"] == 1 and result["counters"]["micro_retired"] == 1


def test_compute_fault_in_region_rolls_back(amaranth_pair):
    model, rtl = amaranth_pair
    result = check(model, rtl, _minimal(COMPUTE_FAULT_KERNELS["partition"] + _AFTER,
                                        [assume(2, 0, expect=False), call(0), commit(), done()],
                                        [mark(7), done()]))
    assert result["counters"]["spec_faults"] == 1 and result["mark"] == 7


def _argmax_program(kernel, plan, fallback=None, *, column=(-5, 3, 9, 1)):
    """``_minimal(kernel, plan, fallback)`` with GMEM words 0..3 holding ``column`` in
    their last lane (word 2 the largest by default: a VARGMAX of that lane over them
    gives 2)."""
    program = _minimal(kernel, plan, fallback)
    wb = SMALL.word_bytes
    image = bytearray(program.gmem)
    for w, value in enumerate(column):
        image[w * wb + wb - 1] = value & 0xFF
    program.gmem = bytes(image)
    return program


@pytest.mark.parametrize("expect,hit", [(2, True), (3, False)])
def test_vargmax_test_guards_a_region(amaranth_pair, expect, hit):
    """A column VARGMAX with a flag test writes the guarded flag (and its index) in
    mid-kernel: with the right guess the region commits its staged store, with the
    wrong one it misses at once (the later store never runs) and the fallback runs."""
    model, rtl = amaranth_pair
    wb = SMALL.word_bytes
    kernel = [dma_load(gmem=0, spad=0, cols=4), wait(),
              dma_store(gmem=100, spad=0, cols=4), wait(),
              vargmax(addr=0, n=4, index=3, lane=wb - 1, flag=1, expect=expect),
              wait(compute=True),               # a miss lands here
              dma_store(gmem=110, spad=0, cols=4), wait(), ret()]
    program = _argmax_program(kernel, [assume(1, 0), call(0), commit(), mark(1), done()],
                              [mark(7), done()], column=(-5, 3, 9, 9))   # a tie: word 2
    result = check(model, rtl, program)
    assert result["index"][3] == 2
    c = result["counters"]
    assert (c["spec_hits"], c["spec_misses"]) == ((1, 0) if hit else (0, 1))
    assert result["mark"] == (1 if hit else 7)
    assert result["counters"]["micro_retired"] == (9 if hit else 5)


def test_vcfg_after_vcmp_keeps_the_flag(amaranth_pair):
    """(And after a VARGMAX with a flag test.)"""
    model, rtl = amaranth_pair
    kernel = [dma_load(gmem=0, spad=0, cols=2), wait(),
              vcmp(addr=0, lane=15, op="GT", imm=3, flag=0, reduce=True),
              vcfg("HI", -32),
              vargmax(addr=0, n=2, index=2, lane=3, flag=5, expect=1),   # 0, 5: word 1
              vcfg("LO", -100), ret()]
    program = _minimal(kernel, [call(0), done()])
    program.gmem = bytes(8) + bytes([5] * 8) + program.gmem[16:]
    result = check(model, rtl, program)
    assert result["flags"] == 0b100001 and result["index"][2] == 1


@pytest.mark.parametrize("table, past", [(SMALL.plan_depth - 4, False),
                                          (SMALL.plan_depth - 2, True)])
@pytest.mark.parametrize("reg", [0, 2])
def test_switch_past_the_bank(either_pair, table, past, reg):
    """A SWITCH whose table starts inside the bank and whose entry (X0 or X2 = 2, from
    a VARGMAX; the other index registers 0) lands past it faults, though neither the
    table's start nor the index is past the bank alone (their PC bits carry); two
    entries lower it lands on the bank's last instructions."""
    model, rtl = either_pair
    wb, depth = SMALL.word_bytes, SMALL.plan_depth
    kernel = [dma_load(gmem=0, spad=0, cols=4), wait(),
              vargmax(addr=0, n=4, index=reg, lane=wb - 1), wait(compute=True), ret()]
    plan = [call(0), switch(reg, table, 4)] + [nop()] * (depth - 4) + [mark(5), done()]
    result = check(model, rtl, _argmax_program(kernel, plan))
    assert result["index"][reg] == 2
    if past:
        fault = result["fault"]
        assert (fault["cause"], fault["plan_pc"], fault["addr"]) == \
            (FaultCause.PLAN_RANGE, 1, depth)
    else:
        assert result["fault"] is None and result["mark"] == 5


@pytest.mark.parametrize("reg", [0, 2])
def test_switch_outside_its_table(either_pair, reg):
    """A SWITCH whose index register (X0 or X2 = 2, from a VARGMAX) is not below its
    table's length faults with SWITCH_RANGE and the index as the address: built for
    area, the address is the selected index register itself, at execution."""
    model, rtl = either_pair
    kernel = [dma_load(gmem=0, spad=0, cols=4), wait(),
              vargmax(addr=0, n=4, index=reg, lane=SMALL.word_bytes - 1),
              wait(compute=True), ret()]
    plan = [call(0), switch(reg, 3, 2), mark(5), done()]
    result = check(model, rtl, _argmax_program(kernel, plan))
    fault = result["fault"]
    assert (fault["cause"], fault["plan_pc"], fault["addr"]) == (FaultCause.SWITCH_RANGE, 1, 2)


@pytest.mark.parametrize("region", [False, True])
def test_a_return_past_the_bank_faults_at_the_fetch(amaranth_pair, region):
    """A CALL (or, in a speculative region, its COMMIT) in the bank's last entry: the
    kernel's RET waits for its store, returns, and the plan PC past the bank faults
    when it is fetched, outside the kernel. The store is in GMEM (published, in a
    region), the call counted and its trace record not faulted."""
    model, rtl = amaranth_pair
    depth = SMALL.plan_depth
    kernel = [dma_load(gmem=0, spad=0, cols=4), wait(), dma_store(gmem=100, spad=0, cols=4),
              ret()]
    if region:
        plan = [nop()] * (depth - 3) + [assume(1, 0, expect=False), call(0), commit()]
    else:
        plan = [nop()] * (depth - 1) + [call(0)]
    program = _minimal(kernel, plan, fallback=[mark(9), done()] if region else None)
    result = check(model, rtl, program)
    fault = result["fault"]
    assert (fault["cause"], fault["plan_pc"], fault["addr"], fault["in_kernel"]) == \
        (FaultCause.PLAN_RANGE, depth, depth, 0)
    wb = SMALL.word_bytes
    assert result["gmem"][100 * wb:104 * wb] == program.gmem[:4 * wb]
    assert result["slot_calls"][0] == 1
    assert [r["faulted"] for r in result["trace"]] == [0]


@pytest.mark.parametrize("size, faults", [(3, False), (2, True)])
def test_switch_range_of_its_own_index(either_pair, size, faults):
    """SWITCH on X2 = 2 (X0 = 0): a table of 2 entries faults with SWITCH_RANGE and the
    index, one of 3 goes to its entry 2."""
    model, rtl = either_pair
    wb = SMALL.word_bytes
    kernel = [dma_load(gmem=0, spad=0, cols=4), wait(),
              vargmax(addr=0, n=4, index=2, lane=wb - 1), vargmax(addr=0, n=1, index=0),
              wait(compute=True), ret()]
    plan = [call(0), switch(2, 4, size)] + [nop()] * 4 + [mark(7), done()]   # entry 2: pc 6
    result = check(model, rtl, _argmax_program(kernel, plan))
    assert (result["index"][2], result["index"][0]) == (2, 0)
    if faults:
        fault = result["fault"]
        assert (fault["cause"], fault["plan_pc"], fault["addr"]) == \
            (FaultCause.SWITCH_RANGE, 1, 2)
    else:
        assert result["fault"] is None and result["mark"] == 7


# -- the model against Verilator and Icarus -----------------------------------------------

@pytest.fixture(scope="module", params=["verilator", "icarus"])
def cocotb_pair(request):
    sim = request.param
    require_simulator(sim)
    config = TileConfig()
    with open_transport("model", config=config) as model, \
            open_transport(sim, config=config) as rtl:
        yield Device(model), Device(rtl)


@pytest.mark.cocotb
@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
def test_model_matches_cocotb_rtl(cocotb_pair, seed):
    model, rtl = cocotb_pair
    # The default GMEM is 64 KiB: each program rewrites and compares only the words a
    # program can reach; the test below compares the whole of it once.
    check(model, rtl, random_program(seed, rtl.config), whole_gmem=False)


@pytest.mark.cocotb
def test_cocotb_rtl_gmem_after_regression(cocotb_pair):
    """After the regression set (or alone: then after nothing), all of GMEM is equal:
    no program wrote outside the words it compared."""
    model, rtl = cocotb_pair
    size = rtl.config.gmem_bytes
    assert rtl.read_window("GMEM", 0, size) == model.read_window("GMEM", 0, size)
