"""Assembler and disassembler for plans and kernels.

The text form of the instructions :mod:`fusetile.kernels.program` builds. Both
directions are driven by one table (:data:`PLAN_SYNTAX`, :data:`MICRO_SYNTAX`) over the
layouts in :mod:`fusetile.kernels.isa`: an entry names the opcode and, for each
operand, the field it is stored in and how it is written. Adding an instruction is an
opcode and an args ``Struct`` in ``isa.py`` plus one entry here.

Syntax
------
One instruction per line; ``;`` starts a comment; blank lines are ignored. A plan::

    start:
        call 2, a=0x100, b=0x200        ; run slot 2 with arguments a and b
        branch f3, 1, @exit             ; if F3 == 1: go to exit
        switch x0, @table, 2            ; go to table + X0 (X0 >= 2 faults)
    table:
        jump @start
        assume f1, 1, resume=5          ; guess F1 == 1; on a miss: PC 5, other bank
        call 3
        commit
    exit:
        done

A kernel::

    dma.load gmem=arg0+16, spad=0, rows=4, cols=8, token=1
    wait 0b0010                         ; wait for the DMAs with token 1
    vcfg mult_a, 0x40000000
    matmul a=0, b=64, k=32, acc
    requant out=128
    vcmp addr=128, lane=9, op=ge, imm=-5, flag=f2, reduce
    ret

* **Mnemonics** are the opcode names in lower case, ``_`` written as ``.``
  (``DMA_LOAD`` is ``dma.load``, ``ACC_BIAS`` is ``acc.bias``).
* **Operands** are separated by commas. Each has a name and a place: it is written
  either positionally, in the instruction's operand order, or as ``name=value`` in any
  order after the positional ones. An on/off operand (``acc``, ``reduce``,
  ``per_channel``, ``average``, ``pairs``) is set by writing its bare name (or
  ``name=1``). Operands with a default may be left out.
* **Values**: integers in decimal, ``0x`` hex or ``0b`` binary (``_`` separators
  allowed); signed immediates (int8) take -128..127. Flags are ``f0``..``f7``, index
  registers ``x0``..``x3`` (a bare number is accepted too). Comparisons are ``ge``,
  ``gt``, ``lt``, ``eq``; configuration registers ``mult_a``, ``mult_b``, ``shift``,
  ``zp_a``, ``zp_b``, ``zp_out``, ``lo``, ``hi``. A DMA's GMEM address is ``N``
  (absolute), ``arg0+N`` or ``arg1+N`` (relative to the CALL's argument ``a`` / ``b``).
* **Labels** (``name:`` at the start of a line, alone or before an instruction) stand
  for the plan PC of the next instruction; a plan target (``jump``, ``branch``,
  ``switch``) is ``@name`` or a number. ``assume``'s ``resume`` PC is in the *other*
  plan bank, so it is always a number.
* ``.word N`` emits the instruction bits ``N`` as they are: the disassembler writes it
  for reserved opcodes and for any encoding the syntax cannot express, so that
  ``assemble(disassemble(words)) == words`` for every word.

The disassembler writes the canonical form: the operands an instruction is usually
read by positionally, the rest as ``name=value`` (left out when they equal their
default), on/off operands by name when set; plan targets inside the program get labels
``L<pc>``.

Errors raise :class:`AsmError` with the line number, the line and the problem.
"""

import re

from .isa import (PlanOp, PlanInstr, MicroOp, MicroInstr, MicroArgs, GmemBase, CmpOp,
                  VectorCfg, FLAGS, INDEX_REGS, PLAN_INSTR_BITS, MICRO_INSTR_BITS)
from .program import VCFG_RANGES


__all__ = [
    "AsmError", "assemble_plan", "assemble_kernel", "disassemble_plan",
    "disassemble_kernel", "Operand", "InstrSyntax", "PLAN_SYNTAX", "MICRO_SYNTAX",
    "mnemonic",
]


