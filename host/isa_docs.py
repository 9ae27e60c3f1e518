"""Generate the instruction set reference, ``docs/isa.md``.

The reference part is read from the definitions: opcodes, field bit ranges and widths
from the layouts in :mod:`fusetile.kernels.isa`, each instruction's description from
the ``#:`` comments of its opcode and the docstring of its args ``Struct``, the
syntax and examples from the assembler's table (:mod:`fusetile.kernels.asm`). The
prose part (data layout, registers, control flow, speculation, faults) is fixed text
here. Regenerate the committed file with::

    fusetile isa --markdown --output docs/isa.md

The output depends on nothing else, so it is reproducible byte for byte (a test fails
when the committed file is stale).
"""

import ast
import inspect

from ..kernels import isa
from ..kernels.isa import (VECTOR_CFG_RESET, PlanOp, PlanInstr, MicroOp, MicroInstr, GmemBase,
                           CmpOp, VectorCfg, FaultCause, FLAGS, INDEX_REGS, DMA_TOKENS)
from ..kernels.asm import PLAN_SYNTAX, MICRO_SYNTAX, mnemonic
from ..kernels.program import VCFG_RANGES


__all__ = ["markdown", "as_dict", "member_docs"]


# -- reading the definitions ------------------------------------------------------------

def member_docs(cls):
    """The ``#:`` comments of the members (enum values, struct fields) of ``cls``, a
    class in :mod:`fusetile.kernels.isa`, by member name; a comment continues on
    following lines that hold only a ``#:`` comment."""
    lines = inspect.getsource(isa).splitlines()
    tree = ast.parse("\n".join(lines))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs = {}
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
        else:
            continue
        row = stmt.end_lineno - 1
        _, sep, text = lines[row].partition("#:")
        if not sep:
            continue
        parts = [text.strip()]
        while row + 1 < len(lines) and lines[row + 1].strip().startswith("#:"):
            row += 1
            parts.append(lines[row].strip()[2:].strip())
        docs[name] = " ".join(parts)
    return docs


