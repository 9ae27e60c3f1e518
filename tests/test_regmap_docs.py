"""The generated register map documentation and C header: fresh, complete, deterministic."""

import shutil
import subprocess
from pathlib import Path

import pytest

from fusetile.hdl import regmap
from fusetile.hdl.regmap import tile_memory_map, hwcfg_values
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import FaultCause
from fusetile.host.regmap_docs import markdown, c_header, as_dict


DOCS = Path(__file__).resolve().parent.parent / "docs"
SMALL = TileConfig(rows=4, cols=4, partitions=4, kernel_slots=2, plan_depth=64,
                   gmem_bytes=8192, slot_counters=False)


@pytest.mark.parametrize("filename,generate,flag", [
    ("registers.md", markdown, "--markdown"),
    ("fusetile_regs.h", c_header, "--c-header"),
])
def test_committed_file_is_fresh(filename, generate, flag):
    path = DOCS / filename
    expected = generate(TileConfig())
    assert path.exists(), (f"docs/{filename} is missing; generate it with "
                           f"`fusetile regmap {flag} --output docs/{filename}`")
    assert path.read_text(encoding="utf-8") == expected, (
        f"docs/{filename} is stale (the register map changed); regenerate it with "
        f"`fusetile regmap {flag} --output docs/{filename}`")


def test_deterministic():
    assert markdown(SMALL) == markdown(SMALL)
    assert c_header(SMALL) == c_header(SMALL)
    assert markdown(SMALL) != markdown(TileConfig())


def test_markdown_covers_the_map():
    text = markdown(TileConfig())
    mm = tile_memory_map(TileConfig())
    for entry in mm.registers():
        name = entry.item.name.partition("[")[0]
        assert f"#### {name}" in text
    for entry in mm.windows():
        assert f"`{entry.addr:#010x}` | `{entry.item.name}`" in text
    for name, _ in regmap.COUNTERS:
        entry = mm[name.upper()]
        assert f"| `{entry.addr:#06x}` | `{entry.addr + 4:#06x}` | `{name.upper()}` |" in text
    for name, value in hwcfg_values(TileConfig()).items():
        assert f"| `{name}` | `{mm.addr(name):#06x}` | `{value:#010x}` |" in text
    for member in FaultCause:
        assert f"| {member.value} | `{member.name}` |" in text
    assert "| `0x0100 + 0x4*i` | [`PART[i]`](#parti) | RW | `0x00000000` | " \
           "Scratchpad partition i. (i = 0..7) |" in text
    assert "| [13:10] | `part` | R | — | Partition of a PARTITION fault. |" in text
    assert "| [1] | `fault` | RW | 1 | Raise `irq` while STATUS.faulted. |" in text
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_markdown_small_config():
    text = markdown(SMALL)
    assert "This configuration has no per-slot counters." in text
    assert "SLOT_CALLS" not in text
    assert "i = 0..3" in text and "`KERNEL[1]`" in text and "`KERNEL[2]`" not in text


def test_c_header_macros():
    text = c_header(TileConfig())
    mm = tile_memory_map(TileConfig())
    lines = {line.split()[1]: line.split(None, 2)[2] for line in text.splitlines()
             if line.startswith("#define ") and len(line.split()) > 2}
    assert lines["FT_STATUS_ADDR"] == f"0x{mm.addr('STATUS'):04X}u"
    assert lines["FT_STATUS_RUNNING_SHIFT"] == "0"
    slot_offset = dict((f.name, o) for f, o in mm["STATUS"].item.field_offsets())["slot"]
    assert lines["FT_STATUS_SLOT_SHIFT"] == str(slot_offset)
    assert lines["FT_STATUS_SLOT_MASK"].startswith(f"0x{0xF << slot_offset:08X}u")
    assert lines["FT_PART_ADDR(i)"] == f"(0x{mm.addr('PART[0]'):04X}u + 0x4u * (i))"
    assert lines["FT_PART_COUNT"] == "8"
    assert lines["FT_CYCLES_LO_ADDR"] == f"0x{mm.addr('CYCLES'):04X}u"
    assert lines["FT_CYCLES_HI_ADDR"] == f"0x{mm.addr('CYCLES') + 4:04X}u"
    assert lines["FT_SLOT_CALLS_LO_ADDR(i)"].startswith(f"(0x{mm.addr('SLOT_CALLS[0]'):04X}u")
    assert lines["FT_FAULT_CAUSE_WATCHDOG"] == str(FaultCause.WATCHDOG.value)
    assert lines["FT_GMEM_BASE"] == f"0x{mm.addr('GMEM'):08X}u"
    slot_bytes = TileConfig().slot_depth * 16
    assert lines["FT_KERNEL_BASE(i)"] == f"(0x{mm.addr('KERNEL[0]'):08X}u + {slot_bytes:#x}u * (i))"
    assert lines["FT_IRQ_ENABLE_RESET"] == "0x00000002u"
    assert lines["FT_MAGIC"] == f"0x{regmap.MAGIC:08X}u"
    assert lines["FT_TRACE_WORDS"] == str(regmap.TRACE_WORDS)
    assert text.startswith("/* fusetile register map") and text.endswith("#endif /* FUSETILE_REGS_H */\n")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_header_compiles(tmp_path):
    header = tmp_path / "fusetile_regs.h"
    header.write_text(c_header(SMALL))
    src = tmp_path / "use.c"
    src.write_text('#include "fusetile_regs.h"\n'
                   "unsigned a = FT_PART_ADDR(1) + FT_KERNEL_BASE(1) + FT_CYCLES_HI_ADDR\n"
                   "  + FT_FAULT_CAUSE_PARTITION + FT_STATUS_DONE_MASK;\n")
    subprocess.run(["cc", "-Wall", "-Werror", "-fsyntax-only", str(src)], check=True)


def test_as_dict():
    data = as_dict(SMALL)
    assert data["config"] == SMALL.as_dict()
    assert data["version"] == ".".join(map(str, regmap.VERSION))
    status = next(r for r in data["registers"] if r["name"] == "FAULT")
    assert status["fields"][0]["enum"]["PARTITION"] == FaultCause.PARTITION.value
    assert [w["name"] for w in data["windows"]] == ["PLAN[0]", "PLAN[1]", "KERNEL[0]",
                                                    "KERNEL[1]", "GMEM"]


def test_checks_config():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 3"):
        markdown(3)
    with pytest.raises(TypeError, match="TileConfig"):
        c_header(None)


def test_markdown_of_a_tile_without_a_trace_fifo():
    text = markdown(TileConfig(trace_depth=0))
    assert "#### TRACE_STATUS" not in text and "#### TRACE_DATA" not in text
    assert "This configuration has no trace FIFO" in text
    assert "#### TRACE_STATUS" in markdown(TileConfig())