class AsmError(ValueError):
    """A line of assembly that cannot be assembled.

    Attributes
    ----------
    lineno : int
        1-based line number.
    line : str
        The line's text.
    reason : str
        What is wrong with it.
    """

    def __init__(self, lineno, line, reason):
        self.lineno = lineno
        self.line = line
        self.reason = reason
        super().__init__(f"line {lineno}: {reason}: {line.strip()!r}")


class _Bad(Exception):
    """An operand problem; becomes an :class:`AsmError` with the line attached."""


class _NotCanonical(Exception):
    """Bits the syntax cannot express (the disassembler writes ``.word``)."""


_REQUIRED = object()


def _number(text, name):
    try:
        return int(text.replace(" ", ""), 0)
    except ValueError:
        raise _Bad(f"{name} must be a number, not {text!r}") from None


def _in_range(name, value, lo, hi):
    if not lo <= value <= hi:
        raise _Bad(f"value out of range: {name} must be from {lo} to {hi}, not {value}")
    return value


# -- operand kinds ---------------------------------------------------------------------
#
# A kind turns an operand's text into a value (``parse``), a value into field bits
# (``encode``), field bits back into a value (``decode``) and a value into canonical
# text (``format``). ``encode`` does all range checking, so that decoding followed by
# encoding proves the bits are expressible.

class _Unsigned:
    def __init__(self, fmt="dec", lo=0, hi=None):
        self.fmt, self.lo, self.hi = fmt, lo, hi

    def limits(self, width):
        return self.lo, (1 << width) - 1 if self.hi is None else self.hi

    def values(self, width):
        lo, hi = self.limits(width)
        return f"{lo}..{hi}"

    def parse(self, text, name, labels):
        return _number(text, name)

    def encode(self, value, name, width, values):
        return _in_range(name, value, *self.limits(width))

    def decode(self, bits, width, values):
        return bits

    def format(self, value, width, values, labels):
        if self.fmt == "hex":
            return f"{value:#x}"
        if self.fmt == "mask":
            return f"0b{value:0{width}b}"
        return str(value)


class _Bool(_Unsigned):
    def __init__(self):
        super().__init__(hi=1)

    def values(self, width):
        return "set by writing its name"


class _Signed8(_Unsigned):
    def values(self, width):
        return "-128..127"

    def encode(self, value, name, width, values):
        return _in_range(name, value, -128, 127) & 0xFF

    def decode(self, bits, width, values):
        return bits - 256 if bits & 0x80 else bits


class _Register(_Unsigned):
    def __init__(self, prefix, count):
        super().__init__(hi=count - 1)
        self.prefix, self.count = prefix, count

    def values(self, width):
        return f"{self.prefix}0..{self.prefix}{self.count - 1}"

    def parse(self, text, name, labels):
        low = text.lower()
        if low.startswith(self.prefix):
            low = low[1:]
        if not low.isdigit():
            raise _Bad(f"{name} must be a register {self.values(0)}, not {text!r}")
        return int(low)

    def format(self, value, width, values, labels):
        return f"{self.prefix}{value}"


class _Choice(_Unsigned):
    def __init__(self, enum):
        super().__init__()
        self.enum = enum

    def values(self, width):
        return ", ".join(m.name.lower() for m in self.enum)

    def parse(self, text, name, labels):
        try:
            return self.enum[text.upper()]
        except KeyError:
            raise _Bad(f"{name} must be one of {self.values(0)}, not {text!r}") from None

    def encode(self, value, name, width, values):
        return value.value

    def decode(self, bits, width, values):
        try:
            return self.enum(bits)
        except ValueError:
            raise _NotCanonical from None

    def format(self, value, width, values, labels):
        return value.name.lower()


