"""The ``fusetile`` command line.

Each subcommand is one function registered with :func:`command`; it receives the
parsed arguments and an :class:`Output` and returns an exit status (``None`` = 0).
Every command takes ``--json``. Errors print one line to stderr and exit non-zero
(``--traceback`` shows the whole story)::

    @command("bench", "measure cycles per inference", [
        arg("--target", default="amaranth", help="..."),
    ])
    def bench(args, out):
        ...
        out.result({"cycles": n}, human=lambda console: console.print(...))
"""

import argparse
import json
import sys
from pathlib import Path

from ..kernels.config import TileConfig
from ..hdl import regmap
from ..hdl.board import BOARDS, DEFAULT_BAUD
from . import isa_docs, regmap_docs
from .transport import TransportError, open_transport, transport_names


__all__ = ["main", "command", "arg", "Output", "CommandError"]


class CommandError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


_COMMANDS = {}


def arg(*names, **kwargs):
    """An ``argparse`` argument declaration for :func:`command`."""
    return names, kwargs


def command(name, help, arguments=()):
    """Register ``func(args, out)`` as the subcommand ``name``."""
    def decorator(func):
        _COMMANDS[name] = (func, help, list(arguments))
        return func
    return decorator


class Output:
    """Where a command's result goes: JSON or human-readable text on stdout."""

    def __init__(self, json_mode, stream=None):
        self.json = json_mode
        self.stream = stream if stream is not None else sys.stdout

    def console(self):
        from rich.console import Console
        # 120 columns when not on a terminal (rich would assume 80 and squeeze tables)
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        return Console(file=self.stream, highlight=False, soft_wrap=True,
                       width=None if tty else 120)

    def result(self, data, *, human):
        """Emit ``data`` as JSON, or call ``human(console)`` to print it for people."""
        if self.json:
            self.stream.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
        else:
            human(self.console())

    def text(self, text):
        self.stream.write(text)


def _parse_config(text):
    """``--config``: a JSON object of TileConfig fields, or a path to a JSON file."""
    if text is None:
        return None
    try:
        source = text if text.lstrip().startswith("{") else Path(text).read_text()
        values = json.loads(source)
        return TileConfig.from_dict(values)
    except OSError as e:
        raise CommandError(f"cannot read configuration {text!r}: {e.strerror}") from e
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise CommandError(f"bad configuration {text!r}: {e}") from e


_CONFIG_ARG = arg("--config", metavar="JSON|FILE",
                  help="tile configuration: a JSON object of TileConfig fields or a JSON "
                       "file (default: TileConfig())")


def _open_target(target, config):
    kwargs = {} if config is None else {"config": config}
    try:
        return open_transport(target, **kwargs)
    except ValueError as e:
        raise CommandError(str(e)) from e
    except TransportError as e:
        raise CommandError(f"cannot open target {target!r}: {e}") from e


# -- regmap ----------------------------------------------------------------------------

@command("regmap", "print the register map (Markdown, C header or JSON)", [
    arg("--markdown", dest="format", action="store_const", const="markdown",
        help="Markdown, as in docs/registers.md (the default)"),
    arg("--c-header", dest="format", action="store_const", const="c_header",
        help="C header, as in docs/fusetile_regs.h"),
    arg("--output", "-o", metavar="FILE", help="write to FILE instead of stdout"),
    _CONFIG_ARG,
])
def regmap_command(args, out):
    config = _parse_config(args.config) or TileConfig()
    if out.json:
        text = json.dumps(regmap_docs.as_dict(config), indent=2) + "\n"
    elif args.format == "c_header":
        text = regmap_docs.c_header(config)
    else:
        text = regmap_docs.markdown(config)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8", newline="\n")
        except OSError as e:
            raise CommandError(f"cannot write {args.output}: {e.strerror}") from e
    else:
        out.text(text)


# -- isa -------------------------------------------------------------------------------

@command("isa", "print the instruction set reference (Markdown or JSON)", [
    arg("--markdown", action="store_true",
        help="Markdown, as in docs/isa.md (the default)"),
    arg("--output", "-o", metavar="FILE", help="write to FILE instead of stdout"),
])
def isa_command(args, out):
    if out.json:
        text = json.dumps(isa_docs.as_dict(), indent=2) + "\n"
    else:
        text = isa_docs.markdown()
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8", newline="\n")
        except OSError as e:
            raise CommandError(f"cannot write {args.output}: {e.strerror}") from e
    else:
        out.text(text)


