"""The assembler, the disassembler and the instruction builders agree with each other
and with the layouts in kernels/isa.py."""

import re

import pytest
from hypothesis import given, settings, strategies as st

from fusetile.kernels import program as p
from fusetile.kernels.asm import (AsmError, assemble_plan, assemble_kernel, disassemble_plan,
                                  disassemble_kernel, PLAN_SYNTAX, MICRO_SYNTAX)
from fusetile.kernels.isa import (PlanOp, PlanInstr, MicroOp, MicroInstr, MicroArgs, GmemBase,
                                  CmpOp, VectorCfg)


def u(bits):
    return st.integers(0, (1 << bits) - 1)


INT8 = st.integers(-128, 127)
BOOL = st.booleans()
FLAG = st.integers(0, 7)
INDEX = st.integers(0, 3)


def _vcfg_args():
    return st.sampled_from(list(VectorCfg)).flatmap(
        lambda reg: st.fixed_dictionaries({
            "reg": st.just(reg), "value": st.integers(*p.VCFG_RANGES[reg])}))


def _keywords(rnd, items):
    """``name=value`` operands in a random order (the syntax allows any)."""
    items = [item for item in items if item]
    rnd.shuffle(items)
    return items


def _gmem(kw):
    base = kw.get("base", GmemBase.ABS)
    return str(kw["gmem"]) if base is GmemBase.ABS else f"{base.name.lower()}+{kw['gmem']}"


def _dma_text(mnemonic):
    def text(kw, rnd):
        ops = _keywords(rnd, [
            f"spad={kw['spad']}", f"rows={kw['rows']}", f"cols={kw['cols']}",
            kw["gmem_stride"] is not None and f"gmem_stride={kw['gmem_stride']}",
            kw["spad_stride"] is not None and f"spad_stride={kw['spad_stride']}",
            f"token={kw['token']}"])
        return f"{mnemonic} gmem={_gmem(kw)}, " + ", ".join(ops)
    return text


def _dma_args():
    return st.fixed_dictionaries({
        "gmem": u(24), "spad": u(16), "rows": u(12), "cols": u(12),
        "gmem_stride": st.none() | u(16), "spad_stride": st.none() | u(16),
        "base": st.sampled_from(list(GmemBase)), "token": u(2)})


def _vargmax_args():
    """Packed or column mode (``lane``), with or without a test (``flag`` + ``expect``)."""
    return st.fixed_dictionaries({
        "addr": u(16), "n": st.integers(1, 4095), "index": INDEX,
        "lane": st.none() | u(8)}).flatmap(
        lambda kw: st.one_of(st.just(kw), st.fixed_dictionaries({
            "flag": FLAG, "expect": u(12)}).map(lambda test: {**kw, **test})))


def _vargmax_text(kw, rnd):
    ops = _keywords(rnd, [
        f"addr={kw['addr']}", f"n={kw['n']}", f"index={rnd.choice(['x', 'X', ''])}{kw['index']}",
        kw["lane"] is not None and f"lane={kw['lane']}",
        "flag" in kw and f"flag={rnd.choice(['f', ''])}{kw['flag']}",
        "flag" in kw and f"expect={kw['expect']:#x}"])
    return "vargmax " + ", ".join(ops)


def _flag_word(name, on, rnd):
    return rnd.choice([name, f"{name}=1"]) if on else rnd.choice(["", f"{name}=0"])


# (builder, strategy of its keyword arguments, text the assembler must read the same way)
PLAN_CASES = {
    PlanOp.NOP: (p.nop, st.just({}), lambda kw, r: "nop"),
    PlanOp.CALL: (p.call, st.fixed_dictionaries({"slot": u(8), "a": u(24), "b": u(24)}),
                  lambda kw, r: f"call {kw['slot']}, " +
                  ", ".join(_keywords(r, [f"a={kw['a']:#x}", f"b={kw['b']}"]))),
    PlanOp.DONE: (p.done, st.just({}), lambda kw, r: "DONE"),
    PlanOp.MARK: (p.mark, st.fixed_dictionaries({"value": u(24)}),
                  lambda kw, r: f"mark {kw['value']}"),
    PlanOp.BRANCH: (p.branch,
                    st.fixed_dictionaries({"flag": FLAG, "target": u(24), "if_set": BOOL}),
                    lambda kw, r: f"branch {r.choice(['f', 'F', ''])}{kw['flag']}, "
                                  f"{int(kw['if_set'])}, {kw['target']}"),
    PlanOp.SWITCH: (p.switch,
                    st.fixed_dictionaries({"index": INDEX, "table": u(24), "size": u(24)}),
                    lambda kw, r: f"switch x{kw['index']}, table={kw['table']}, "
                                  f"size={kw['size']:#x}"),
    PlanOp.ASSUME: (p.assume,
                    st.fixed_dictionaries({"flag": FLAG, "resume": u(24), "expect": BOOL}),
                    lambda kw, r: f"assume f{kw['flag']}, {int(kw['expect'])}, "
                                  f"resume={kw['resume']}"),
    PlanOp.COMMIT: (p.commit, st.just({}), lambda kw, r: "commit"),
    PlanOp.JUMP: (p.jump, st.fixed_dictionaries({"a": u(24)}),
                  lambda kw, r: f"jump target={kw['a']}"),
}

