"""Speculation for data-dependent networks (early exits, mixtures of experts).

A graph with a :class:`~fusetile.kernels.graph.Select` runs one sample per plan run
(the choice is made once per run). Its *fallback* plan runs the key's producer, the
decision (a kernel setting a flag or an index register) and a BRANCH or SWITCH to the
chosen path. A *speculative* plan for path ``p`` (``compile_graph(speculate=p)``) runs
the head, the decision and path ``p`` as one kernel inside ``assume`` .. ``commit``,
every intermediate kept in the scratchpad and path ``p``'s weights loaded while the
head computes; the fallback sits in the other plan bank, and a wrong guess rolls back
to it in hardware a few cycles after the decision, with the stale result discarded
(``docs/isa.md``, Speculation). Outputs never change; only cycles do.

Per run the :class:`Speculator`:

1. asks the :class:`Predictor` for a path and its confidence. Two predictors compete
   on the recent outcomes (a tournament, as in branch predictors): *history* (the path
   taken most often in the window) and *data* (the majority path of the nearest
   recent samples: the host has the sample before the tile does);
2. speculates when the confidence is at least the threshold at which a guess pays:
   ``lost / (saved + lost)``, from the cycles a hit saved and a miss lost, measured on
   the tile's counters per path (before they are measured, a prior);
3. installs the plan: kernels into free slots (once), the speculative plan into the
   bank beside the fallback; changing the guess swaps to the fallback, rewrites the
   other bank and swaps back, all while the tile is idle between runs (no tile cycles);
4. after the run, reads the decision (FLAGS or INDEX) and the counters, and learns.

A path whose hits do not save cycles is retired (never guessed) until ``probe`` runs
later, when it is tried again: a shifted input stream gets a new chance.
"""

from collections import Counter, deque
from dataclasses import dataclass, field
import math
import time

import numpy as np

from ..kernels.compiler import CompileError, compile_graph
from ..kernels.graph import Select


__all__ = ["Predictor", "Speculator", "SpeculationStats"]


class Predictor:
    """Predicts which path a data-dependent choice takes for a sample.

    Parameters
    ----------
    paths : int
        Number of paths.
    window : int
        Outcomes the predictors are scored on, and the history predictor counts.
    memory : int
        Recent (sample, path) pairs the data predictor searches.
    k : int
        Neighbours the data predictor polls.
    """

    def __init__(self, paths, *, window=32, memory=256, k=5):
        self.paths, self.k = paths, k
        self.history = deque(maxlen=window)
        self.samples = deque(maxlen=memory)
        self.outcomes = deque(maxlen=memory)
        self.scores = {"history": deque(maxlen=window), "data": deque(maxlen=window)}

    def _history(self):
        if not self.history:
            return 0, 0.0
        path, n = Counter(self.history).most_common(1)[0]
        return path, n / len(self.history)

    def _data(self, x):
        if len(self.samples) < self.k:
            return None, 0.0
        d = np.sum((np.stack(self.samples) - x.astype(np.int32)) ** 2, axis=1)
        near = np.asarray(self.outcomes)[np.argsort(d, kind="stable")[:self.k]]
        path, n = Counter(near.tolist()).most_common(1)[0]
        return path, n / self.k

    def accuracy(self, name):
        s = self.scores[name]
        return sum(s) / len(s) if s else 0.0

    def predict(self, x):
        """``(path, confidence, guesses)`` for int8 sample ``x``: the guess of the
        predictor that was right more often lately (history on a tie), with its own
        confidence; ``guesses`` holds both predictors' paths, for :meth:`learn`."""
        x = np.asarray(x).reshape(-1)
        guesses = {"history": self._history(), "data": self._data(x)}
        best = "data" if guesses["data"][0] is not None and \
            self.accuracy("data") > self.accuracy("history") else "history"
        path, confidence = guesses[best]
        return path, confidence, {name: g[0] for name, g in guesses.items()}

    def learn(self, x, path, guesses):
        for name, guess in guesses.items():
            if guess is not None:
                self.scores[name].append(guess == path)
        self.history.append(path)
        self.samples.append(np.asarray(x, dtype=np.int32).reshape(-1))
        self.outcomes.append(path)


def _counts(values):
    """{str(value): count}, in order of value (JSON keys)."""
    return {str(k): n for k, n in sorted(Counter(values).items())}


class _Mean:
    """A running mean that follows change (exponential, plain for the first ``n``)."""

    def __init__(self, n=16):
        self.n, self.count, self.value = n, 0, None

    def add(self, x):
        self.count += 1
        a = 1 / min(self.count, self.n)
        self.value = x if self.value is None else self.value + a * (x - self.value)