# -- info ---------------------------------------------------------------------------------

@command("info", "read the hardware profile from a tile", [
    arg("--target", "-t", default="amaranth",
        help=f"transport to the tile, NAME or NAME:ARG (known: {', '.join(transport_names())}; "
             f"default: amaranth)"),
    _CONFIG_ARG,
])
def info_command(args, out):
    from .device import Device

    config = _parse_config(args.config)
    with _open_target(args.target, config) as transport:
        try:
            device = Device(transport)
            version = ".".join(str(v) for v in device.version())
        except TransportError as e:
            raise CommandError(f"the tile on {args.target!r} does not answer: {e}") from e
        except ValueError as e:
            raise CommandError(f"no fusetile on {args.target!r}: {e}") from e
    profile = device.config
    mm = device.memory_map
    regions = {"CSR": regmap.CSR_BASE}
    regions.update((e.item.name, e.addr) for e in mm.windows())
    data = {
        "target": args.target,
        "config": profile.as_dict(),
        "profile_hash": profile.profile_hash,
        "version": version,
        "memory_map": regions,
    }

    def human(console):
        from rich.table import Table
        table = Table(title=f"fusetile on {args.target}", show_header=True)
        table.add_column("Parameter")
        table.add_column("Value", justify="right")
        table.add_row("version", version)
        table.add_row("profile hash", profile.profile_hash)
        for key, value in profile.as_built().items():
            table.add_row(key, str(value))
        console.print(table)
        regions_table = Table(title="Memory map", show_header=True)
        regions_table.add_column("Region")
        regions_table.add_column("Base", justify="right")
        for name, base in regions.items():
            regions_table.add_row(name, f"{base:#010x}")
        console.print(regions_table)

    out.result(data, human=human)


# -- demo ---------------------------------------------------------------------------------

@command("demo", "the product demo: the digits CNN streaming through the tile, adapting "
         "while it runs, beside the none and static policies and the roofline; "
         "--dma: the spine demo (a DMA plan and the tile's counters)", [
    arg("--target", "-t", default="amaranth",
        help=f"transport to the tile (known: {', '.join(transport_names())}; default: amaranth)"),
    arg("--workload", default="cnn", help="digits: mlp, cnn or rescnn (default: cnn)"),
    arg("--samples", type=int, default=128, help="digits streamed per policy (default: 128)"),
    arg("--out", default="build/report", help="where the plots go (default: build/report)"),
    arg("--dma", action="store_true", help="the spine demo instead"),
    arg("--inferences", "-n", type=int, default=4, help="--dma: plan runs (default: 4)"),
    _CONFIG_ARG,
])
def demo_command(args, out):
    if not args.dma:
        return _digits_demo(args, out)
    from rich.progress import Progress
    from .device import Device
    from .demo import run_dma_demo

    if args.inferences < 1:
        raise CommandError(f"--inferences must be at least 1, not {args.inferences}")
    config = _parse_config(args.config)
    with _open_target(args.target, config) as transport:
        device = Device(transport)
        with Progress(transient=True, disable=out.json, console=out.console()) as bar:
            task = bar.add_task(f"demo on {args.target}", total=args.inferences)
            result = run_dma_demo(device, inferences=args.inferences,
                                  progress=lambda n: bar.update(task, completed=n))
    result = {"target": args.target, "profile_hash": device.config.profile_hash, **result}

    def human(console):
        from rich.table import Table
        rows, cols = result["matrix_words"]
        console.print(f"Copied a {rows}x{cols}-word matrix through the scratchpad "
                      f"{result['inferences']} times on [bold]{args.target}[/bold]: "
                      + ("[green]output correct[/green]" if result["correct"]
                         else "[red]OUTPUT WRONG[/red]"))
        table = Table(title="Performance counters (read from the tile)")
        table.add_column("Counter")
        table.add_column("Value", justify="right")
        for name, value in result["counters"].items():
            table.add_row(name, f"{value:,}")
        console.print(table)
        trace = Table(title="Trace of the last inference (one record per kernel call)")
        for column in ("slot", "pc", "start", "cycles", "dma_busy", "bytes_in", "bytes_out"):
            trace.add_column(column, justify="right")
        for record in result["trace"]:
            trace.add_row(*(str(record[c]) for c in record))
        console.print(trace)

    out.result(result, human=human)
    return 0 if result["correct"] else 1