MICRO_CASES = {
    MicroOp.NOP: (p.micro_nop, st.just({}), lambda kw, r: "nop"),
    MicroOp.RET: (p.ret, st.just({}), lambda kw, r: "ret"),
    MicroOp.DMA_LOAD: (p.dma_load, _dma_args(), _dma_text("dma.load")),
    MicroOp.DMA_STORE: (p.dma_store, _dma_args(), _dma_text("dma.store")),
    MicroOp.WAIT: (p.wait, st.fixed_dictionaries({"tokens": u(4)}),
                   lambda kw, r: f"wait {kw['tokens']:#06b}"),
    MicroOp.MATMUL: (p.matmul, st.fixed_dictionaries({
        "a": u(16), "b": u(16), "k": u(16), "a_stride": u(16), "b_stride": u(16),
        "accumulate": BOOL}),
        lambda kw, r: "matmul " + ", ".join(_keywords(r, [
            f"a={kw['a']}", f"b={kw['b']}", f"k={kw['k']}", f"a_stride={kw['a_stride']}",
            f"b_stride={kw['b_stride']}", _flag_word("acc", kw["accumulate"], r)]))),
    MicroOp.ACC_BIAS: (p.acc_bias, st.fixed_dictionaries({"addr": u(16)}),
                       lambda kw, r: f"acc.bias {kw['addr']}"),
    MicroOp.REQUANT: (p.requant, st.fixed_dictionaries({
        "out": u(16), "out_stride": u(16), "per_channel": BOOL, "params": u(16)}),
        lambda kw, r: "requant " + ", ".join(_keywords(r, [
            f"out={kw['out']}", f"out_stride={kw['out_stride']}", f"params={kw['params']}",
            _flag_word("per_channel", kw["per_channel"], r)]))),
    MicroOp.VADD: (p.vadd, st.fixed_dictionaries({
        "a": u(16), "b": u(16), "out": u(16), "n": u(12)}),
        lambda kw, r: f"vadd {kw['a']}, {kw['b']}, out={kw['out']}, n={kw['n']}"),
    MicroOp.VPOOL: (p.vpool, st.fixed_dictionaries({
        "src": u(16), "out": u(16), "n": u(12), "window": st.integers(1, 15),
        "stride": u(16), "step": u(16), "average": BOOL, "pairs": BOOL}),
        lambda kw, r: "vpool " + ", ".join(_keywords(r, [
            f"src={kw['src']}", f"out={kw['out']}", f"n={kw['n']}",
            f"window={kw['window']}", f"stride={kw['stride']}", f"step={kw['step']}",
            _flag_word("average", kw["average"], r), _flag_word("pairs", kw["pairs"], r)]))),
    MicroOp.VCLAMP: (p.vclamp, st.fixed_dictionaries({
        "src": u(16), "out": u(16), "n": u(12), "lo": INT8, "hi": INT8}),
        lambda kw, r: "vclamp " + ", ".join(_keywords(r, [
            f"src={kw['src']}", f"out={kw['out']}", f"n={kw['n']}", f"lo={kw['lo']}",
            f"hi={kw['hi']}"]))),
    MicroOp.VCMP: (p.vcmp, st.fixed_dictionaries({
        "addr": u(16), "lane": u(8), "op": st.sampled_from(list(CmpOp)), "imm": INT8,
        "flag": FLAG, "reduce": BOOL}),
        lambda kw, r: "vcmp " + ", ".join(_keywords(r, [
            f"addr={kw['addr']}", f"lane={kw['lane']}", f"op={kw['op'].name.lower()}",
            f"imm={kw['imm']}", f"flag={r.choice(['f', ''])}{kw['flag']}",
            _flag_word("reduce", kw["reduce"], r)]))),
    MicroOp.VARGMAX: (p.vargmax, _vargmax_args(), _vargmax_text),
    MicroOp.VCFG: (p.vcfg, _vcfg_args(),
                   lambda kw, r: f"vcfg {kw['reg'].name.lower()}, {kw['value']}"),
}