@dataclass
class SpeculationStats:
    """What speculation did, from the tile's counters (``hits``, ``misses``,
    ``rollback_cycles`` total) and the host (predictions)."""
    hits: int = 0
    misses: int = 0
    rollback_cycles: int = 0
    speculated: int = 0
    predictions: int = 0
    correct: int = 0
    log: list = field(default_factory=list)        # decisions: run, action, path, why
    runs: list = field(default_factory=list)       # per run: path, guess, hit, cycles, ...
    paths: list = field(default_factory=list)      # per path: what a guess is worth

    def summary(self):
        """The ``speculation`` object of ``fusetile bench --json``."""
        return {"hits": self.hits, "misses": self.misses, "rollbacks": self.misses,
                "rollback_cycles": self.rollback_cycles / self.misses if self.misses else 0,
                "predictor_accuracy": self.correct / self.predictions
                if self.predictions else 0.0,
                "speculated_runs": self.speculated, "paths": self.paths}

    def windows(self, size=100):
        """Per window of ``size`` inferences: cycles per inference, how often each path
        ran and was guessed, the hit rate of the guesses, each path's threshold at the
        window's end, and the predictor's accuracy."""
        out = []
        for i in range(0, len(self.runs), size):
            w = self.runs[i:i + size]
            spec = [r for r in w if r["guess"] is not None]
            out.append({"first": i, "inferences": len(w),
                        "cycles_per_inference": sum(r["cycles"] for r in w) / len(w),
                        "paths": _counts(r["path"] for r in w),
                        "guesses": _counts(r["guess"] for r in spec),
                        "speculated": len(spec),
                        "hit_rate": sum(r["hit"] for r in spec) / len(spec) if spec else None,
                        "thresholds": [round(t, 3) for t in w[-1]["thresholds"]],
                        "predictor_accuracy": sum(r["predicted"] == r["path"]
                                                  for r in w) / len(w)})
        return out