class _Target(_Unsigned):
    def values(self, width):
        return f"@label or 0..{(1 << width) - 1}"

    def parse(self, text, name, labels):
        if text.startswith("@"):
            label = text[1:].strip()
            if label not in labels:
                raise _Bad(f"undefined label {label!r}")
            return labels[label]
        return _number(text, name)

    def format(self, value, width, values, labels):
        return f"@{labels[value]}" if value in labels else str(value)


class _GmemAddress:
    """``N``, ``arg0+N``, ``arg1+N``: two fields, the base and the offset."""

    def values(self, width):
        return f"N, arg0+N or arg1+N (N = 0..{(1 << width) - 1})"

    def parse(self, text, name, labels):
        base, sep, offset = text.replace(" ", "").partition("+")
        if base.lower() in ("arg0", "arg1"):
            return GmemBase[base.upper()], _number(offset, name) if sep else 0
        if sep:
            raise _Bad(f"{name} must be N, arg0+N or arg1+N, not {text!r}")
        return GmemBase.ABS, _number(text, name)

    def encode(self, value, name, width, values):
        base, offset = value
        return base.value, _in_range(name, offset, 0, (1 << width) - 1)

    def decode(self, bits, width, values):
        base, offset = bits
        try:
            return GmemBase(base), offset
        except ValueError:
            raise _NotCanonical from None

    def format(self, value, width, values, labels):
        base, offset = value
        if base is GmemBase.ABS:
            return str(offset)
        return base.name.lower() + (f"+{offset}" if offset else "")


class _Optional:
    """An operand that is off (``None``, left out) or has a value of ``kind``: two
    fields, an on/off bit and the value (0 when off). VARGMAX's ``lane`` (``column``,
    ``lane``) and ``flag`` (``test``, ``flag``)."""

    def __init__(self, kind):
        self.kind = kind

    def values(self, width):
        return f"{self.kind.values(width)}, or left out (off)"

    def parse(self, text, name, labels):
        return self.kind.parse(text, name, labels)

    def encode(self, value, name, width, values):
        if value is None:
            return 0, 0
        return 1, self.kind.encode(value, name, width, values)

    def decode(self, bits, width, values):
        on, value = bits
        # Off with a value that is not 0 is not canonical: encoding None gives (0, 0).
        return self.kind.decode(value, width, values) if on else None

    def format(self, value, width, values, labels):
        return self.kind.format(value, width, values, labels)


class _With(_Unsigned):
    """An operand taken only together with the operand ``other`` (``None`` without it,
    required with it); its field is 0 without ``other``. VARGMAX's ``expect``."""

    def __init__(self, other):
        super().__init__()
        self.other = other

    def values(self, width):
        return f"{super().values(width)}, with `{self.other}` only (required with it)"

    def encode(self, value, name, width, values):
        if values[self.other] is None:
            if value is not None:
                raise _Bad(f"{name} is taken only with {self.other}")
            return 0
        if value is None:
            raise _Bad(f"missing operand {name} (required with {self.other})")
        return super().encode(value, name, width, values)

    def decode(self, bits, width, values):
        # Bits without `other` are kept, so that encoding them fails: not canonical.
        return None if values[self.other] is None and bits == 0 else bits


class _CfgValue(_Unsigned):
    """VCFG's value: its range and form depend on the register (``reg`` operand)."""

    def values(self, width):
        return "depends on `reg` (see the registers)"

    def encode(self, value, name, width, values):
        lo, hi = VCFG_RANGES[values["reg"]]
        return _in_range(f"{name} of {values['reg'].name.lower()}", value, lo, hi) & \
            ((1 << width) - 1 if lo >= 0 else 0xFF)

    def decode(self, bits, width, values):
        lo, _ = VCFG_RANGES[values["reg"]]
        if lo < 0 and bits < 256:
            return bits - 256 if bits & 0x80 else bits
        return bits

    def format(self, value, width, values, labels):
        return f"{value:#x}" if VCFG_RANGES[values["reg"]][1] > 255 else str(value)