def _build(builder, kw):
    # the plan builders with positional parameters take them positionally here
    if builder is p.call:
        return p.call(kw["slot"], a=kw["a"], b=kw["b"])
    if builder is p.mark:
        return p.mark(kw["value"])
    if builder is p.jump:
        return p.jump(kw["a"])
    if builder is p.acc_bias:
        return p.acc_bias(kw["addr"])
    return builder(**kw)


def test_every_op_has_a_case_and_a_table_entry():
    assert set(PLAN_CASES) == set(PlanOp) == {s.op for s in PLAN_SYNTAX}
    assert set(MICRO_CASES) == set(MicroOp) == {s.op for s in MICRO_SYNTAX}


@pytest.mark.parametrize("syntax", MICRO_SYNTAX, ids=lambda s: s.mnemonic)
def test_table_covers_every_args_field(syntax):
    covered = [f for o in syntax.operands for f in o.fields]
    assert len(covered) == len(set(covered))
    if syntax.args is None:
        assert not covered
    else:
        layout = MicroArgs.as_shape()[syntax.args].shape.as_shape()
        assert sorted(covered) == sorted(name for name, _ in layout)


# -- round trips ---------------------------------------------------------------------------

def _case_strategy(cases):
    return st.sampled_from(sorted(cases, key=lambda op: op.value)).flatmap(
        lambda op: st.tuples(st.just(op), cases[op][1], st.randoms(use_true_random=False)))


@settings(max_examples=400, deadline=None)
@given(_case_strategy(PLAN_CASES))
def test_plan_round_trip_and_builders_agree(case):
    op, kw, rnd = case
    builder, _, text = PLAN_CASES[op]
    word = _build(builder, kw)
    assert PlanInstr.from_bits(word).op is op
    listing = disassemble_plan([word])
    assert ".word" not in listing
    assert assemble_plan(listing) == [word]
    source = text(kw, rnd)
    assert assemble_plan(source) == [word], source


@settings(max_examples=600, deadline=None)
@given(_case_strategy(MICRO_CASES))
def test_micro_round_trip_and_builders_agree(case):
    op, kw, rnd = case
    builder, _, text = MICRO_CASES[op]
    word = _build(builder, kw)
    assert MicroInstr.from_bits(word).op is op
    listing = disassemble_kernel([word])
    assert ".word" not in listing
    assert assemble_kernel(listing) == [word]
    source = text(kw, rnd)
    assert assemble_kernel(source) == [word], source


def _sparse(bits):
    """Mostly-zero words, so that many decode as (near-)valid instructions."""
    return st.lists(st.integers(0, bits - 1), max_size=6).map(
        lambda positions: sum(1 << i for i in set(positions)))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(u(64), _sparse(64), st.sampled_from(
    [s.op.value for s in PLAN_SYNTAX] + [9, 15])), max_size=8))
def test_any_plan_words_round_trip(words):
    assert assemble_plan(disassemble_plan(words)) == words


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(u(128), _sparse(128).map(lambda w: w & ~0x3F).flatmap(
    lambda w: st.sampled_from([0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15, 16, 63]).map(
        lambda op: w | op))), max_size=8))
def test_any_kernel_words_round_trip(words):
    assert assemble_kernel(disassemble_kernel(words)) == words


@pytest.mark.parametrize("syntax", PLAN_SYNTAX + MICRO_SYNTAX,
                         ids=lambda s: f"{type(s.op).__name__}.{s.op.name}")
def test_examples_are_canonical(syntax):
    is_plan = isinstance(syntax.op, PlanOp)
    source = syntax.example.replace("@exit", "5").replace("@table", "7").replace("@start", "3")
    words = (assemble_plan if is_plan else assemble_kernel)(source)
    listing = (disassemble_plan if is_plan else disassemble_kernel)(words)
    assert listing == f"    {source}\n"


