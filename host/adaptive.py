"""The adaptive runtime: runs a graph and makes it faster while it runs.

It starts from the ``static`` policy's program, compiled with a *stable layout* (every
grouping of the graph's ops shares one GMEM image; ``compile_graph(stable_layout=True)``),
so changing the program never touches GMEM: only kernels and a plan. Per plan run of
``lanes`` samples:

1. write the samples, START;
2. while the tile runs, if a new program is ready: write its new kernels into slots
   the running plan does not use, its plan into the inactive bank, and request the swap
   (the tile takes it at the run's DONE: the run in flight finishes on the old plan,
   the next starts on the new one; nothing is lost or run twice);
3. wait for DONE, let the :class:`~fusetile.host.profiler.Profiler` drain the trace,
   read the outputs;
4. every ``interval`` runs after the last change (on a short stream, every quarter of
   it), ask the
   :class:`~fusetile.host.fusion.FusionEngine` for a merge or a split; JIT-compile the
   new grouping (or take it from the :class:`~fusetile.host.cache.KernelCache`);
5. when the engine has nothing to change and one kernel runs the whole plan, swap to
   its *resident* variant (:func:`~fusetile.kernels.compiler.resident`): the runs
   before it left the kernel's weights, biases and tables in the scratchpad, and the
   runtime, which owns the tile, knows nothing ran in between, so the kernel no longer
   loads them. A new ``run`` starts from the variant that loads them again.

On a tile without a trace FIFO (``TileConfig.trace_depth`` 0) there are no unit
profiles, and step 4 never runs: the first program, the static policy's, stays.

A graph with a data-dependent choice runs one sample per run, and the
:class:`~fusetile.host.speculation.Speculator` takes the plan banks: before each run it
installs the plan that guesses the sample's path (or the unspeculated one), after it
learns from the decision and the counters (``docs/runtime.md``, Speculation); on a
tile without speculation (``TileConfig.staging_words`` 0) the fusion engine works on
either side of the choice instead, as with ``speculate=False``.
"""

from dataclasses import asdict, dataclass, field
import time

import numpy as np

from ..kernels.compiler import (CompileError, Segment, compile_graph, resident,
                                static_groups, unit_groups)
from ..kernels.graph import Select
from ..kernels.isa import PlanInstr, PlanOp
from ..kernels.program import call
from .fusion import FusionEngine
from .profiler import Profiler
from .runner import RunStats, _COUNTED, infer, load_program
from .speculation import SpeculationStats, Speculator


#: Counters read after every run (the adaptive runtime's own cost, with the trace).
_PER_RUN = ("active_cycles", "dma_bytes_in", "dma_bytes_out", "macs")
#: ... and with speculation.
_PER_SPEC_RUN = ("spec_hits", "spec_misses", "rollback_cycles")


__all__ = ["SlotTable", "AdaptiveRunner"]


class SlotTable:
    """What the host has loaded into each kernel slot, so that a new program reuses
    the kernels already there and puts the rest only into slots the running plan does
    not call."""

    def __init__(self, slots):
        self.bodies = [None] * slots

    def place(self, segment, busy=()):
        """Slots for ``segment``'s kernels: ``(relinked segment, {slot: body to load})``.
        ``busy``: slots the running plan calls (never overwritten).

        Raises :class:`CompileError` when there are not enough free slots."""
        where, loads = {}, {}
        taken = set(busy)
        for s, body in segment.kernels.items():
            body = tuple(body)
            if body in self.bodies:
                where[s] = self.bodies.index(body)
                taken.add(where[s])
        for s, body in segment.kernels.items():
            if s in where:
                continue
            free = [i for i in range(len(self.bodies)) if i not in taken]
            if not free:
                raise CompileError("+".join(filter(None, segment.units)), "Slots",
                                   f"needs {len(segment.kernels)} kernel slots beside the "
                                   f"{len(set(busy))} the running plan uses; the tile has "
                                   f"{len(self.bodies)}")
            # prefer a slot that holds nothing, then the oldest leftover
            slot = min(free, key=lambda i: self.bodies[i] is not None)
            where[s] = slot
            taken.add(slot)
            loads[slot] = tuple(body)
        def relink(plan):
            out = []
            for instr in plan:
                v = PlanInstr.from_bits(instr)
                if v.op == PlanOp.CALL:
                    instr = call(where[int(v.sel)], a=int(v.a), b=int(v.b))
                out.append(instr)
            return out

        kernels = {where[s]: list(b) for s, b in segment.kernels.items()}
        fallback = None if segment.fallback is None else relink(segment.fallback)
        return Segment(kernels, relink(segment.plan), list(segment.units), fallback,
                       segment.fallback_units), loads

    def commit(self, loads):
        for slot, body in loads.items():
            self.bodies[slot] = body