def _digits_demo(args, out):
    from rich.progress import Progress
    from .bench import WORKLOADS, workload_suite
    from .device import Device
    from .report import write_report

    if args.workload not in WORKLOADS:
        raise CommandError(f"--workload must be one of {', '.join(WORKLOADS)}, not "
                           f"{args.workload!r}")
    if args.samples < 1:
        raise CommandError(f"--samples must be positive, not {args.samples}")
    config = _parse_config(args.config)
    with _open_target(args.target, config) as transport:
        device = Device(transport)
        with Progress(transient=True, disable=out.json, console=out.console()) as bar:
            task = bar.add_task(f"digits {args.workload}: none, static, adaptive on "
                                f"{args.target}", total=3)
            results = workload_suite(device, names=[args.workload], samples=args.samples,
                                     target=args.target,
                                     progress=lambda n: bar.update(task, completed=n))
    cfg = device.config
    paths = write_report(args.out, results, cfg, target=args.target)
    data = {"target": args.target, "workload": args.workload,
            "hardware": {"profile_hash": cfg.profile_hash, **cfg.as_dict()},
            "results": results, "report": {k: str(v) for k, v in paths.items()}}

    def human(console):
        from rich.table import Table
        table = Table(title=f"digits {args.workload}: {args.samples} held-out digits on "
                            f"{args.target} (from the tile's counters)")
        for column in ("policy", "cycles / inference", "GMEM bytes / inference",
                       "MAC utilisation", "fusions", "outputs vs none"):
            table.add_column(column, justify="left" if column == "policy" else "right")
        for r in results:
            table.add_row(r["policy"], f"{r['cycles_per_inference']:,.0f}",
                          f"{r['gmem_bytes_per_inference']:,.0f}",
                          f"{100 * r['mac_utilization']:.1f} %", str(r["fusions"]),
                          "identical" if r["output_mismatches"] == 0 else
                          f"[red]{r['output_mismatches']} differ[/red]")
        table.add_row("roofline", f"{results[0]['roofline_cycles']:,.0f}", "", "100.0 %",
                      "", "")
        console.print(table)
        for e in results[-1].get("fusion_log", []):
            console.print(f"run {e['run']}: {e['action']} {e['units']}"
                          + (f" ({e['reason']})" if "reason" in e else ""))
        console.print("plots and report: " + ", ".join(str(p) for p in paths.values()))

    out.result(data, human=human)
    return 0 if all(r["output_mismatches"] == 0 for r in results) else 1


# -- run --------------------------------------------------------------------------------