U, HEX, MASK = _Unsigned(), _Unsigned("hex"), _Unsigned("mask")
BOOL, INT8 = _Bool(), _Signed8()
FLAG, INDEX = _Register("f", FLAGS), _Register("x", INDEX_REGS)
TARGET = _Target()


class Operand:
    """One operand of an instruction's syntax.

    Parameters
    ----------
    name : str
        Its name in the syntax (``name=value``).
    field : str or tuple of str
        The layout field(s) it is stored in.
    kind
        How it is written and checked.
    default
        Its value when left out: a value, a function of the other operands' values, or
        absent (the operand is required).
    positional : bool
        Whether the disassembler writes it positionally.
    doc : str
        One line for the documentation.
    """

    def __init__(self, name, field, kind, *, default=_REQUIRED, positional=False, doc=""):
        self.name, self.field, self.kind = name, field, kind
        self.default, self.positional, self.doc = default, positional, doc

    @property
    def fields(self):
        return self.field if isinstance(self.field, tuple) else (self.field,)

    @property
    def required(self):
        return self.default is _REQUIRED

    @property
    def is_switch(self):
        return isinstance(self.kind, _Bool)

    def default_value(self, values):
        return self.default(values) if callable(self.default) else self.default


def mnemonic(op):
    """The assembler mnemonic of a ``PlanOp`` / ``MicroOp``."""
    return op.name.lower().replace("_", ".")


class InstrSyntax:
    """The table entry of one instruction.

    Parameters
    ----------
    op : PlanOp or MicroOp
    args : str or None
        The :class:`~fusetile.kernels.isa.MicroArgs` member holding the operands (micro
        instructions with operands only).
    operands : list of Operand
        In positional order.
    example : str
        A line of assembly for the documentation.
    """

    def __init__(self, op, operands=(), *, args=None, example=None):
        self.op, self.args, self.operands = op, args, list(operands)
        self.mnemonic = mnemonic(op)
        self.example = example if example is not None else self.mnemonic
        self.by_name = {o.name: o for o in self.operands}

    @property
    def layout(self):
        """The layout the operands' fields are in."""
        if isinstance(self.op, PlanOp):
            return PlanInstr.as_shape()
        return MicroArgs.as_shape()[self.args].shape.as_shape() if self.args else None

    @property
    def field_base(self):
        """Bit offset of :attr:`layout` inside the instruction."""
        if isinstance(self.op, PlanOp):
            return 0
        return MicroInstr.as_shape()["args"].offset

    def width(self, field):
        return self.layout[field].width

    def synopsis(self):
        """The syntax with placeholders, e.g. ``matmul a=A, b=B, k=K[, a_stride=A_STRIDE]...``."""
        text = self.mnemonic
        for i, o in enumerate(self.operands):
            sep = ", " if i else " "
            if o.is_switch:
                part = o.name
            elif o.positional:
                part = o.name.upper()
            else:
                part = f"{o.name}={o.name.upper()}"
            if o.required:
                text += sep + part
            else:   # `wait [TOKENS]`, `call SLOT[, a=A]`
                text += f" [{part}]" if not i else f"[{sep}{part}]"
        return text

    # encoding

    def encode(self, values):
        """Bits of the instruction with operand ``values`` (by name, complete)."""
        fields = {}
        for o in self.operands:
            width = self.width(o.fields[-1])
            bits = o.kind.encode(values[o.name], o.name, width, values)
            fields.update(zip(o.fields, bits if isinstance(bits, tuple) else (bits,)))
        if isinstance(self.op, PlanOp):
            return PlanInstr.const({"op": self.op, **fields}).as_bits()
        args = {self.args: fields} if self.args else {"raw": 0}
        return MicroInstr.const({"op": self.op, "args": args}).as_bits()

    def decode(self, word):
        """Operand values of ``word`` (raises :class:`_NotCanonical`)."""
        base = self.field_base
        raw = {}
        if self.layout is not None:
            for name, field in self.layout:
                raw[name] = (word >> (base + field.offset)) & ((1 << field.width) - 1)
        values = {}
        for o in self.operands:
            bits = tuple(raw[f] for f in o.fields)
            values[o.name] = o.kind.decode(bits if len(bits) > 1 else bits[0],
                                           self.width(o.fields[-1]), values)
        try:
            if self.encode(values) != word:
                raise _NotCanonical
        except _Bad:
            raise _NotCanonical from None
        return values

    def format(self, values, labels):
        parts = []
        for o in self.operands:
            value = values[o.name]
            width = self.width(o.fields[-1])
            if o.is_switch:
                if value:
                    parts.append(o.name)
            elif o.positional:
                parts.append(o.kind.format(value, width, values, labels))
            elif o.required or value != o.default_value(values):
                parts.append(f"{o.name}={o.kind.format(value, width, values, labels)}")
        return f"{self.mnemonic} {', '.join(parts)}".rstrip()