@dataclass
class _Pending:
    program: object
    segment: Segment
    loads: dict


@dataclass
class AdaptiveStats(RunStats):
    """:class:`RunStats` plus what adaptation did."""
    fusions: int = 0
    defusions: int = 0
    jit_compiles: int = 0
    swaps: int = 0
    swap_idle_cycles: int = 0
    runs_log: list = field(default_factory=list)       # per run: samples, counters, plan
    speculation: SpeculationStats = None

    def steady(self):
        """Counter totals and samples over the runs on the final plan (all runs when
        there was no adapting: the static fallback). With speculation, over all the
        runs, the predictors' training included: what a run costs depends on its
        sample's path, so only the same samples compare with another policy."""
        if not self.runs_log or self.speculation is not None:
            return {c: getattr(self, c) for c in _PER_RUN} | {"samples": self.samples}
        last = [r for r in self.runs_log if r["plan"] == self.runs_log[-1]["plan"]]
        out = {c: sum(r[c] for r in last) for c in _PER_RUN}
        out["samples"] = sum(r["samples"] for r in last)
        return out


class AdaptiveRunner:
    """The ``adaptive`` policy on a :class:`~fusetile.host.device.Device`: the fusion
    engine, and for a graph with a data-dependent choice the speculation manager
    (``speculate=False``: the fusion engine there too)."""

    def __init__(self, dev, graph, *, interval=4, window=16, cache=None, speculate=True,
                 **engine_args):
        cfg = dev.config
        self.dev, self.graph, self.cfg = dev, graph, cfg
        self.interval = interval
        self.cache = cache
        self.profiler = Profiler(window)
        self.slots = SlotTable(cfg.kernel_slots)
        self.jit_compiles = 0
        self.compile_seconds = 0.0
        self._programs = {}
        self.pending = None
        self.fallback = None
        self.speculator = None      # (none on a static fallback either)
        groups = self._start_groups()
        try:
            program = self._compile(groups, jit=False)
        except CompileError as e:
            if e.op != "Plan":
                raise
            # More kernels than slots, or calls than a plan bank: run the static program
            # segment by segment, without adapting (said in the log and the JSON).
            self.fallback = compile_graph(graph, cfg, policy="static")
            self.program = self.fallback
            self.engine = FusionEngine(graph, cfg, self.fallback.groups, self._fits,
                                       **engine_args)
            self.engine.log.append({"run": 0, "action": "static", "units": graph.name,
                                    "reason": e.reason})
            load_program(dev, self.fallback)
            return
        self.engine = FusionEngine(graph, cfg, program.groups, self._fits, **engine_args)
        if self.cache is not None:
            self.engine.refusions.update(self.cache.refused(graph, cfg))
        dev.write_window("GMEM", 0, program.gmem)
        base, length = program.partition
        dev.set_partition(0, base=base, length=length)
        segment, loads = self.slots.place(program.segments[0])
        self._load(loads)
        dev.load_plan(segment.plan)
        self.program, self.segment = program, segment
        if not cfg.traced:
            # No trace, no unit profiles: a unit would look as if it never ran. The
            # first plan stays (said in the log and the JSON).
            self.engine.log.append({"run": 0, "action": "static", "units": graph.name,
                                    "reason": "the tile has no trace FIFO: no unit "
                                              "profiles to adapt on"})
        if speculate and cfg.speculates and any(isinstance(op, Select) for op in graph.ops):
            # A data-dependent choice: speculation merges across it (and owns the banks;
            # without it, or on a tile without speculation, the fusion engine merges
            # units on either side of the choice).
            self.speculator = Speculator(dev, graph, self.slots, program, segment)

    # -- programs -----------------------------------------------------------------------
    def _start_groups(self):
        """The static rules, or the best grouping the cache has measured here."""
        if self.cache is not None:
            best = self.cache.best_groups(self.graph, self.cfg)
            ops = {op.name for op in self.graph.ops}
            # (the same graph under other op names hashes the same: then start static)
            if best is not None and all(n in ops for g in best for n in g):
                return best
        return static_groups(self.graph, self.cfg)

    def _compile(self, groups, *, jit=True):
        key = tuple(unit_groups(self.graph, self.cfg, groups))
        if key in self._programs:
            return self._programs[key]
        program = None if self.cache is None else self.cache.program(self.graph, self.cfg, key)
        if program is None:
            t = time.perf_counter()
            program = compile_graph(self.graph, self.cfg, policy="none", groups=list(key),
                                    stable_layout=True)
            self.compile_seconds += time.perf_counter() - t
            if jit:
                self.jit_compiles += 1
            if self.cache is not None:
                self.cache.store_program(self.graph, self.cfg, key, program)
        if len(program.segments) != 1:
            raise CompileError("+".join(map("+".join, key)), "Plan", "the adaptive policy "
                               "runs programs that fit one plan bank and the kernel slots")
        self._programs[key] = program
        return program

    def _fits(self, groups):
        """The engine's feasibility check: compiled, and its new kernels fit the slots
        the running plan leaves free (raises CompileError otherwise)."""
        program = self._compile(groups)
        self.slots.place(program.segments[0], set(self.segment.kernels))
        return program

    def _load(self, loads):
        for slot, body in loads.items():
            self.dev.load_kernel(slot, list(body), part=0)
        self.slots.commit(loads)

    # -- running -------------------------------------------------------------------------
    def run(self, x, *, progress=None, timeout_cycles=50_000_000):
        """Infer ``x`` (int8 ``(N, *input shape)``), adapting between runs. Returns
        ``(y, AdaptiveStats)``."""
        dev, program = self.dev, self.program
        if self.fallback is not None:
            y, base = infer(dev, program, x, progress=progress, timeout_cycles=timeout_cycles)
            return y, AdaptiveStats(**asdict(base))
        if self.program.resident:
            # Anything may have used the scratchpad since the last run: back to the
            # program that loads the constants (compiled already: the same groups).
            program = self._compile(self.program.groups)
            segment, loads = self.slots.place(program.segments[0])
            self._load(loads)
            dev.load_plan(segment.plan)
            self.program, self.segment = program, segment
        wb = self.cfg.word_bytes
        x = np.asarray(x, dtype=np.int8)
        n = len(x)
        g = self.graph
        out_shape = g.tensors[g.output].shape
        self.profiler.reset(dev)
        dev.clear_counters()
        stats = AdaptiveStats(n, 0, 0, 0, 0, 0, 0, array=self.cfg.rows * self.cfg.cols)
        spec = self.speculator
        counted = _PER_RUN + (_PER_SPEC_RUN if spec else ())
        if spec is not None:
            stats.speculation = spec.stats
        fusions0 = sum(e["action"] == "fuse" for e in self.engine.log)
        defusions0 = sum(e["action"] == "defuse" for e in self.engine.log)
        jit0 = self.jit_compiles
        # every ``interval`` runs, or sooner on a short stream (a quarter of it)
        interval = min(self.interval, max(1, -(-n // program.lanes) // 4))
        since_change, ys = 0, []
        last = {c: 0 for c in counted}
        for start in range(0, n, program.lanes):
            group = x[start:start + program.lanes]
            dev.write_window("GMEM", program.input.at * wb, program.input.image(group, wb))
            if spec is not None:                  # one sample per run
                guess, predicted, guesses = spec.before(group[0], stats.runs)
            dev.start()
            swapping = self.pending
            if swapping is not None:              # load while the tile runs
                self._load(swapping.loads)
                dev.load_plan(swapping.segment.plan)
                self.pending = None
            dev.wait_done(timeout_cycles=timeout_cycles,
                          on_poll=lambda: self.profiler.poll(dev))
            now = {c: int(dev.counter(c)) for c in counted}
            delta = {c: now[c] - last[c] for c in counted}
            stats.runs_log.append({"samples": len(group), "plan": stats.swaps,
                                   **{c: delta[c] for c in _PER_RUN}})
            if spec is None:
                self.profiler.collect(dev, self.segment, len(group),
                                      cycles=delta["active_cycles"])
            else:
                self.profiler.collect(dev, self.segment if guess is None else
                                      spec.plans[guess], 1, cycles=delta["active_cycles"],
                                      bank=spec.active)
                path = spec.after(group[0], stats.runs, guess, predicted, guesses, delta)
                self.profiler.route(spec.select.name, path)
            last = now
            stats.runs += 1
            raw = dev.read_window("GMEM", program.output.at * wb, program.output.words * wb)
            ys.append(program.output.samples(raw, len(group), wb).reshape(
                (len(group),) + tuple(out_shape)))
            self.profiler.observe(g.output, ys[-1])
            if swapping is not None:
                # The run in flight finished on the old plan; the next runs the new one.
                # A swap that cost the tile cycles would show in the run it happened in.
                cycles = [r["active_cycles"] for r in stats.runs_log]
                typical = np.median(cycles[:-1][-4:]) if len(cycles) > 1 else cycles[-1]
                stats.swap_idle_cycles += max(0, int(cycles[-1] - typical))
                stats.swaps += 1
                self.program, self.segment = swapping.program, swapping.segment
                self.profiler.runs.clear()          # measure the new plan afresh
            since_change = 0 if swapping is not None else since_change + 1
            if since_change >= interval and self.pending is None and spec is None and \
                    self.cfg.traced:
                self._adapt(stats.runs)
                since_change = 0 if self.pending is not None else since_change
            if progress:
                progress(min(start + program.lanes, n), n)
        counters = dev.counters()
        for name in _COUNTED:
            setattr(stats, name, int(counters[name]))
        stats.fusions = sum(e["action"] == "fuse" for e in self.engine.log) - fusions0
        stats.defusions = sum(e["action"] == "defuse" for e in self.engine.log) - defusions0
        stats.jit_compiles = self.jit_compiles - jit0
        if self.cache is not None:
            self.cache.record(self.graph, self.cfg, self.program.groups, self.profiler,
                              self.engine)
        y = np.concatenate(ys) if ys else np.zeros((0,) + tuple(out_shape), dtype=np.int8)
        return y, stats

    def _adapt(self, run):
        groups = self.engine.step(self.program, self.profiler, run)
        if groups is None:
            self._keep_constants(run)
            return
        program = self._compile(groups)
        segment, loads = self.slots.place(program.segments[0], set(self.segment.kernels))
        self.pending = _Pending(program, segment, loads)

    def _keep_constants(self, run):
        """Swap to the resident variant of the program when one kernel runs its whole
        plan. The run in flight when the swap is requested runs the loading variant,
        so the constants are in place when the resident one starts."""
        if self.program.resident:
            return
        try:
            program = resident(self.program)
        except CompileError:
            return
        segment, loads = self.slots.place(program.segments[0], set(self.segment.kernels))
        self.pending = _Pending(program, segment, loads)
        self.engine.log.append({
            "run": run, "action": "resident", "units": segment.units[0],
            "reason": f"one kernel runs the whole plan: its {program.constant_words} "
                      "constant words stay in the scratchpad from one run to the next"})
