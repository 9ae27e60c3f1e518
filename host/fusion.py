"""The fusion engine: which units of a running program to merge, or to split again,
decided from the profiler's measurements.

The program's ops are grouped into *units* (one kernel each; see
``kernels/compiler.py: compile_graph(groups=...)``). The engine looks at every pair of
units where one consumes the other's output and nothing else does (the dependency graph
between units), asks the compiler whether the merged group is a kind it fuses and fits
the tile, and scores it from the measured profiles of the two parts:

* **co-occurrence**: the fraction of the window's runs in which the two ran back to
  back (a pair that rarely runs together saves rarely);
* **bytes kept on-tile**: the producer's stored output, which the consumer loads
  again (GMEM bytes the DMA no longer moves, twice);
* **launch overhead**: calls the merged kernel saves, at the measured idle cycles
  per call of the two parts (cycles when neither the DMA nor a compute unit is busy);
* **complementarity**: a memory-bound part beside a compute-bound one can overlap
  (the smaller of the one's DMA-busy and the other's compute-busy cycles, weighted by
  ``overlap_weight``).

The predicted saving (cycles per inference) over the parts' cycles is the score. The
best candidate above ``threshold`` is merged; in the first window after the swap its
gain is measured (the runs' cycles per inference from the tile's counter before and
after, which also counts what the merge saves between calls; the unit's own cycles
from the trace when the runs did not record them) and compared with the prediction,
and the threshold adapts: raised when fusions pay less than predicted, lowered when
they pay as predicted. A merged unit is split again
when it is slower than its parts were (as measured), when it ran in too few of the
window's runs, or when a better candidate needs its kernel slot; the merges the engine
starts from (the static rules') only when they run too seldom, into their ops. A group
that has been split ``max_refusions`` times is never merged again (no thrashing).
"""

from dataclasses import dataclass, field

from ..kernels.compiler import CompileError, fusion_kind, unit_edges


__all__ = ["Candidate", "FusionEngine"]


@dataclass
class Candidate:
    """A pair of units that could be merged, with the engine's estimate."""
    parts: tuple               # (producer group, consumer group), tuples of op names
    kind: str
    co_occurrence: float
    bytes_kept: float          # GMEM bytes per inference the merge keeps on-tile
    calls_saved: float         # kernel calls per inference
    overlap: float             # cycles per inference the parts could overlap
    predicted: float           # cycles per inference saved
    score: float               # predicted / the parts' cycles

    @property
    def group(self):
        return self.parts[0] + self.parts[1]


@dataclass
class _Fused:
    parts: tuple
    predicted: float
    before: float              # the parts' cycles per inference when it was merged
    run_before: float = None   # the whole run's, from the counter, if known
    measured: float = None     # its gain (cycles per inference), once measured
    inner: dict = field(default_factory=dict)   # merged parts it subsumed: restored on split