def _op(name, field, kind, **kwargs):
    return Operand(name, field, kind, **kwargs)


#: Plan instructions, in opcode order.
PLAN_SYNTAX = [
    InstrSyntax(PlanOp.NOP),
    InstrSyntax(PlanOp.CALL, [
        _op("slot", "sel", U, positional=True, doc="kernel slot to run"),
        _op("a", "a", HEX, default=0, doc="argument 0 (a GMEM word address for `arg0+N`)"),
        _op("b", "b", HEX, default=0, doc="argument 1 (a GMEM word address for `arg1+N`)"),
    ], example="call 2, a=0x100, b=0x200"),
    InstrSyntax(PlanOp.DONE),
    InstrSyntax(PlanOp.MARK, [
        _op("value", "a", HEX, positional=True, doc="value for the MARK register"),
    ], example="mark 0x2a"),
    InstrSyntax(PlanOp.BRANCH, [
        _op("flag", "sel", FLAG, positional=True, doc="flag tested"),
        _op("if_set", "cond", _Unsigned(hi=1), positional=True,
            doc="branch when the flag is 1 (`1`) or 0 (`0`)"),
        _op("target", "a", TARGET, positional=True, doc="plan PC to continue at"),
    ], example="branch f3, 1, @exit"),
    InstrSyntax(PlanOp.SWITCH, [
        _op("index", "sel", INDEX, positional=True, doc="index register"),
        _op("table", "a", TARGET, positional=True, doc="plan PC of entry 0 of the jump table"),
        _op("size", "b", U, positional=True, doc="number of table entries"),
    ], example="switch x0, @table, 4"),
    InstrSyntax(PlanOp.ASSUME, [
        _op("flag", "sel", FLAG, positional=True, doc="guard flag"),
        _op("expect", "cond", _Unsigned(hi=1), positional=True,
            doc="the value the guard expects the flag to have"),
        _op("resume", "a", U, doc="plan PC in the other bank to continue at on a miss"),
    ], example="assume f1, 1, resume=5"),
    InstrSyntax(PlanOp.COMMIT),
    InstrSyntax(PlanOp.JUMP, [
        _op("target", "a", TARGET, positional=True, doc="plan PC to continue at"),
    ], example="jump @start"),
]


def _dma(op, example):
    return InstrSyntax(op, [
        _op("gmem", ("gmem_base", "gmem_addr"), _GmemAddress(),
            doc="GMEM word address, absolute or relative to a CALL argument"),
        _op("spad", "spad_addr", U, doc="scratchpad word address in the partition"),
        _op("rows", "rows", U, default=1, doc="rows to copy"),
        _op("cols", "cols", U, default=1, doc="words per row"),
        _op("gmem_stride", "gmem_stride", U, default=lambda v: v["cols"],
            doc="GMEM words from one row to the next (default: `cols`)"),
        _op("spad_stride", "spad_stride", U, default=lambda v: v["cols"],
            doc="scratchpad words from one row to the next (default: `cols`)"),
        _op("token", "token", U, default=0, doc="dependency token, for `wait`"),
    ], args="dma", example=example)