# -- syntax --------------------------------------------------------------------------------

def test_plan_syntax():
    text = """
    ; a plan with every form of operand
    start:  call 2, a=0x100, b=0x200      ; label before an instruction
            CALL slot=2, b=512, a=256     ; names in any order, any case
            branch f3, 1, @exit
    table:
            jump @start
            jump @exit
            switch x0, @table, 2
            assume F1, 0, resume=5
            commit
            mark 0b101010
    exit:
            done
    after:
    """
    words = assemble_plan(text)
    assert words == [
        p.call(2, a=0x100, b=0x200), p.call(2, a=0x100, b=0x200), p.branch(3, 9),
        p.jump(0), p.jump(9), p.switch(0, 3, 2), p.assume(1, 5, expect=False), p.commit(),
        p.mark(42), p.done(),
    ]
    assert assemble_plan("jump @end\nend:") == [p.jump(1)]
    assert assemble_plan("a: b: jump @b") == [p.jump(0)]
    assert assemble_plan("") == assemble_plan("; nothing\n\n") == []


def test_kernel_syntax():
    text = """
    dma.load gmem=arg0+16, spad=0, rows=4, cols=8, gmem_stride=8, spad_stride=8, token=1
    dma.store gmem = arg1, spad = 3
    dma.load gmem=0x40, spad=1_000
    wait
    wait 0b0011
    wait tokens=2
    matmul a=0, b=64, k=32, acc
    matmul 0, 64, 32, a_stride=2, acc=0
    vcfg mult_a, 0x40000000
    vcfg LO, -128
    vcfg zp_out, value=-3
    vcmp addr=3, lane=9, op=ge, imm=-5, flag=2, reduce
    vargmax addr=0, n=8, index=3
    vargmax addr=0, n=8, index=3, lane=5
    vargmax flag=f2, expect=0x7, addr=0, n=8, index=x1
    vargmax addr=2, lane=0, n=1, index=0, expect=4095, flag=7
    .word 0x3f
    ret
    """
    assert assemble_kernel(text) == [
        p.dma_load(gmem=16, spad=0, rows=4, cols=8, base=GmemBase.ARG0, token=1),
        p.dma_store(gmem=0, spad=3, base=GmemBase.ARG1),
        p.dma_load(gmem=0x40, spad=1000),
        p.wait(), p.wait(3), p.wait(2),
        p.matmul(a=0, b=64, k=32, accumulate=True),
        p.matmul(a=0, b=64, k=32, a_stride=2),
        p.vcfg(VectorCfg.MULT_A, 0x40000000), p.vcfg("lo", -128), p.vcfg("ZP_OUT", -3),
        p.vcmp(addr=3, lane=9, op=CmpOp.GE, imm=-5, flag=2, reduce=True),
        p.vargmax(addr=0, n=8, index=3),
        p.vargmax(addr=0, n=8, index=3, lane=5),
        p.vargmax(addr=0, n=8, index=1, flag=2, expect=7),
        p.vargmax(addr=2, n=1, index=0, lane=0, flag=7, expect=4095),
        0x3F, p.ret(),
    ]


def test_module_docstring_examples_assemble():
    from fusetile.kernels import asm
    plan, kernel = re.findall(r"::\n\n((?:    .*\n|\n)+)", asm.__doc__)
    assert len(assemble_plan(plan)) == 8
    assert assemble_kernel(kernel)[-1] == p.ret()


def test_dma_strides_default_to_cols():
    assert assemble_kernel("dma.load gmem=0, spad=0, rows=2, cols=5") == \
        [p.dma_load(gmem=0, spad=0, rows=2, cols=5, gmem_stride=5, spad_stride=5)]
    assert disassemble_kernel([p.dma_load(gmem=0, spad=0, rows=2, cols=5, gmem_stride=7)]) \
        == "    dma.load gmem=0, spad=0, rows=2, cols=5, gmem_stride=7\n"


def test_int8_immediates():
    for imm in (-128, -1, 0, 127):
        word = p.vcmp(addr=0, lane=0, op="eq", imm=imm, flag=0)
        assert assemble_kernel(f"vcmp addr=0, lane=0, op=eq, imm={imm}, flag=f0") == [word]
        assert f"imm={imm}," in disassemble_kernel([word])
    assert MicroInstr.from_bits(p.vclamp(src=0, out=0, n=1, lo=-1, hi=0)).args.vclamp.lo == 0xFF