@dataclass
class FusionEngine:
    """Decides merges and splits; :meth:`step` returns the new groups or None.

    ``compile(groups)`` must return the program for ``groups`` or raise
    :class:`CompileError` (including when its kernels do not fit the free slots).
    """
    graph: object
    config: object
    groups: list
    compile: object
    threshold: float = 0.02
    overlap_weight: float = 0.25
    max_refusions: int = 2
    rare: float = 0.1            # a merged unit in fewer of the runs than this is split
    min_threshold: float = 0.002
    log: list = field(default_factory=list)
    fused: dict = field(default_factory=dict)        # merged group -> _Fused
    refusions: dict = field(default_factory=dict)    # group -> times split

    def __post_init__(self):
        self.groups = [tuple(g) for g in self.groups]
        # The merges it starts from (the static rules', or the cache's) are split like
        # its own when they run too seldom; never to free a slot, and with nothing
        # measured to compare them with.
        for g in self.groups:
            if len(g) > 1 and g not in self.fused:
                self.fused[g] = _Fused(tuple((n,) for n in g), 0.0, 0.0,
                                       measured=float("inf"))

    # -- scoring --------------------------------------------------------------------
    @staticmethod
    def _idle_per_call(p):
        busy = p.dma_busy + max(p.mac_busy, p.vec_busy)
        return max(p.cycles - busy, 0) / max(p.calls, 1)

    def candidates(self, program, profiler):
        """Every feasible merge of two adjacent units (along the compiler's dependency
        graph between units, ``unit_edges``), scored, best first."""
        profiles = profiler.profiles()
        runs = max(len(profiler.runs), 1)
        succ = profiler.successions()
        n_samples = profiler.window_samples() or 1
        out = []
        for a, b in unit_edges(self.graph, self.config, program.groups):
            group = a + b
            if self.refusions.get(group, 0) >= self.max_refusions:
                continue
            pa, pb = profiles.get("+".join(a)), profiles.get("+".join(b))
            if pa is None or pb is None:
                continue
            try:
                kind = fusion_kind(self.graph, self.config, group)
            except CompileError:
                continue
            co = succ.get(("+".join(a), "+".join(b)), 0) / runs
            bytes_kept = 2 * pa.bytes_out / n_samples
            # kernels ending in a pool make one call per pooled row (as many as the
            # part with fewer calls); the others one call per run
            merged_calls = min(pa.calls, pb.calls) if kind in (
                "conv+pool", "add+pool", "conv+add+pool") else runs
            calls_saved = (pa.calls + pb.calls - merged_calls) / n_samples
            idle = (self._idle_per_call(pa) * pa.calls + self._idle_per_call(pb) * pb.calls) / \
                max(pa.calls + pb.calls, 1)
            if pa.bound != pb.bound:
                mem, comp = (pa, pb) if pa.bound == "memory" else (pb, pa)
                overlap = min(mem.dma_busy, max(comp.mac_busy, comp.vec_busy)) / n_samples
            else:
                overlap = 0.0
            predicted = co * (bytes_kept / self.config.word_bytes + calls_saved * idle +
                              self.overlap_weight * overlap)
            cycles = (pa.cycles + pb.cycles) / n_samples
            out.append(Candidate((a, b), kind, co, bytes_kept, calls_saved, overlap, predicted,
                                 predicted / max(cycles, 1)))
        return sorted(out, key=lambda c: -c.score)

    # -- one decision -------------------------------------------------------------------
    def step(self, program, profiler, run):
        """Look at the window; return new groups (a merge or a split) or None."""
        if not profiler.runs:
            return None                      # nothing measured since the last change
        profiles = profiler.profiles()
        n_samples = profiler.window_samples() or 1
        runs = max(len(profiler.runs), 1)
        per_inf = {name: p.cycles / n_samples for name, p in profiles.items()}

        # Measure what the last merge gained (once, in the first window after it: the
        # cycles of the runs that called it when the runs recorded them, else the
        # unit's own); split what does not pay, or stopped running.
        for group, f in list(self.fused.items()):
            name = "+".join(group)
            reason = None
            run_cycles = profiler.cycles_per_inference({name})
            if f.measured is None and name in profiles:
                if f.run_before is not None and run_cycles is not None:
                    f.measured, now, then = f.run_before - run_cycles, run_cycles, f.run_before
                else:
                    f.measured, now, then = f.before - per_inf[name], per_inf[name], f.before
                if f.measured <= 0:
                    reason = f"slower than its parts ({now:.0f} vs {then:.0f} cycles)"
                if f.predicted > 0:
                    ratio = f.measured / f.predicted
                    self.threshold = max(self.min_threshold, self.threshold * (
                        1.5 if ratio <= 0 else 1.2 if ratio < 0.5 else 0.9))
            seen = sum(1 for r in profiler.runs if any(u == name for u, _ in r.calls))
            if reason is None and seen / runs < self.rare:
                reason = f"ran in {seen} of {runs} runs"
            if reason:
                return self._split(group, reason, run)

        best = next((c for c in self.candidates(program, profiler)
                     if c.score >= self.threshold), None)
        if best is None:
            return None
        new = self._merged(best.parts)
        try:
            self.compile(new)
        except CompileError as e:
            victim = self._least_paying()
            self.log.append({"run": run, "action": "reject", "units": "+".join(best.group),
                             "reason": str(e), "score": best.score})
            if victim is not None and self.fused[victim].measured is not None and \
                    self.fused[victim].measured < best.predicted:
                return self._split(victim, "its slot is wanted by " + "+".join(best.group),
                                   run)
            self.refusions[best.group] = self.max_refusions      # never feasible
            return None
        before = sum(per_inf["+".join(p)] for p in best.parts)
        run_before = profiler.cycles_per_inference({"+".join(p) for p in best.parts})
        inner = {p: self.fused.pop(p) for p in best.parts if p in self.fused}
        self.fused[best.group] = _Fused(best.parts, best.predicted, before, run_before,
                                        inner=inner)
        self.log.append({"run": run, "action": "fuse", "units": "+".join(best.group),
                         "kind": best.kind, "score": round(best.score, 4),
                         "predicted_cycles_saved": round(best.predicted, 1),
                         "threshold": round(self.threshold, 4)})
        self.groups = new
        return new

    def _merged(self, parts):
        a, b = parts
        out = []
        for g in self.groups:
            if g == a:
                out.append(a + b)
            elif g != b:
                out.append(g)
        return out

    def _least_paying(self):
        paid = [(f.measured if f.measured is not None else float("inf"), g)
                for g, f in self.fused.items()]
        return min(paid)[1] if paid else None

    def _split(self, group, reason, run):
        f = self.fused.pop(group)
        self.fused.update(f.inner)          # a part that was a merge is one again
        self.refusions[group] = self.refusions.get(group, 0) + 1
        out = []
        for g in self.groups:
            out.extend(f.parts if g == group else [g])
        self.log.append({"run": run, "action": "defuse", "units": "+".join(group),
                         "reason": reason, "threshold": round(self.threshold, 4)})
        self.groups = out
        return out