@command("run", "run a quantised ONNX model on the tile", [
    arg("model", help="int8 ONNX model (QDQ or QOperator form)"),
    arg("--input", "-i", required=True, metavar="X.npy",
        help="float samples stacked on axis 0 (each the model's input without its batch "
             "dimension of 1)"),
    arg("--output", "-o", metavar="Y.npy",
        help="write the dequantised float32 outputs, stacked on axis 0"),
    arg("--target", "-t", default="model",
        help=f"transport to the tile (known: {', '.join(transport_names())}; default: model)"),
    arg("--policy", "-p", default="none", help="kernel fusion policy: none, static or "
        "adaptive (default: none)"),
    arg("--cache", metavar="PATH", default=None,
        help="adaptive: the SQLite kernel cache (default: .fusetile/cache.sqlite; 'none' "
             "for no cache)"),
    _CONFIG_ARG,
])
def run_command(args, out):
    import numpy as np
    from rich.progress import Progress
    from ..kernels.compiler import POLICIES, compile_graph
    from ..kernels.graph import GraphError
    from .device import Device
    from .onnx_import import load_model
    from .runner import infer, load_program

    policies = POLICIES + ("adaptive",)
    if args.policy not in policies:
        raise CommandError(f"--policy must be one of {', '.join(policies)}, not "
                           f"{args.policy!r}")
    try:
        graph = load_model(args.model)
    except GraphError as e:
        raise CommandError(f"{args.model}: {e}") from e
    except OSError as e:
        raise CommandError(f"cannot read {args.model}: {e.strerror or e}") from e
    try:
        x = np.load(args.input)
    except (OSError, ValueError) as e:
        raise CommandError(f"cannot read {args.input}: {e}") from e
    shape = tuple(graph.tensors[graph.input].shape)
    if x.ndim == len(shape):            # a single sample
        x = x[None]
    try:
        xq = graph.quantize_input(x.reshape((len(x),) + shape))
    except ValueError as e:
        raise CommandError(f"{args.input}: samples of shape {x.shape[1:]} do not fit the "
                           f"model's input {shape}") from e
    config = _parse_config(args.config)
    with _open_target(args.target, config) as transport:
        device = Device(transport)
        adaptive = None
        try:
            if args.policy == "adaptive":
                from .adaptive import AdaptiveRunner
                adaptive = AdaptiveRunner(device, graph, cache=_open_cache(args.cache))
                program = adaptive.program
            else:
                program = compile_graph(graph, device.config, policy=args.policy)
                load_program(device, program)
        except GraphError as e:
            raise CommandError(f"{args.model}: {e}") from e
        with Progress(transient=True, disable=out.json or len(x) <= 1,
                      console=out.console()) as bar:
            task = bar.add_task(f"{Path(args.model).name} on {args.target}", total=len(x))
            progress = lambda n, total: bar.update(task, completed=n)  # noqa: E731
            if adaptive is not None:
                yq, stats = adaptive.run(xq, progress=progress)
            else:
                yq, stats = infer(device, program, xq, progress=progress)
    y = graph.dequantize_output(yq)
    if args.output:
        try:
            np.save(args.output, y)
        except OSError as e:
            raise CommandError(f"cannot write {args.output}: {e.strerror}") from e
    result = {"model": args.model, "samples": int(len(x)), "target": args.target,
              "policy": args.policy, "profile_hash": device.config.profile_hash,
              "lanes": program.lanes, "segments": len(program.segments),
              **stats.per_inference()}
    if adaptive is not None:
        result.update(fusions=stats.fusions, defusions=stats.defusions,
                      jit_compiles=stats.jit_compiles, swaps=stats.swaps,
                      swap_idle_cycles=stats.swap_idle_cycles,
                      resident_constants=adaptive.program.resident,
                      units=["+".join(g) for g in adaptive.program.groups],
                      fusion_log=adaptive.engine.log)
        if stats.speculation is not None:
            result["speculation"] = stats.speculation.summary()

    def human(console):
        from rich.table import Table
        table = Table(title=f"{Path(args.model).name}: {len(x)} samples on {args.target}, "
                            f"policy {args.policy} (from the tile's counters)")
        table.add_column("Per inference")
        table.add_column("Value", justify="right")
        for key, value in stats.per_inference().items():
            table.add_row(key.replace("_per_inference", ""),
                          f"{value:.1%}" if key == "mac_utilization" else f"{value:,.1f}")
        console.print(table)
        spec = result.get("speculation")
        if spec:
            console.print(f"speculation: {spec['hits']} hits, {spec['misses']} misses "
                          f"(rolled back in {spec['rollback_cycles']:.1f} cycles each), "
                          f"predictor right {100 * spec['predictor_accuracy']:.0f} %")
        if args.output:
            console.print(f"outputs written to {args.output}")

    out.result(result, human=human)


# -- bench --------------------------------------------------------------------------------

def _open_cache(path):
    """``--cache``: the kernel cache (a default path under .fusetile/, or none)."""
    from .cache import KernelCache
    if path is not None and path.lower() == "none":
        return None
    path = Path(path or Path(".fusetile") / "cache.sqlite")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass                                   # KernelCache reports what fails
    return KernelCache(path)