def _docstring(cls):
    """The class's own docstring as paragraphs (Amaranth's base classes have theirs)."""
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return []
    return [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n")]


def _bits(offset, width):
    return f"[{offset}]" if width == 1 else f"[{offset + width - 1}:{offset}]"


def _md(text):
    """RST-ish doc text as Markdown: ``code`` becomes `code`; outside code, ``*`` and
    ``|`` are escaped (``2**31`` would otherwise start bold text)."""
    parts = text.replace("``", "`").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("*", "\\*").replace("|", "\\|")
    return "`".join(parts)


def _layout_rows(layout, base=0):
    """``(bits, name, width, doc)`` for each field of a Struct class."""
    docs = member_docs(layout)
    return [(_bits(base + f.offset, f.width), name, f.width, docs.get(name, ""))
            for name, f in layout.as_shape()]


def _op_info(syntax):
    """Everything the reference says about one instruction."""
    enum = type(syntax.op)
    # The reference is the page that note points to.
    doc = member_docs(enum).get(syntax.op.name, "").replace(" (see docs/isa.md)", "")
    details = []
    if syntax.args is not None:
        details = _docstring(isa.MicroArgs.as_shape()[syntax.args].shape)
    base = syntax.field_base
    operands = []
    for o in syntax.operands:
        fields = []
        for name in o.fields:
            f = syntax.layout[name]
            fields.append({"name": name, "offset": base + f.offset, "width": f.width,
                           "bits": _bits(base + f.offset, f.width)})
        default = None
        if not o.required:
            default = "cols" if callable(o.default) else o.default
            if default is None:
                default = "off"         # an operand that is absent unless given
        operands.append({
            "name": o.name, "fields": fields, "values": o.kind.values(fields[-1]["width"]),
            "default": default, "positional": o.positional, "doc": o.doc,
        })
    return {
        "name": syntax.op.name, "mnemonic": syntax.mnemonic, "opcode": syntax.op.value,
        "doc": doc, "details": details, "args": syntax.args, "syntax": syntax.synopsis(),
        "example": syntax.example, "operands": operands,
    }


def _reserved(enum, table):
    used = {s.op.value for s in table}
    free = [v for v in range(2 ** enum.as_shape().width) if v not in used]
    ranges, start = [], None
    for v in free + [None]:
        if start is None:
            start = prev = v
        elif v is not None and v == prev + 1:
            prev = v
        else:
            ranges.append(str(start) if start == prev else f"{start}..{prev}")
            start = prev = v
    return ranges


def as_dict():
    """The instruction set as plain data (for ``fusetile isa --json``)."""
    def enum_data(enum):
        docs = member_docs(enum)
        return [{"name": m.name, "value": m.value, "doc": docs.get(m.name, "")} for m in enum]

    def layout_data(layout, base=0):
        return [{"name": name, "bits": bits, "width": width, "doc": doc}
                for bits, name, width, doc in _layout_rows(layout, base)]

    return {
        "plan": {"bits": isa.PLAN_INSTR_BITS, "layout": layout_data(PlanInstr),
                 "ops": [_op_info(s) for s in PLAN_SYNTAX],
                 "reserved_opcodes": _reserved(PlanOp, PLAN_SYNTAX)},
        "micro": {"bits": isa.MICRO_INSTR_BITS, "layout": layout_data(MicroInstr),
                  "ops": [_op_info(s) for s in MICRO_SYNTAX],
                  "reserved_opcodes": _reserved(MicroOp, MICRO_SYNTAX)},
        "registers": {"flags": FLAGS, "index": INDEX_REGS, "dma_tokens": DMA_TOKENS,
                      "vector_cfg": [{**m, "min": VCFG_RANGES[VectorCfg[m["name"]]][0],
                                      "max": VCFG_RANGES[VectorCfg[m["name"]]][1],
                                      "reset": VECTOR_CFG_RESET.get(VectorCfg[m["name"]], 0)}
                                     for m in enum_data(VectorCfg)]},
        "enums": {e.__name__: enum_data(e) for e in (GmemBase, CmpOp, VectorCfg, FaultCause)},
    }


# -- Markdown ---------------------------------------------------------------------------

_INTRO = f"""\
# fusetile instruction set

<!-- Generated by `fusetile isa --markdown` from fusetile.kernels.isa and
fusetile.kernels.asm; do not edit. -->

The tile runs programs at two levels:

* a **plan** ({isa.PLAN_INSTR_BITS}-bit instructions) lives in one of the two plan banks.
  It calls kernels and steers between them: branches on flags, jump tables on index
  registers, and speculative regions that fall back to the other bank when a guess
  turns out wrong;
* a **kernel** ({isa.MICRO_INSTR_BITS}-bit micro-instructions) lives in a kernel slot. It
  is straight-line code ending in `ret`: DMA between GMEM and the slot's scratchpad
  partition, MAC-array and vector operations on the scratchpad, configuration writes.

This page is generated from the definitions the gateware decodes with
(`kernels/isa.py`) and from the assembler's table (`kernels/asm.py`). The arithmetic of
the compute instructions is defined bit-exactly by the reference functions in
`kernels/arith.py`; the formulas below restate them. Build instructions from Python with
`fusetile.kernels.program` (`call(2, a=0x100)`, `matmul(a=0, b=64, k=32)`, ...) or from
text with `fusetile.kernels.asm` (`assemble_plan`, `assemble_kernel`, and
`disassemble_plan` / `disassemble_kernel` back).
"""

_DATA = """\
## Data layout

* **Words.** GMEM and the scratchpad hold words of `word_bytes` bytes (8 by default; see
  `HWCFG` in `docs/registers.md`). Every address in an instruction counts words, not
  bytes. A word is `word_bytes` signed 8-bit **lanes**, lane 0 in byte 0
  (little-endian).
* **Lane numbering across words.** Instructions that address single lanes (`vcmp`,
  `vargmax`) number them on from a start word: lane `l` is byte `l % word_bytes` of word
  `addr + l // word_bytes`.
* **Columns.** When lanes carry samples (a word is one tensor element for up to
  `word_bytes` samples, one per lane), one sample's values are one lane of consecutive
  words: `vargmax ..., lane=L` takes lane `L` of `n` words and gives a word number.
* **Scratchpad addresses** in micro-instructions are offsets inside the partition the
  calling slot is bound to (`SLOT[k].part`). Every access is checked against the
  partition: an access outside it faults with `PARTITION` and writes nothing, so a
  kernel never touches a neighbour's data. A compute instruction is checked whole
  before it starts (see *Faults*).
* **GMEM addresses** in DMA instructions are absolute, or relative to the CALL's
  argument `a` (`arg0+N`) or `b` (`arg1+N`), so one kernel serves many tensors.
* **The accumulator** `ACC` is an `R` x `C` array of int32 next to the MAC array
  (`R`, `C` = the configuration's `rows` and `cols`, both at most `word_bytes`). It
  wraps on overflow (two's complement).
* **Bias tables** (`acc.bias`) are little-endian int32s from byte 0 of the given word:
  `R` of them, `4R` bytes over `ceil(4R / word_bytes)` words.
* **Per-channel requantisation tables** (`requant ..., per_channel`) have one 8-byte
  entry per ACC row, row `i` at byte `8i` from the given word: bytes 0..3 the
  multiplier `M` (little-endian, below 2\\*\\*31), byte 4 the shift `S` (0..31), bytes
  5..7 ignored.
"""

_CONTROL = """\
## Control flow

A plan starts at PC 0 of the active bank when the host writes `CTRL.start` and ends at
`done`, which is also the safe point where a requested bank swap takes effect. Targets
of `jump`, `branch` and `switch` are PCs in the bank that is executing; a target at or
beyond the bank's depth faults with `PLAN_RANGE`. So does the fetch after a `call` or
a `commit` in the bank's last entry, once the kernel has returned or the region's stores
are published (the fault is outside the kernel).

* `call slot, a=A, b=B` runs the kernel in `slot` with arguments `A` and `B` and
  continues at the next plan instruction once the kernel's `ret` has retired.
* `jump T`: continue at `T`.
* `branch fN, V, T`: if flag `fN` equals `V` continue at `T`, else at the next
  instruction.
* `switch xN, T, S`: with `i` = the value of index register `xN`, continue at `T + i`
  (a jump table of `S` entries, typically `jump`s); `i >= S` faults with
  `SWITCH_RANGE`.
* `mark V` writes `V` to the `MARK` register, a progress marker for the host; `nop`
  does nothing. A tile may be built without the `MARK` register
  (`HWCFG_GMEM.no_debug_regs`, `TileConfig.debug_regs` False: the iCEBreaker's):
  `mark` is then a `nop`, in the same cycles.

Flags and index registers are the only state a plan branches on; kernels compute them
(`vcmp`, `vargmax`). A tile may be built without those two (`HWCFG_CTRL.no_decisions`,
`TileConfig.decisions` False: the iCEBreaker's): they are then illegal
(`ILLEGAL_MICRO`), and the flags and index registers stay 0.

A kernel is straight-line code: micro-instructions run in order until `ret`. DMA
instructions are queued to the DMA engine (in order, several may be queued) and the
kernel continues at once; each carries a **token** (0..3). `wait M` waits until no
queued or running DMA has a token in the mask `M` (`wait` alone, mask 0, waits for all
of them); `ret` waits for all of them before it returns to the plan. Compute
instructions read the scratchpad as it is when they run: a kernel `wait`s for the DMA
that fills its inputs.
"""

_SPECULATION = """\
## Speculation

A plan can act on a guess and check it later. `assume fN, V, resume=P` opens a
**speculative region** guarded by "flag `fN` equals `V`"; `P` is a PC in the *other*
plan bank, where the fallback path lives. While the region is open:

* `dma.store`s do not write GMEM: their words go, in order, to a staging buffer of
  fixed capacity (a configuration parameter);
* the guard is checked whenever a `vcmp` (or a `vargmax` with `flag`) writes the
  guarded flag, and at `commit`.

If the guard fails (a **miss**), the staged words are discarded, the running kernel (if
any) is abandoned with its outstanding DMA, the active bank switches to the other bank
and execution continues at `P` without the host; the `spec_misses` counter counts it
and `MISS_PC` holds the PC of the `assume`. A speculative store that does not fit in
the staging buffer is a miss too, as is a fault raised inside the region other than
`WATCHDOG` and `ABORTED` (the guess may have caused it).

If `commit` finds the guard true (a **hit**), the staged words are written to GMEM in
order, the region closes, `spec_hits` counts it and the plan continues after the
`commit`.

Rules for code inside a region:

* `assume` inside an open region, `commit` without one and `done` inside one are
  illegal (`ILLEGAL_PLAN`); so is every `assume` on a tile without speculation
  (`HWCFG_CTRL.staging_words_log2` 0, `TileConfig.staging_words` 0: the iCEBreaker's).
* Scratchpad writes are not staged: after a miss the fallback path must not rely on
  scratchpad contents the speculative path may have changed.
* A region must not read back GMEM it stored to: staged words are not forwarded.

Typical use: the speculative kernel computes the guard itself (`vcmp` into the guarded
flag, or `vargmax ..., flag=fN, expect=E`: "the argmax is `E`", e.g. the expert a
mixture-of-experts router picks), so a wrong guess is detected as soon as it is known.
"""

_ENCODING_RULES = """\
Bits are numbered from the least significant bit of the instruction; in plan and
kernel memory (and in the host windows `PLAN[b]`, `KERNEL[k]`) an instruction is stored
least significant 32-bit word first. Fields an instruction does not use must be 0; the
disassembler writes any other bits as `.word`.
"""


def _syntax_section():
    return f"""\
## Assembly language

`fusetile.kernels.asm` reads and writes the text form of plans and kernels:
`assemble_plan(text)` and `assemble_kernel(text)` return instruction words,
`disassemble_plan(words)` and `disassemble_kernel(words)` return text, and
`assemble(disassemble(words)) == words` for every list of words.

```
start:                              ; a label: the PC of the next instruction
    call 2, a=0x100, b=0x200        ; positional operands first, then name=value
    branch f3, 1, @exit             ; @label: a plan target
    assume f1, 1, resume=5          ; resume: a PC in the other bank (a number)
    call 3, a=0x100
    commit
exit:
    done
```

```
    dma.load gmem=arg0+16, spad=0, rows=4, cols=8, token=1
    wait 0b0010
    matmul a=0, b=64, k=32, acc     ; acc: an on/off operand, set by its name
    vcfg mult_a, 0x40000000
    vcmp addr=3, lane=9, op=ge, imm=-5, flag=f2, reduce
    ret
```

* One instruction per line; `;` starts a comment. Mnemonics are the opcode names in
  lower case with `_` written as `.` (`DMA_LOAD` is `dma.load`).
* Operands are separated by commas. Each has a name: it is written either
  positionally, in the order of the syntax line, or as `name=value` in any order after
  the positional ones. On/off operands (`acc`, `reduce`, `per_channel`, `average`,
  `pairs`) are set by their bare name (or `name=1`). Operands shown in `[...]` have a
  default and may be left out.
* Numbers are decimal, `0x` hex or `0b` binary; int8 immediates take -128..127. Flags
  are `f0`..`f{FLAGS - 1}`, index registers `x0`..`x{INDEX_REGS - 1}` (a bare number is
  accepted too). A DMA's `gmem` is `N`, `arg0+N` or `arg1+N`.
* Labels (`name:` at the start of a line) name the PC of the next instruction; plan
  targets are `@name` or a number.
* `.word N` emits the instruction bits `N` unchanged ({isa.PLAN_INSTR_BITS}-bit in a plan,
  {isa.MICRO_INSTR_BITS}-bit in a kernel). The disassembler uses it for reserved
  opcodes and any bits the syntax cannot express.
* The disassembler writes the forms shown below (operands equal to their default are
  left out) and labels plan targets `L<pc>`.
* Errors (`AsmError`) give the line number, the line and the problem: unknown
  mnemonic, missing or unknown operand, value out of range, undefined or duplicate
  label.
"""


def _anchor(text, seen):
    """GitHub's anchor for a heading: a repeated one gets ``-1``, ``-2``, ..."""
    anchor = "".join(c for c in text.lower() if c.isalnum() or c in "-_")
    count = seen.get(anchor, 0)
    seen[anchor] = count + 1
    return f"{anchor}-{count}" if count else anchor


def _op_section(w, info, level):
    title = f"### `{info['mnemonic']}` — {info['name']} (opcode {info['opcode']})"
    w(title)
    w("")
    if info["doc"]:
        w(f"**{info['name']}**: {_md(info['doc'])}.")
        w("")
    for paragraph in info["details"]:
        w(_md(paragraph))
        w("")
    w(f"Syntax: `{info['syntax']}`")
    w("")
    w(f"Example: `{info['example']}`")
    w("")
    if info["operands"]:
        w("| Operand | Field | Bits | Width | Values | Default | Description |")
        w("|---|---|---|---|---|---|---|")
        for o in info["operands"]:
            fields = ", ".join(f"`{f['name']}`" for f in o["fields"])
            bits = ", ".join(f["bits"] for f in o["fields"])
            width = ", ".join(str(f["width"]) for f in o["fields"])
            default = "—" if o["default"] is None else f"`{o['default']}`"
            w(f"| `{o['name']}` | {fields} | {bits} | {width} | {_md(o['values'])} | "
              f"{default} | {_md(o['doc'])} |")
        w("")
    else:
        w("No operands: every bit but `op` is 0.")
        w("")


def markdown():
    """The instruction set reference, as Markdown (``docs/isa.md``)."""
    data = as_dict()
    anchors = {}
    out = []
    w = out.append

    w(_INTRO)
    w(_DATA)

    # Registers
    w("## Architectural registers")
    w("")
    w("All of them are 0 after reset, except `HI` (127) and `LO` (-128). They keep "
      "their values across kernel calls and plan runs: `CTRL.start` does not clear them.")
    w("")
    w("| Register | Width | Written by | Read by |")
    w("|---|---|---|---|")
    w(f"| Flags `f0`..`f{FLAGS - 1}` | 1 | `vcmp`, `vargmax` (with `flag`) | `branch`, "
      "`assume` (guard) |")
    w(f"| Index registers `x0`..`x{INDEX_REGS - 1}` | 16 | `vargmax` | `switch` |")
    w("| Vector configuration (below) | 31 (`mult_*`), 5 (`shift`), 8 (others) | `vcfg` "
      "| `requant`, `vadd`, `vpool` |")
    w("")
    w("Vector configuration registers (`VectorCfg`, written by `vcfg REG, VALUE`):")
    w("")
    w("| `vcfg` name | Number | Values | Reset | Description |")
    w("|---|---|---|---|---|")
    for r in data["registers"]["vector_cfg"]:
        w(f"| `{r['name'].lower()}` | {r['value']} | {r['min']}..{r['max']} | {r['reset']} "
          f"| {_md(r['doc'])} |")
    w("")
    w("`mult_a` and `mult_b` are Q0.31 multipliers (value / 2\\*\\*31), `shift` an extra "
      "right shift; together with the zero points and the clamp bounds they define "
      "requantisation: `clamp(zp_out + round_half_even(x * M / 2**(31 + S)), lo, hi)`. "
      "`vclamp` takes its bounds from its own operands, not from `lo` / `hi`.")
    w("")

    w(_CONTROL)
    w(_SPECULATION)

    # Faults
    w("## Faults")
    w("")
    w("A fault stops the tile at once: `FAULT` (cause, bank, slot, partition), "
      "`FAULT_PC` and `FAULT_ADDR` record it, `STATUS.faulted` is set and `irq` rises "
      "(if enabled); only `CTRL.clear_fault` leaves the fault state (see "
      "`docs/registers.md`). Inside a speculative region most faults are misses instead "
      "(see above).")
    w("")
    w("| Cause | Name | Raised when |")
    w("|---|---|---|")
    for m in data["enums"]["FaultCause"]:
        if m["name"] != "NONE":
            w(f"| {m['value']} | `{m['name']}` | {_md(m['doc'])} |")
    w("")
    w("Illegal plan instructions (`ILLEGAL_PLAN`): a reserved opcode; `cond` bits other "
      "than bit 0, or bit 0 on an instruction other than `branch` and `assume`; a flag "
      f"number of {FLAGS} or more, an index register number of {INDEX_REGS} or more; "
      "`assume` inside a region, `commit` outside one, `done` inside one.")
    w("")
    w("Illegal micro-instructions (`ILLEGAL_MICRO`): a reserved opcode or an operand "
      "out of its range (a reserved `gmem` base, `vpool` with `window` 0, `vargmax` "
      "with `n` 0, with `column` and a `lane` of `word_bytes` or more, with a `lane` but "
      "no `column`, or with a `flag` or `expect` but no `test`, `vcfg` of a register "
      "that does not exist), or an instruction the tile does not build: `vcmp` and "
      "`vargmax` on a tile without them (`HWCFG_CTRL.no_decisions`), `vadd`, `vpool` "
      "and `vclamp` on a tile without them (`HWCFG_GMEM.no_word_ops`, "
      "`TileConfig.word_ops` False: the iCEBreaker's, which runs networks of Gemms), "
      "`vpool` with `average` on a tile whose VPOOL takes maxima only "
      "(`HWCFG_ARRAY.no_pool_average`).")
    w("")
    w("**Compute faults are precise.** The operands of a compute instruction are "
      "affine streams of scratchpad offsets, so the control unit knows before it issues "
      "the instruction the end (largest offset) of each one (`kernels/operands.py`). "
      "An instruction with an illegal operand, or with an operand whose end lies outside "
      "the partition, faults when it would issue (the compute unit has finished the "
      "instruction before it): it has done nothing, it is not counted in "
      "`micro_retired`, `FAULT_PC.micro` is its own PC and, for `PARTITION`, "
      "`FAULT_ADDR` is the end of its first operand that does not fit (operands in the "
      "order inputs, then output). DMA faults are found by the DMA engine while it "
      "moves the words, so they stop the tile where the kernel has got to by then.")
    w("")

    w(_syntax_section())

    for level, title, layout in (("plan", "Plan instructions", PlanInstr),
                                 ("micro", "Micro-instructions", MicroInstr)):
        d = data[level]
        w(f"## {title}")
        w("")
        w(f"{d['bits']}-bit `{layout.__name__}`:")
        w("")
        w("| Bits | Field | Width | Description |")
        w("|---|---|---|---|")
        for f in d["layout"]:
            doc = f["doc"] or ("(reserved, 0)" if f["name"].startswith("_") else "")
            if f["name"] == "op":
                doc = f"opcode (`{'PlanOp' if level == 'plan' else 'MicroOp'}`, below)"
            if level == "micro" and f["name"] == "args":
                doc = "the operands: one of the args layouts below, by `op`"
            w(f"| {f['bits']} | `{f['name']}` | {f['width']} | {_md(doc)} |")
        w("")
        if level == "plan":
            w(_ENCODING_RULES)
        w("| Opcode | Mnemonic | Description |")
        w("|---|---|---|")
        for info in d["ops"]:
            anchor = _anchor(f"{info['mnemonic']}--{info['name']}-opcode-{info['opcode']}",
                             anchors)
            w(f"| {info['opcode']} | [`{info['mnemonic']}`](#{anchor}) | {_md(info['doc'])} |")
        w("")
        w(f"Reserved opcodes (fault as illegal; the disassembler writes `.word`): "
          f"{', '.join(d['reserved_opcodes'])}.")
        w("")
        for info in d["ops"]:
            _op_section(w, info, level)

    # Enumerations not covered above
    w("## Operand values")
    w("")
    for enum, note in ((GmemBase, "the base of a DMA's `gmem` address"),
                       (CmpOp, "the `op` of `vcmp`")):
        w(f"`{enum.__name__}`, {note}:")
        w("")
        w("| Value | Name | Syntax | Description |")
        w("|---|---|---|---|")
        for m in data["enums"][enum.__name__]:
            syntax = {"ABS": "`N`", "ARG0": "`arg0+N`", "ARG1": "`arg1+N`"}.get(
                m["name"], f"`{m['name'].lower()}`")
            w(f"| {m['value']} | `{m['name']}` | {syntax} | {_md(m['doc'])} |")
        w("")
    text = "\n".join(out)
    while text.endswith("\n\n"):
        text = text[:-1]
    return text if text.endswith("\n") else text + "\n"