class Speculator:
    """Runs a graph with one :class:`Select` on a device, speculating per run.

    Parameters
    ----------
    dev : Device
    graph : Graph
    slots : SlotTable
        Where kernels live (shared with the caller, who loaded the fallback).
    fallback : Program
        The unspeculated program (``stable_layout``), loaded and active.
    segment : Segment
        Its segment as loaded (kernels in the slots ``slots`` gave them).
    prior : float
        The threshold before hits and misses have been measured.
    probe : int
        Runs after which a retired path is tried again.
    """

    def __init__(self, dev, graph, slots, fallback, segment, *, prior=0.75, probe=200):
        self.dev, self.graph, self.slots = dev, graph, slots
        self.fallback, self.segment = fallback, segment      # segment: relinked, loaded
        self.select = next(op for op in graph.ops if isinstance(op, Select))
        self.paths = len(self.select.inputs)
        self.predictor = Predictor(self.paths)
        self.prior, self.probe = prior, probe
        self.programs = {}               # path -> its speculative Program
        self.plans = {}                  # path -> the Segment as last installed
        self.compiled = self.kernel_loads = 0
        self.compile_seconds = 0.0
        self.bank_plan = {}              # bank -> None (fallback) or the path it guesses
        self.base = [_Mean() for _ in range(self.paths)]    # fallback cycles, per path
        self.hit = [_Mean() for _ in range(self.paths)]     # cycles of a hit, per guess
        self.miss = [_Mean() for _ in range(self.paths)]    # extra cycles of a miss
        self.gains = [deque(maxlen=16) for _ in range(self.paths)]   # per guess: saved
        self.retired = {}                # path -> run it was retired at
        self.stats = SpeculationStats()
        self.active = int(dev.status().active_bank)
        self.bank_plan[self.active] = None

    # -- the threshold --------------------------------------------------------------------
    def threshold(self, path):
        """The confidence above which guessing ``path`` pays: a guess right with
        probability c saves ``c * saved`` and costs ``(1 - c) * lost``."""
        saved = None if self.hit[path].value is None or self.base[path].value is None \
            else self.base[path].value - self.hit[path].value
        lost = self.miss[path].value
        if saved is None or lost is None:
            return self.prior
        if saved <= 0:
            return 1.0
        return min(1.0, max(0.5, lost / (saved + lost)))

    # -- plans ----------------------------------------------------------------------------
    def _plan(self, path):
        """The speculative plan for ``path``, its kernels in slots (compiled once; its
        kernel loaded again if another guess's took its slot)."""
        if path not in self.programs:
            t = time.perf_counter()
            self.programs[path] = compile_graph(
                self.graph, self.dev.config, groups=self.fallback.groups, stable_layout=True,
                speculate=path)
            self.compile_seconds += time.perf_counter() - t
            self.compiled += 1
        segment, loads = self.slots.place(self.programs[path].segments[0],
                                          set(self.segment.kernels))
        for slot, body in loads.items():
            self.dev.load_kernel(slot, list(body), part=0)
        self.slots.commit(loads)
        self.kernel_loads += len(loads)
        self.plans[path] = segment
        return segment

    def _install(self, guess):
        """Make the plan for ``guess`` (None: the fallback) the active bank, the
        fallback in the other bank when guessing. The tile is idle: swaps are taken at
        once and cost it no cycles."""
        dev = self.dev
        active = int(dev.status().active_bank)
        self.active = active
        if self.bank_plan.get(active, "?") == guess and \
                (guess is None or self.bank_plan.get(1 - active, "?") is None):
            return
        if guess is None:
            dev.request_swap()                 # the other bank holds the fallback
        else:
            if self.bank_plan.get(active) is not None:
                dev.request_swap()             # back to the fallback first
                active = 1 - active
            plan = self._plan(guess)           # (only the fallback's kernels are in use)
            dev.write_plan(1 - active, plan.plan)
            self.bank_plan[1 - active] = guess
            dev.request_swap()
        self.active = 1 - active

    # -- one run --------------------------------------------------------------------------
    def before(self, x, run):
        """Choose and install the plan for sample ``x``; returns the guess (or None)
        and what the predictors said."""
        path, confidence, guesses = self.predictor.predict(x)
        since = self.retired.get(path)
        if since is not None and run - since >= self.probe:
            del self.retired[path]
            self.stats.log.append({"run": run, "action": "probe", "path": path})
        guess = path if path not in self.retired and \
            confidence >= self.threshold(path) else None
        try:
            self._install(guess)
        except CompileError as e:            # no speculative unit for this path: never
            self.retired[path] = math.inf
            self.stats.log.append({"run": run, "action": "retire", "path": path,
                                   "why": str(e)})
            guess = None
            self._install(None)
        return guess, path, guesses

    def after(self, x, run, guess, predicted, guesses, counters):
        """Learn from the run: ``counters`` are the deltas of active_cycles,
        spec_hits, spec_misses, rollback_cycles over it."""
        dev = self.dev
        if self.select.mode == "threshold":
            path = 0 if int(dev.regs.FLAGS.read().flags) & 1 else 1
        else:
            path = int(dev.regs["INDEX[0]"].read().value)
        cycles = counters["active_cycles"]
        hit = bool(counters["spec_hits"])
        if guess is None:
            self.base[path].add(cycles)
        elif hit:
            self.hit[guess].add(cycles)
        elif self.base[path].value is not None:
            self.miss[guess].add(cycles - self.base[path].value)
        if guess is not None and self.base[path].value is not None:
            self.gains[guess].append(self.base[path].value - cycles)
        if guess is not None and guess not in self.retired:
            why = None
            if self.threshold(guess) >= 1.0:
                why = "hits save no cycles"
            elif len(self.gains[guess]) == self.gains[guess].maxlen and \
                    sum(self.gains[guess]) < 0:
                why = (f"its last {len(self.gains[guess])} guesses cost "
                       f"{-sum(self.gains[guess]):.0f} cycles more than they saved")
            if why:
                self.retired[guess] = run
                self.gains[guess].clear()
                self.stats.log.append({"run": run, "action": "retire", "path": guess,
                                       "why": why})
        s = self.stats
        s.hits += counters["spec_hits"]
        s.misses += counters["spec_misses"]
        s.rollback_cycles += counters["rollback_cycles"]
        s.speculated += guess is not None
        s.predictions += 1
        s.correct += predicted == path
        s.runs.append({"path": path, "guess": guess, "predicted": predicted, "hit": hit,
                       "cycles": cycles,
                       "thresholds": [self.threshold(p) for p in range(self.paths)]})
        s.paths = [self.worth(p) for p in range(self.paths)]
        self.predictor.learn(x, path, guesses)
        return path

    def worth(self, path):
        """What guessing ``path`` is worth, as measured: the fallback's cycles when it
        is taken, a hit's cycles, the cycles a miss adds, the threshold."""
        def r(m):
            return None if m.value is None else round(m.value, 1)
        return {"fallback_cycles": r(self.base[path]), "hit_cycles": r(self.hit[path]),
                "lost_per_miss": r(self.miss[path]), "threshold": round(self.threshold(path), 3),
                "retired": path in self.retired}