@command("bench", "run a benchmark; every number comes from the tile's counters", [
    arg("--suite", default="workloads", choices=["workloads", "isa"],
        help="workloads: the shipped digits MLP, CNN and residual CNN under the none, "
             "static and adaptive policies with their roofline (default); isa: tiled "
             "matmuls of growing K, with and without double-buffering"),
    arg("--target", "-t", default="verilator",
        help=f"transport to the tile (known: {', '.join(transport_names())}; "
             f"default: verilator)"),
    arg("--samples", type=int, default=256,
        help="workloads: held-out digits per workload and policy (default: 256)"),
    arg("--cache", metavar="PATH", default="none",
        help="workloads: the adaptive policy's kernel cache (default: none, a cold start)"),
    _CONFIG_ARG,
])
def bench_command(args, out):
    config = _parse_config(args.config)
    if args.suite == "workloads":
        return _bench_workloads(args, out, config)
    from rich.progress import Progress
    from .device import Device
    from .bench import isa_suite, ISA_SIZES

    with _open_target(args.target, config) as transport:
        device = Device(transport)
        with Progress(transient=True, disable=out.json, console=out.console()) as bar:
            task = bar.add_task(f"{args.suite} suite on {args.target}",
                                total=2 * len(ISA_SIZES))
            results = isa_suite(device, progress=lambda n: bar.update(task, completed=n))
    cfg = device.config
    data = {
        "suite": args.suite,
        "target": args.target,
        "hardware": {"profile_hash": cfg.profile_hash, **cfg.as_dict()},
        "results": results,
    }

    def human(console):
        from rich.table import Table
        table = Table(title=f"MAC-array utilisation on {args.target} "
                            f"({cfg.rows}x{cfg.cols} array, from the tile's counters)")
        for column in ("M", "N", "K", "double buffer", "cycles", "utilisation",
                       "steady state", "correct"):
            table.add_column(column, justify="right")
        for r in results:
            table.add_row(str(r["m"]), str(r["n"]), str(r["k"]),
                          "yes" if r["double_buffer"] else "no", f"{r['cycles']:,}",
                          f"{100 * r['mac_utilization']:.1f} %",
                          "-" if r["steady_mac_utilization"] is None
                          else f"{100 * r['steady_mac_utilization']:.1f} %",
                          "yes" if r["correct"] else "[red]NO[/red]")
        console.print(table)

    out.result(data, human=human)
    return 0 if all(r["correct"] for r in results) else 1


def _bench_workloads(args, out, config):
    from rich.progress import Progress
    from .bench import WORKLOADS, workload_suite
    from .device import Device

    if args.samples < 1:
        raise CommandError(f"--samples must be positive, not {args.samples}")
    with _open_target(args.target, config) as transport:
        device = Device(transport)
        with Progress(transient=True, disable=out.json, console=out.console()) as bar:
            task = bar.add_task(f"workloads on {args.target}", total=3 * len(WORKLOADS))
            skipped = []
            results = workload_suite(device, samples=args.samples, target=args.target,
                                     cache=_open_cache(args.cache),
                                     progress=lambda n: bar.update(task, completed=n),
                                     skipped=skipped)
    cfg = device.config
    data = {"suite": "workloads", "target": args.target,
            "hardware": {"profile_hash": cfg.profile_hash, **cfg.as_dict()},
            "results": results, "skipped": skipped}

    def human(console):
        from rich.table import Table
        table = Table(title=f"Cycles per inference on {args.target} ({cfg.rows}x{cfg.cols} "
                            f"array; from the tile's counters, adaptive in steady state)")
        for column in ("workload", "policy", "cycles", "GMEM bytes", "MAC util.",
                       "roofline", "fusions", "defusions", "swap idle", "mismatches"):
            table.add_column(column, justify="left" if column in ("workload", "policy")
                             else "right")
        for r in results:
            policy = r["policy"] + (" (class-sorted)" if r.get("stream") == "class-sorted"
                                    else "")
            table.add_row(r["workload"], policy, f"{r['cycles_per_inference']:,.0f}",
                          f"{r['gmem_bytes_per_inference']:,.0f}",
                          f"{100 * r['mac_utilization']:.1f} %",
                          f"{r['roofline_cycles']:,.0f}", str(r["fusions"]),
                          str(r["defusions"]), str(r["swap_idle_cycles"]),
                          str(r["output_mismatches"]))
        console.print(table)
        for s in skipped:
            console.print(f"{s['workload']}: not run, it does not fit this configuration "
                          f"({s['reason']})")
        for r in results:
            for entry in r.get("fusion_log", []):
                console.print(f"{r['workload']}: run {entry['run']}: {entry['action']} "
                              f"{entry['units']}" + (f" ({entry['reason']})"
                                                     if "reason" in entry else ""))
        for r in results:
            spec = r.get("speculation")
            if r["policy"] != "adaptive" or not spec:
                continue
            console.print(f"{r['workload']} ({r['stream']}): {spec['hits']} hits, "
                          f"{spec['misses']} misses, rollback {spec['rollback_cycles']:.1f} "
                          f"cycles, predictor right {100 * spec['predictor_accuracy']:.0f} %")
            for w in spec["windows"]:
                hit = "-" if w["hit_rate"] is None else f"{100 * w['hit_rate']:.0f} %"
                console.print(f"  inferences {w['first']}..{w['first'] + w['inferences'] - 1}"
                              f": {w['cycles_per_inference']:,.0f} cycles, hit rate {hit} "
                              f"of {w['speculated']} guesses, paths "
                              f"{w['paths']}, thresholds "
                              f"{' / '.join(f'{t:.2f}' for t in w['thresholds'])}")

    out.result(data, human=human)
    return 0 if all(r["output_mismatches"] == 0 for r in results) else 1


