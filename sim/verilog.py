"""Verilog of the tile for the external simulators (Verilator, Icarus).

The Verilog is generated once per (configuration, gateware sources) and kept under
the build root: a directory named after ``config.profile_hash`` and a hash of every
gateware and kernel source file, so editing either gives a new directory (and a new
simulator build) while an unchanged tree reuses the file that is there.
"""

import hashlib
import inspect
import os
import re
from pathlib import Path

from ..kernels.config import TileConfig


__all__ = ["TOPLEVEL", "VERILOG_NAME", "PORTS", "default_top", "sources_hash", "verilog_key", "tile_verilog"]


#: Name of the generated Verilog module.
TOPLEVEL = "fusetile_tile"
VERILOG_NAME = f"{TOPLEVEL}.v"

#: Ports of :data:`TOPLEVEL`: what every top given to :func:`tile_verilog` must have.
PORTS = ("clk", "rst", "bus__cyc", "bus__stb", "bus__we", "bus__adr", "bus__dat_w",
         "bus__dat_r", "bus__sel", "bus__ack", "bus__err", "irq")

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
# Folders whose Python files the gateware is elaborated from.
_GATEWARE_DIRS = ("hdl", "kernels")


def default_top(config):
    """The real tile, ``fusetile.hdl.tile.Tile(config)``."""
    from ..hdl.tile import Tile
    return Tile(config)


def _top_source_files(top):
    # A stand-in top lives outside hdl/; its own file must key the cache too.
    if top is default_top:
        return []
    try:
        path = inspect.getsourcefile(top)
    except TypeError:
        return []
    return [Path(path)] if path else []


def sources_hash(top=default_top):
    """Hash of the gateware sources (``hdl/**.py``, ``kernels/**.py`` and the file that
    defines ``top``), hex, 16 digits."""
    files = []
    for folder in _GATEWARE_DIRS:
        files += sorted((_PACKAGE_ROOT / folder).rglob("*.py"))
    files += _top_source_files(top)
    files.append(Path(__file__).resolve())    # how the Verilog is written matters too
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(_PACKAGE_ROOT) if path.is_relative_to(_PACKAGE_ROOT)
                     else path.name).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    h.update(f"{getattr(top, '__module__', '')}.{getattr(top, '__qualname__', top)!r}".encode())
    return h.hexdigest()[:16]


def verilog_key(config, top=default_top):
    """Cache key of the Verilog of ``top(config)``: ``<profile hash>-<sources hash>``."""
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")
    return f"{config.profile_hash}-{sources_hash(top)}"


def _convert(component):
    """Verilog of ``component`` with every process lowered to cells.

    ``amaranth.back.verilog.convert`` keeps processes as ``always @*`` blocks
    (``proc -nomux``). Icarus never runs such a block when it reads nothing (the
    constant bits of a partly driven signal), so those bits stay X; as
    ``always_comb`` (``write_verilog -sv``) Icarus instead loops on blocks that write
    a signal they also read. Lowering processes fully (``proc``) gives plain
    ``assign``s and flip-flops, which every simulator runs the same way. The public
    ``convert()`` cannot change its Yosys script, hence Amaranth's Yosys finder.
    """
    from amaranth.back import rtlil
    from amaranth._toolchain.yosys import find_yosys

    rtlil_text = rtlil.convert(component, name=TOPLEVEL, emit_src=False)
    yosys = find_yosys(lambda version: version >= (0, 40))
    script = [
        f"read_rtlil <<rtlil\n{rtlil_text}\nrtlil",
        "proc -norom",
        "opt_clean",
        "memory_collect",
        "write_verilog",
    ]
    return yosys.run(["-q", "-"], "\n".join(script), ignore_warnings=True)


def tile_verilog(config, *, build_root, top=default_top):
    """Write the Verilog of ``top(config)`` as ``fusetile_tile.v`` and return its path.

    Parameters
    ----------
    config : TileConfig
        Configuration the tile is elaborated with.
    build_root : path-like
        Directory under which ``verilog-<key>/fusetile_tile.v`` is written.
    top : callable
        ``top(config)`` returns the elaboratable to convert; a ``wiring.Component``
        with the ports of :data:`PORTS` (``bus`` as a Wishbone slave, ``irq``).
        The real :class:`~fusetile.hdl.tile.Tile` by default; tests pass stand-ins.

    Returns
    -------
    Path
        The Verilog file; reused if it exists for the same key.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`TileConfig` or ``top`` is not callable.
    """
    if not callable(top):
        raise TypeError(f"top must be a callable returning an elaboratable, not {top!r}")
    key = verilog_key(config, top)
    out_dir = Path(build_root) / f"verilog-{key}"
    path = out_dir / VERILOG_NAME
    if path.is_file():
        return path

    text = _convert(top(config))
    declared = set(re.findall(r"^\s*(?:input|output)\b[^;]*?(\w+);", text, re.M))
    missing = [p for p in PORTS if p not in declared]
    if missing:
        raise ValueError(f"Top {top!r} lacks ports {', '.join(missing)} of module {TOPLEVEL}")
    out_dir.mkdir(parents=True, exist_ok=True)
    # Written under another name, then renamed: a concurrent reader never sees half
    # a file.
    tmp = out_dir / f".{VERILOG_NAME}.{os.getpid()}"
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