#: Micro-instructions, in opcode order.
MICRO_SYNTAX = [
    InstrSyntax(MicroOp.NOP),
    InstrSyntax(MicroOp.RET),
    _dma(MicroOp.DMA_LOAD, "dma.load gmem=arg0+16, spad=0, rows=4, cols=8, token=1"),
    _dma(MicroOp.DMA_STORE, "dma.store gmem=arg1, spad=32, rows=4, cols=2, gmem_stride=8"),
    InstrSyntax(MicroOp.WAIT, [
        _op("tokens", "tokens", MASK, default=0, positional=True,
            doc="mask of tokens to wait for; 0 (or left out) without `compute`: every DMA"),
        _op("compute", "compute", BOOL, default=0, doc="also wait for the compute unit"),
    ], args="wait", example="wait 0b0010, compute"),
    InstrSyntax(MicroOp.MATMUL, [
        _op("a", "a_addr", U, doc="word address of the first A word"),
        _op("b", "b_addr", U, doc="word address of the first B word"),
        _op("k", "k", U, doc="steps"),
        _op("a_stride", "a_stride", U, default=1, doc="words between A words"),
        _op("b_stride", "b_stride", U, default=1, doc="words between B words"),
        _op("acc", "accumulate", BOOL, default=0,
            doc="add to ACC instead of overwriting it at the first step"),
    ], args="matmul", example="matmul a=0, b=64, k=32, acc"),
    InstrSyntax(MicroOp.ACC_BIAS, [
        _op("addr", "addr", U, positional=True, doc="word address of the int32 biases"),
    ], args="acc_bias", example="acc.bias 96"),
    InstrSyntax(MicroOp.REQUANT, [
        _op("out", "out_addr", U, doc="word address of row 0's output"),
        _op("out_stride", "out_stride", U, default=1, doc="words between output rows"),
        _op("per_channel", "per_channel", BOOL, default=0,
            doc="per-row multiplier and shift from the table at `params`"),
        _op("params", "param_addr", U, default=0,
            doc="word address of the per-channel table"),
    ], args="requant", example="requant out=128, out_stride=2, per_channel, params=200"),
    InstrSyntax(MicroOp.VADD, [
        _op("a", "a_addr", U, doc="first input word"),
        _op("b", "b_addr", U, doc="second input word"),
        _op("out", "out_addr", U, doc="first output word"),
        _op("n", "n", U, doc="words"),
    ], args="vadd", example="vadd a=0, b=16, out=32, n=16"),
    InstrSyntax(MicroOp.VPOOL, [
        _op("src", "in_addr", U, doc="first input word"),
        _op("out", "out_addr", U, doc="first output word"),
        _op("n", "n", U, doc="output words"),
        _op("window", "window", _Unsigned(lo=1), doc="input words per output word"),
        _op("stride", "in_stride", U, doc="words between the words of a window"),
        _op("step", "in_step", U, doc="words between the starts of consecutive windows"),
        _op("average", "average", BOOL, default=0, doc="average instead of maximum"),
        _op("pairs", "pairs", BOOL, default=0, doc="pool lane pairs 2j, 2j+1 into lane j too"),
    ], args="vpool", example="vpool src=0, out=64, n=4, window=2, stride=1, step=2, pairs"),
    InstrSyntax(MicroOp.VCLAMP, [
        _op("src", "in_addr", U, doc="first input word"),
        _op("out", "out_addr", U, doc="first output word"),
        _op("n", "n", U, doc="words"),
        _op("lo", "lo", INT8, doc="lower bound"),
        _op("hi", "hi", INT8, doc="upper bound"),
    ], args="vclamp", example="vclamp src=64, out=64, n=8, lo=0, hi=127"),
    InstrSyntax(MicroOp.VCMP, [
        _op("addr", "addr", U, doc="word address lane 0 is in"),
        _op("lane", "lane", U, doc="lane compared (or the last lane of the reduction)"),
        _op("op", "op", _Choice(CmpOp), doc="comparison"),
        _op("imm", "imm", INT8, doc="value compared with"),
        _op("flag", "flag", FLAG, doc="flag written"),
        _op("reduce", "reduce", BOOL, default=0, doc="compare the largest of lanes 0..lane"),
    ], args="vcmp", example="vcmp addr=3, lane=9, op=ge, imm=-5, flag=f2, reduce"),
    InstrSyntax(MicroOp.VARGMAX, [
        _op("addr", "addr", U, doc="word address lane 0 is in (the first word)"),
        _op("n", "n", _Unsigned(lo=1), doc="lanes (words with `lane`)"),
        _op("index", "index", INDEX, doc="index register written"),
        _op("lane", ("column", "lane"), _Optional(U), default=None,
            doc="column mode: the word number of the largest of this lane of the `n` "
                "words (below `word_bytes`)"),
        _op("flag", ("test", "flag"), _Optional(FLAG), default=None,
            doc="also write this flag = (result == `expect`)"),
        _op("expect", "expect", _With("flag"), default=None,
            doc="the value `flag` compares the result with"),
    ], args="vargmax", example="vargmax addr=40, n=10, index=x0, lane=0, flag=f1, expect=2"),
    InstrSyntax(MicroOp.VCFG, [
        _op("reg", "reg", _Choice(VectorCfg), positional=True, doc="configuration register"),
        _op("value", "value", _CfgValue(), positional=True,
            doc="its value: 0..2**31-1 (mult_a, mult_b), 0..31 (shift), -128..127 (others)"),
    ], args="vcfg", example="vcfg mult_a, 0x40000000"),
]