# -- disassembler ----------------------------------------------------------------------------

KERNEL = [
    p.dma_load(gmem=0, spad=0, rows=4, cols=2, base=GmemBase.ARG0, token=1),
    p.dma_load(gmem=8, spad=8, rows=8, cols=1, base=GmemBase.ARG0),
    p.wait(0b0001),
    p.vcfg(VectorCfg.MULT_A, 0x40000000),
    p.vcfg(VectorCfg.ZP_OUT, -3),
    p.matmul(a=0, b=8, k=2, a_stride=1, b_stride=4),
    p.acc_bias(16),
    p.requant(out=20, out_stride=1),
    p.vclamp(src=20, out=20, n=4, lo=0, hi=127),
    p.vcmp(addr=20, lane=31, op=CmpOp.GT, imm=-5, flag=7, reduce=True),
    p.vargmax(addr=20, n=32, index=1),
    p.vargmax(addr=20, n=4, index=2, lane=7, flag=0, expect=3),
    p.vpool(src=20, out=24, n=2, window=2, stride=1, step=2, average=True, pairs=True),
    p.dma_store(gmem=0, spad=24, rows=1, cols=2, base=GmemBase.ARG1),
    MicroInstr.const({"op": MicroOp.NOP, "args": {"raw": 5}}).as_bits(),
    (1 << 64) | 0x3F,
    p.ret(),
]

KERNEL_LISTING = """\
    dma.load gmem=arg0, spad=0, rows=4, cols=2, token=1
    dma.load gmem=arg0+8, spad=8, rows=8
    wait 0b0001
    vcfg mult_a, 0x40000000
    vcfg zp_out, -3
    matmul a=0, b=8, k=2, b_stride=4
    acc.bias 16
    requant out=20
    vclamp src=20, out=20, n=4, lo=0, hi=127
    vcmp addr=20, lane=31, op=gt, imm=-5, flag=f7, reduce
    vargmax addr=20, n=32, index=x1
    vargmax addr=20, n=4, index=x2, lane=7, flag=f0, expect=3
    vpool src=20, out=24, n=2, window=2, stride=1, step=2, average, pairs
    dma.store gmem=arg1, spad=24, cols=2
    .word 0x00000000000000000000000000000500
    .word 0x0000000000000001000000000000003f
    ret
"""


def test_kernel_listing_snapshot():
    assert disassemble_kernel(KERNEL) == KERNEL_LISTING
    assert assemble_kernel(KERNEL_LISTING) == KERNEL


def test_plan_listing_snapshot():
    plan = [p.call(0, a=0x100), p.branch(2, 4, if_set=False), p.assume(0, 3), p.call(1),
            p.commit(), p.switch(3, 0, 1), p.mark(7), p.jump(100), p.done(),
            PlanInstr.const({"op": PlanOp.DONE, "cond": 1}).as_bits(), 0xF]
    listing = disassemble_plan(plan)
    assert listing == """\
L0:
    call 0, a=0x100
    branch f2, 0, @L4
    assume f0, 1, resume=3
    call 1
L4:
    commit
    switch x3, @L0, 1
    mark 0x7
    jump 100
    done
    .word 0x0000000000000012
    .word 0x000000000000000f
"""
    assert assemble_plan(listing) == plan


def test_disassembler_rejects_bad_words():
    with pytest.raises(ValueError, match=r"plan words must be integers from 0 to 2\*\*64 - 1"):
        disassemble_plan([1 << 64])
    with pytest.raises(ValueError, match="kernel words"):
        disassemble_kernel([-1])


def test_illegal_operands_disassemble_as_words():
    # Encodings the hardware rejects (or the syntax cannot say) stay bits.
    bad = [
        MicroInstr.const({"op": MicroOp.VPOOL, "args": {"vpool": {"window": 0}}}).as_bits(),
        MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": {"n": 0}}}).as_bits(),
        # VARGMAX: a lane without column; a flag, an expect without test.
        MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": {
            "n": 1, "lane": 3}}}).as_bits(),
        MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": {
            "n": 1, "column": 1, "flag": 1}}}).as_bits(),
        MicroInstr.const({"op": MicroOp.VARGMAX, "args": {"vargmax": {
            "n": 1, "expect": 9}}}).as_bits(),
        MicroInstr.const({"op": MicroOp.DMA_LOAD, "args": {"raw": 3}}).as_bits(),
        MicroInstr.const({"op": MicroOp.VCFG, "args": {"vcfg": {
            "reg": VectorCfg.LO, "value": 0x180}}}).as_bits(),
        MicroInstr.const({"op": MicroOp.RET, "_pad": 1}).as_bits(),
    ]
    assert disassemble_kernel(bad).count(".word") == len(bad)
    assert assemble_kernel(disassemble_kernel(bad)) == bad
    plan_bad = [PlanInstr.const({"op": PlanOp.BRANCH, "sel": 8}).as_bits(),
                PlanInstr.const({"op": PlanOp.NOP, "a": 1}).as_bits()]
    assert disassemble_plan(plan_bad).count(".word") == 2


