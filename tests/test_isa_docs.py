"""The generated instruction set reference: fresh, complete, deterministic."""

import json
from pathlib import Path

from fusetile.host.cli import main
from fusetile.host.isa_docs import markdown, as_dict, member_docs
from fusetile.kernels.asm import PLAN_SYNTAX, MICRO_SYNTAX, assemble_plan, assemble_kernel
from fusetile.kernels.isa import (CmpOp, PlanOp, PlanInstr, MicroOp, MicroInstr, DmaArgs, VectorCfg,
                                  FaultCause)


DOCS = Path(__file__).resolve().parent.parent / "docs"
REGENERATE = "fusetile isa --markdown --output docs/isa.md"


def test_committed_file_is_fresh():
    path = DOCS / "isa.md"
    assert path.exists(), f"docs/isa.md is missing; generate it with `{REGENERATE}`"
    assert path.read_text(encoding="utf-8") == markdown(), (
        f"docs/isa.md is stale (kernels/isa.py, kernels/asm.py or host/isa_docs.py "
        f"changed); regenerate it with `{REGENERATE}`")


def test_deterministic():
    assert markdown() == markdown()
    text = markdown()
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_member_docs_read_the_comments():
    docs = member_docs(PlanOp)
    assert docs["CALL"] == "run kernel slot ``sel`` with arguments ``a`` and ``b``"
    # a comment continued on the next line
    assert docs["ASSUME"].startswith("open a speculative region guarded by F[sel] == cond[0]; "
                                     "on a miss continue in the other bank")
    assert member_docs(DmaArgs) == {"token": "dependency token (see WAIT)"}
    assert member_docs(VectorCfg)["SHIFT"] == "extra right shift, 0..31"
    assert member_docs(VectorCfg)["MULT_B"] == "Q0.31 multiplier of input b (VADD)"
    assert "GE" in member_docs(CmpOp)


def test_every_op_is_documented():
    text = markdown()
    for syntax in PLAN_SYNTAX + MICRO_SYNTAX:
        heading = f"### `{syntax.mnemonic}` — {syntax.op.name} (opcode {syntax.op.value})"
        assert heading in text
        section = text.split(heading, 1)[1].split("\n### ", 1)[0]
        assert f"Syntax: `{syntax.synopsis()}`" in section
        assert f"Example: `{syntax.example}`" in section
        for operand in syntax.operands:
            assert f"| `{operand.name}` |" in section
    assert "Reserved opcodes (fault as illegal; the disassembler writes `.word`): 9..15." in text
    assert "Reserved opcodes (fault as illegal; the disassembler writes `.word`): 5..7, " \
           "17..63." in text


def test_bit_ranges_come_from_the_layouts():
    text = markdown()
    args = MicroInstr.as_shape()["args"].offset
    dma = DmaArgs.as_shape()
    rows = dma["rows"]
    assert f"| `rows` | `rows` | [{args + rows.offset + rows.width - 1}:{args + rows.offset}] " \
           f"| {rows.width} | 0..4095 | `1` | rows to copy |" in text
    sel = PlanInstr.as_shape()["sel"]
    assert f"| [{sel.offset + sel.width - 1}:{sel.offset}] | `sel` | {sel.width} |" in text
    assert "| `imm` | `imm` | [42:35] | 8 | -128..127 |" in text


def test_prose_and_docstrings():
    text = markdown()
    for title in ("## Data layout", "## Architectural registers", "## Control flow",
                  "## Speculation", "## Faults", "## Assembly language",
                  "## Plan instructions", "## Micro-instructions"):
        assert f"\n{title}\n" in text
    for cause in FaultCause:
        if cause is not FaultCause.NONE:
            assert f"| {cause.value} | `{cause.name}` |" in text
    # the args Struct docstrings, as Markdown (``x`` -> `x`, ** escaped)
    assert "Moves `rows` x `cols` words." in text
    assert "2\\*\\*(31 + SHIFT)" in text
    assert "| `lo` | 6 | -128..127 | -128 | int8 lower clamp bound (reset: -128) |" in text


def test_examples_in_the_docs_assemble():
    text = markdown()
    blocks = text.split("```\n")[1::2]
    assert len(blocks) == 2
    assemble_plan(blocks[0])
    assemble_kernel(blocks[1])


def test_as_dict():
    data = as_dict()
    assert [op["mnemonic"] for op in data["plan"]["ops"]] == [s.mnemonic for s in PLAN_SYNTAX]
    call = data["plan"]["ops"][1]
    assert call["opcode"] == PlanOp.CALL.value
    assert call["operands"][0]["fields"] == [{"name": "sel", "offset": 8, "width": 8,
                                              "bits": "[15:8]"}]
    dma = next(op for op in data["micro"]["ops"] if op["name"] == "DMA_LOAD")
    assert dma["opcode"] == MicroOp.DMA_LOAD.value and dma["args"] == "dma"
    json.dumps(data)


def test_cli(tmp_path, capsys):
    assert main(["isa"]) == 0
    assert capsys.readouterr().out == markdown()
    assert main(["isa", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown()
    path = tmp_path / "isa.md"
    assert main(["isa", "--markdown", "--output", str(path)]) == 0
    assert capsys.readouterr().out == ""
    assert path.read_bytes() == markdown().encode()
    assert main(["isa", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(as_dict()))
    assert main(["isa", "--output", str(tmp_path / "no" / "such" / "dir.md")]) == 1
    assert "fusetile isa: error: cannot write" in capsys.readouterr().err