class _Level:
    def __init__(self, name, table, op_field, bits):
        self.name, self.bits = name, bits
        self.by_mnemonic = {s.mnemonic: s for s in table}
        self.by_opcode = {s.op.value: s for s in table}
        self.op_mask = (1 << op_field.width) - 1
        assert op_field.offset == 0


_PLAN = _Level("plan", PLAN_SYNTAX, PlanInstr.as_shape()["op"], PLAN_INSTR_BITS)
_MICRO = _Level("kernel", MICRO_SYNTAX, MicroInstr.as_shape()["op"], MICRO_INSTR_BITS)


# -- assembler -------------------------------------------------------------------------

_LABEL = re.compile(r"\s*([A-Za-z_]\w*)\s*:(?!=)")
_KEYWORD = re.compile(r"([A-Za-z_]\w*)\s*=(.*)$", re.S)


def _split_lines(text):
    """``(lineno, line, labels, body)`` for each line."""
    for lineno, line in enumerate(text.splitlines(), 1):
        body = line.split(";", 1)[0]
        labels = []
        while m := _LABEL.match(body):
            labels.append(m.group(1))
            body = body[m.end():]
        yield lineno, line, labels, body.strip()


def _bind(syntax, operand_text, labels):
    """Operand values by name from the text after the mnemonic."""
    values, keyword_seen = {}, False
    tokens = [t.strip() for t in operand_text.split(",")] if operand_text.strip() else []
    positional = iter(syntax.operands)
    for token in tokens:
        if not token:
            raise _Bad("empty operand")
        m = _KEYWORD.match(token)
        if m:
            name, text = m.group(1).lower(), m.group(2).strip()
            keyword_seen = True
            if name not in syntax.by_name:
                raise _Bad(f"unknown operand {name!r} for {syntax.mnemonic}")
            operand = syntax.by_name[name]
            if not text:
                raise _Bad(f"missing value for {name}")
        elif token.lower() in syntax.by_name and syntax.by_name[token.lower()].is_switch:
            operand, text = syntax.by_name[token.lower()], "1"
            keyword_seen = True
        else:
            if keyword_seen and re.fullmatch(r"[A-Za-z_]\w*", token):
                raise _Bad(f"unknown operand {token!r} for {syntax.mnemonic}")
            if keyword_seen:
                raise _Bad(f"positional operand {token!r} after a named one")
            operand = next(positional, None)
            if operand is None:
                raise _Bad(f"too many operands for {syntax.mnemonic} "
                           f"(it takes {len(syntax.operands)})")
            text = token
        if operand.name in values:
            raise _Bad(f"operand {operand.name} given twice")
        if text.startswith("@") and not isinstance(operand.kind, _Target):
            raise _Bad(f"{operand.name} takes a value, not a label")
        values[operand.name] = operand.kind.parse(text, operand.name, labels)
    for operand in syntax.operands:
        if operand.name not in values:
            if operand.required:
                raise _Bad(f"missing operand {operand.name} for {syntax.mnemonic} "
                           f"(syntax: {syntax.synopsis()})")
            values[operand.name] = operand.default_value(values)
    return values