# -- errors ----------------------------------------------------------------------------------

PLAN_ERRORS = [
    ("frob 1", 1, "unknown mnemonic 'frob' in a plan"),
    ("ret", 1, "unknown mnemonic 'ret' in a plan"),
    ("nop\ncall", 2, "missing operand slot for call (syntax: call SLOT[, a=A][, b=B])"),
    ("call 1, c=2", 1, "unknown operand 'c' for call"),
    ("call 1, 2, 3, 4", 1, "too many operands for call (it takes 3)"),
    ("call 1, a=2, 3", 1, "positional operand '3' after a named one"),
    ("call 1, slot=2", 1, "operand slot given twice"),
    ("call 1, a=", 1, "missing value for a"),
    ("call 1,, a=2", 1, "empty operand"),
    ("call 256", 1, "value out of range: slot must be from 0 to 255, not 256"),
    ("call -1", 1, "value out of range: slot must be from 0 to 255, not -1"),
    ("mark 0x1000000", 1, "value out of range: value must be from 0 to 16777215, not 16777216"),
    ("mark ten", 1, "value must be a number, not 'ten'"),
    ("branch f8, 1, 0", 1, "value out of range: flag must be from 0 to 7, not 8"),
    ("branch f3, 2, 0", 1, "value out of range: if_set must be from 0 to 1, not 2"),
    ("branch q3, 1, 0", 1, "flag must be a register f0..f7, not 'q3'"),
    ("switch x4, 0, 1", 1, "value out of range: index must be from 0 to 3, not 4"),
    ("jump @nowhere", 1, "undefined label 'nowhere'"),
    ("x:\nnop\nx: done", 3, "duplicate label 'x' (first defined on line 1)"),
    ("call @x, 1\nx:", 1, "slot takes a value, not a label"),
    ("assume f1, 1, resume=@x\nx:", 1, "resume takes a value, not a label"),
    (".word 0x10000000000000000", 1,
     "value out of range: .word must be from 0 to 18446744073709551615"),
    (".word", 1, "missing operand for .word"),
]

KERNEL_ERRORS = [
    ("call 1", 1, "unknown mnemonic 'call' in a kernel"),
    ("dma.load spad=0", 1, "missing operand gmem for dma.load"),
    ("dma.load gmem=arg2+1, spad=0", 1, "gmem must be N, arg0+N or arg1+N, not 'arg2+1'"),
    ("dma.load gmem=arg0+0x1000000, spad=0", 1, "value out of range: gmem must be from 0"),
    ("dma.load gmem=0, spad=0, token=4", 1, "value out of range: token must be from 0 to 3"),
    ("matmul a=0, b=0", 1, "missing operand k for matmul"),
    ("matmul a=0, b=0, k=1, accumulate", 1, "unknown operand"),
    ("matmul a=0, b=0, k=1, acc=2", 1, "value out of range: acc must be from 0 to 1, not 2"),
    ("vpool src=0, out=0, n=1, window=0, stride=1, step=1", 1,
     "value out of range: window must be from 1 to 15, not 0"),
    ("vargmax addr=0, n=0, index=x0", 1, "value out of range: n must be from 1 to 4095"),
    ("vargmax addr=0, n=1, index=x0, lane=256", 1,
     "value out of range: lane must be from 0 to 255, not 256"),
    ("vargmax addr=0, n=1, index=x0, flag=f8, expect=0", 1,
     "value out of range: flag must be from 0 to 7, not 8"),
    ("vargmax addr=0, n=1, index=x0, flag=f1, expect=4096", 1,
     "value out of range: expect must be from 0 to 4095, not 4096"),
    ("vargmax addr=0, n=1, index=x0, flag=f1", 1,
     "missing operand expect (required with flag)"),
    ("vargmax addr=0, n=1, index=x0, lane=2, expect=1", 1, "expect is taken only with flag"),
    ("vargmax addr=0, n=1, index=x0, lane=x2", 1, "lane must be a number, not 'x2'"),
    ("vargmax addr=0, n=1, index=x0, flag=q1, expect=1", 1,
     "flag must be a register f0..f7, not 'q1'"),
    ("vclamp src=0, out=0, n=1, lo=-129, hi=0", 1,
     "value out of range: lo must be from -128 to 127, not -129"),
    ("vcmp addr=0, lane=0, op=ne, imm=0, flag=0", 1,
     "op must be one of ge, gt, lt, eq, not 'ne'"),
    ("vcfg shift, 32", 1, "value out of range: value of shift must be from 0 to 31, not 32"),
    ("vcfg mult_a, 0x80000000", 1, "value out of range: value of mult_a must be from 0 to 2147483647"),
    ("vcfg hi, 128", 1, "value out of range: value of hi must be from -128 to 127, not 128"),
    ("vcfg pc, 1", 1, "reg must be one of mult_a"),
    ("\n\nwait 16", 3, "value out of range: tokens must be from 0 to 15, not 16"),
    ("vadd @x, b=0, out=0, n=1\nx:", 1, "a takes a value, not a label"),
    ("vadd a=0, b=0, out=0, n=1, @x", 1, "positional operand '@x' after a named one"),
]