@command("report", "plots of a workloads benchmark: a timeline of one run per workload, "
         "the roofline, the fusion decision log (PNG and HTML)", [
    arg("bench", nargs="?", metavar="BENCH.json",
        help="the output of 'fusetile bench --json' (default: run the workloads suite now)"),
    arg("--target", "-t", default="model",
        help="without BENCH.json: where to run the suite (default: model)"),
    arg("--samples", type=int, default=128,
        help="without BENCH.json: digits per workload and policy (default: 128)"),
    arg("--out", default="build/report", help="output directory (default: build/report)"),
    _CONFIG_ARG,
])
def report_command(args, out):
    from .report import write_report
    if args.bench:
        try:
            data = json.loads(Path(args.bench).read_text())
            results, hardware = data["results"], data["hardware"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CommandError(f"{args.bench} is not the JSON of 'fusetile bench "
                               f"--suite workloads': {e}") from e
        config = TileConfig.from_dict({k: v for k, v in hardware.items()
                                       if k != "profile_hash"})
        target = data.get("target", "?")
    else:
        from .bench import workload_suite
        from .device import Device
        with _open_target(args.target, _parse_config(args.config)) as transport:
            device = Device(transport)
            results = workload_suite(device, samples=args.samples, target=args.target,
                                     skipped=[])
            config, target = device.config, args.target
    paths = write_report(args.out, results, config, target=target)
    out.result({k: str(v) for k, v in paths.items()},
               human=lambda console: console.print(
                   "written: " + ", ".join(str(p) for p in paths.values())))


# -- build -----------------------------------------------------------------------------

def _resources_table(title, resources):
    """A rich table of a build's ``resources``: used, available, per cent."""
    from rich.table import Table
    table = Table(title=title)
    for column in ("resource", "used", "available", "%"):
        table.add_column(column, justify="left" if column == "resource" else "right")
    for name, r in resources.items():
        table.add_row(name, f"{r['used']:,}", f"{r['available']:,}",
                      f"{100 * r['used'] / r['available']:.0f}" if r["available"] else "-")
    return table


@command("build", "build the tile's bitstream for a board with the open tools (YoWASP "
         "Yosys and nextpnr) and report its resources and Fmax", [
    arg("--board", "-b", required=True, metavar="BOARD",
        help="the board: " + ", ".join(BOARDS)),
    arg("--clock-mhz", type=float, metavar="MHZ",
        help="the tile's clock (default: the board's: " + ", ".join(
            f"{b.name} {b.clock_hz / 1e6:g} MHz" for b in BOARDS.values())
        + "); timing is checked against it"),
    arg("--baud", type=int, default=DEFAULT_BAUD,
        help=f"UART line rate (default: {DEFAULT_BAUD})"),
    arg("--out", metavar="DIR", help="build directory (default: build/fpga/BOARD)"),
    arg("--seed", type=int,
        help="nextpnr's placement seed (default: the board's: " + ", ".join(
            f"{b.name} {b.seed}" for b in BOARDS.values()) + ")"),
    arg("--seeds", type=int, default=1, metavar="N",
        help="make N placements (seeds SEED to SEED + N - 1, each in OUT/seed-S) and "
             "keep the fastest (default: 1)"),
    arg("--jobs", "-j", type=int, metavar="J",
        help="placements built at once (default: N or the processors, the fewer)"),
    arg("--time-limit", type=float, metavar="MIN",
        help="stop a placement still building after MIN minutes and keep the best of "
             "the others (default: no limit)"),
    arg("--sdf", action="store_true",
        help="also write the routed design's delays (routed.sdf in the build "
             "directory) for scripts/sdf_paths.py"),
    arg("--program", action="store_true",
        help="load the bitstream into the board with openFPGALoader afterwards"),
    arg("--config", metavar="JSON|FILE",
        help="tile configuration: a JSON object of TileConfig fields or a JSON file "
             "(default: the board's)"),
])
def build_command(args, out):
    from .fpga import DoesNotFit, FpgaError, build, program
    say = (lambda text: None) if out.json else \
        (lambda text: print(f"fusetile build: {text}", file=sys.stderr, flush=True))
    config = _parse_config(args.config)
    try:
        result = build(args.board, config=config,
                       clock_hz=None if args.clock_mhz is None else args.clock_mhz * 1e6,
                       baud=args.baud, build_dir=args.out, seed=args.seed,
                       seeds=args.seeds, jobs=args.jobs, sdf=args.sdf,
                       time_limit=None if args.time_limit is None else args.time_limit * 60,
                       progress=say)
        if args.program and result["timing_met"]:
            say(f"programming the board with {result['bitstream']}")
            program(result)
    except DoesNotFit as e:
        # What the design needs of the device is still the build's figures: reported
        # (in the JSON too, with "fits": false) before the error.
        out.result({"board": e.board, "config": e.config.as_dict(), "fits": False,
                    "error": str(e), "resources": e.resources, "log": e.log},
                   human=lambda console: console.print(_resources_table(
                       f"{e.board}: does not fit", e.resources)))
        print(f"fusetile build: error: {e}", file=sys.stderr)
        return 1
    except (FpgaError, ValueError) as e:
        raise CommandError(str(e)) from e

    def human(console):
        console.print(_resources_table(
            f"{result['board']} ({result['device']}), "
            f"{result['config']['rows']} x {result['config']['cols']} MACs",
            result["resources"]))
        verdict = "met" if result["timing_met"] else "NOT met"
        console.print(f"clock {result['clock_mhz']['pll']:g} MHz, Fmax "
                      f"{result['fmax_mhz']:g} MHz: timing {verdict}; peak "
                      f"{result['peak_gops']:g} GOPS; built in {result['build_seconds']:.0f} s")
        if len(result["seeds"]) > 1:
            console.print("placements: " + ", ".join(
                f"seed {s['seed']} " + ("stopped" if s["stopped"] else f"{s['fmax_mhz']:g} MHz")
                for s in result["seeds"]) + f"; kept seed {result['seed']}")
        path = result["critical_path"]
        if path and not result["timing_met"]:
            console.print(f"critical path: {path['from']} -> {path['to']}, "
                          f"{path['delay_ns']:g} ns through {path['logic_cells']} logic cells")
        late = result["late_endpoints"]
        if late and late["endpoints"]:
            blocks = ", ".join(f"{name} {n:,}" for name, n in list(late["by_block"].items())[:4])
            console.print(f"late: {late['endpoints']:,} of {late['of']:,} endpoints after "
                          f"{late['period_ns']:g} ns; most in {blocks}")
        console.print(f"bitstream: {result['bitstream']}")

    out.result(result, human=human)
    if not result["timing_met"]:
        print(f"fusetile build: error: timing not met: Fmax {result['fmax_mhz']:g} MHz < "
              f"{result['clock_mhz']['pll']:g} MHz", file=sys.stderr)
        return 1
    return 0


# -- entry point ---------------------------------------------------------------------------

def build_parser():
    parser = argparse.ArgumentParser(
        prog="fusetile", description="fusetile: an NPU tile that fuses kernels while it runs")
    parser.add_argument("--traceback", action="store_true",
                        help="show the full traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (func, help, arguments) in _COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        for names, kwargs in arguments:
            p.add_argument(*names, **kwargs)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)
    return parser


def main(argv=None):
    """Run the ``fusetile`` command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Output(args.json)
    try:
        return args.func(args, out) or 0
    except KeyboardInterrupt:
        print("fusetile: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.traceback:
            raise
        message = str(e) if isinstance(e, (CommandError, TransportError)) else \
            f"{type(e).__name__}: {e}"
        print(f"fusetile {args.command}: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