def _assemble(level, text):
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, not {text!r}")
    lines = list(_split_lines(text))
    labels, defined_on, pc = {}, {}, 0
    for lineno, line, names, body in lines:
        for name in names:
            if name in labels:
                raise AsmError(lineno, line, f"duplicate label {name!r} (first defined on "
                                             f"line {defined_on[name]})")
            labels[name], defined_on[name] = pc, lineno
        pc += bool(body)

    words = []
    for lineno, line, _, body in lines:
        if not body:
            continue
        head, _, rest = body.partition(" ")
        head, rest = head.lower(), rest.strip()
        try:
            if head == ".word":
                value = _number(rest, ".word") if rest else None
                if value is None:
                    raise _Bad("missing operand for .word")
                words.append(_in_range(".word", value, 0, (1 << level.bits) - 1))
                continue
            syntax = level.by_mnemonic.get(head)
            if syntax is None:
                raise _Bad(f"unknown mnemonic {head!r} in a {level.name}")
            words.append(syntax.encode(_bind(syntax, rest, labels)))
        except _Bad as e:
            raise AsmError(lineno, line, str(e)) from None
    return words


def assemble_plan(text):
    """Assemble plan text into plan instruction words (see the module docs)."""
    return _assemble(_PLAN, text)


def assemble_kernel(text):
    """Assemble kernel text into micro-instruction words (see the module docs)."""
    return _assemble(_MICRO, text)


# -- disassembler ----------------------------------------------------------------------

def _decode(level, word):
    if not isinstance(word, int) or not 0 <= word < (1 << level.bits):
        raise ValueError(f"{level.name} words must be integers from 0 to "
                         f"2**{level.bits} - 1, not {word!r}")
    syntax = level.by_opcode.get(word & level.op_mask)
    if syntax is not None:
        try:
            return syntax, syntax.decode(word)
        except _NotCanonical:
            pass
    return None, None


def _word_line(level, word):
    return f".word 0x{word:0{level.bits // 4}x}"


def _disassemble(level, words):
    words = list(words)
    decoded = [_decode(level, w) for w in words]
    targets = set()
    for syntax, values in decoded:
        if syntax is not None:
            targets.update(values[o.name] for o in syntax.operands
                           if isinstance(o.kind, _Target))
    labels = {pc: f"L{pc}" for pc in sorted(targets) if pc < len(words)}
    out = []
    for pc, (word, (syntax, values)) in enumerate(zip(words, decoded)):
        if pc in labels:
            out.append(f"{labels[pc]}:")
        text = _word_line(level, word) if syntax is None else syntax.format(values, labels)
        out.append(f"    {text}")
    return "".join(line + "\n" for line in out)


def disassemble_plan(words):
    """Plan instruction words as assembly text (one instruction per line)."""
    return _disassemble(_PLAN, words)


def disassemble_kernel(words):
    """Micro-instruction words as assembly text (one instruction per line)."""
    return _disassemble(_MICRO, words)