@pytest.mark.parametrize("assemble,text,lineno,reason", [
    *((assemble_plan, *e) for e in PLAN_ERRORS),
    *((assemble_kernel, *e) for e in KERNEL_ERRORS),
])
def test_errors(assemble, text, lineno, reason):
    with pytest.raises(AsmError) as info:
        assemble(text)
    e = info.value
    assert e.lineno == lineno
    assert e.line == text.splitlines()[lineno - 1]
    assert e.reason.startswith(reason), e.reason
    assert str(e) == f"line {lineno}: {e.reason}: {e.line.strip()!r}"
    assert isinstance(e, ValueError)


def test_assemble_takes_text():
    with pytest.raises(TypeError, match="text must be a str, not 3"):
        assemble_plan(3)


# -- builders -------------------------------------------------------------------------------

@pytest.mark.parametrize("call,message", [
    (lambda: p.call(256), "slot must be an integer from 0 to 255, not 256"),
    (lambda: p.jump(-1), "a must be an integer from 0 to 16777215, not -1"),
    (lambda: p.branch(8, 0), "flag must be an integer from 0 to 7, not 8"),
    (lambda: p.branch(0, 1 << 24), "target must be an integer from 0 to 16777215"),
    (lambda: p.branch(0, 0, if_set=2), "if_set must be a bool, not 2"),
    (lambda: p.switch(4, 0, 1), "index must be an integer from 0 to 3, not 4"),
    (lambda: p.switch(0, 0, 1 << 24), "size must be an integer from 0 to 16777215"),
    (lambda: p.assume(0, "5"), "resume must be an integer from 0 to 16777215, not '5'"),
    (lambda: p.wait(16), "tokens must be an integer from 0 to 15, not 16"),
    (lambda: p.dma_load(gmem=0, spad=0, token=4), "token must be an integer from 0 to 3"),
    (lambda: p.dma_store(gmem=1 << 24, spad=0), "gmem must be an integer from 0 to 16777215"),
    (lambda: p.matmul(a=0, b=0, k=1 << 16), "k must be an integer from 0 to 65535"),
    (lambda: p.matmul(a=0, b=0, k=1, accumulate=3), "accumulate must be a bool, not 3"),
    (lambda: p.acc_bias(1 << 16), "addr must be an integer from 0 to 65535"),
    (lambda: p.requant(out=0, params=-1), "params must be an integer from 0 to 65535"),
    (lambda: p.vadd(a=0, b=0, out=0, n=4096), "n must be an integer from 0 to 4095"),
    (lambda: p.vpool(src=0, out=0, n=1, window=0, stride=1, step=1),
     "window must be an integer from 1 to 15, not 0"),
    (lambda: p.vpool(src=0, out=0, n=1, window=16, stride=1, step=1),
     "window must be an integer from 1 to 15, not 16"),
    (lambda: p.vclamp(src=0, out=0, n=1, lo=-129, hi=0),
     "lo must be an integer from -128 to 127, not -129"),
    (lambda: p.vclamp(src=0, out=0, n=1, lo=0, hi=255),
     "hi must be an integer from -128 to 127, not 255"),
    (lambda: p.vcmp(addr=0, lane=256, op="ge", imm=0, flag=0), "lane must be an integer"),
    (lambda: p.vcmp(addr=0, lane=0, op="ne", imm=0, flag=0),
     "op must be a CmpOp (GE, GT, LT, EQ), not 'ne'"),
    (lambda: p.vcmp(addr=0, lane=0, op="ge", imm=128, flag=0), "imm must be an integer from -128"),
    (lambda: p.vcmp(addr=0, lane=0, op="ge", imm=0, flag=8), "flag must be an integer from 0 to 7"),
    (lambda: p.vargmax(addr=0, n=0, index=0), "n must be an integer from 1 to 4095, not 0"),
    (lambda: p.vargmax(addr=0, n=1, index=4), "index must be an integer from 0 to 3, not 4"),
    (lambda: p.vargmax(addr=0, n=1, index=0, lane=256),
     "lane must be an integer from 0 to 255, not 256"),
    (lambda: p.vargmax(addr=0, n=1, index=0, lane=-1),
     "lane must be an integer from 0 to 255, not -1"),
    (lambda: p.vargmax(addr=0, n=1, index=0, flag=8, expect=0),
     "flag must be an integer from 0 to 7, not 8"),
    (lambda: p.vargmax(addr=0, n=1, index=0, flag=1),
     "expect must be an integer from 0 to 4095, not None"),
    (lambda: p.vargmax(addr=0, n=1, index=0, flag=1, expect=4096),
     "expect must be an integer from 0 to 4095, not 4096"),
    (lambda: p.vargmax(addr=0, n=1, index=0, lane=3, expect=1),
     "expect must be None without flag, not 1"),
    (lambda: p.vcfg("pc", 0), "reg must be a VectorCfg"),
    (lambda: p.vcfg(VectorCfg.SHIFT, 32), "value must be an integer from 0 to 31, not 32"),
    (lambda: p.vcfg(VectorCfg.MULT_B, 2**31), "value must be an integer from 0 to 2147483647"),
    (lambda: p.vcfg(VectorCfg.ZP_A, 200), "value must be an integer from -128 to 127, not 200"),
])
def test_builder_errors(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_builders_keep_their_signatures():
    assert p.call(1, 2, 3) == p.call(1, a=2, b=3)
    assert p.wait() == p.wait(0)
    assert p.dma_load(gmem=0, spad=0, rows=2, cols=3) == \
        p.dma_load(gmem=0, spad=0, rows=2, cols=3, gmem_stride=3, spad_stride=3, token=0)
    with pytest.raises(TypeError, match="base must be a GmemBase, not 1"):
        p.dma_load(gmem=0, spad=0, base=1)


def test_builders_pack_through_the_layouts():
    v = MicroInstr.from_bits(p.vcmp(addr=3, lane=9, op=CmpOp.LT, imm=-5, flag=6, reduce=True))
    assert v.op is MicroOp.VCMP
    assert (v.args.vcmp.addr, v.args.vcmp.lane, v.args.vcmp.op, v.args.vcmp.imm,
            v.args.vcmp.flag, v.args.vcmp.reduce) == (3, 9, CmpOp.LT, 0xFB, 6, 1)
    v = PlanInstr.from_bits(p.assume(5, 77, expect=False))
    assert (v.op, v.sel, v.cond, v.a) == (PlanOp.ASSUME, 5, 0, 77)
    v = MicroInstr.from_bits(p.vargmax(addr=7, n=300, index=2, lane=5, flag=4, expect=99))
    assert v.op is MicroOp.VARGMAX
    a = v.args.vargmax
    assert (a.addr, a.n, a.index, a.column, a.lane, a.test, a.flag, a.expect) == \
        (7, 300, 2, 1, 5, 1, 4, 99)
    a = MicroInstr.from_bits(p.vargmax(addr=7, n=300, index=2)).args.vargmax
    assert (a.column, a.lane, a.test, a.flag, a.expect) == (0, 0, 0, 0, 0)
    v = MicroInstr.from_bits(p.vcfg("hi", -1))
    assert (v.args.vcfg.reg, v.args.vcfg.value) == (VectorCfg.HI, 0xFF)
