"""The profiler: execution profiles of the units of a compiled program, from the
tile's trace FIFO.

The tile pushes one trace record per kernel call (slot, plan PC, cycles, busy cycles of
the DMA engine, the MAC array and the vector unit, bytes in and out; see
``kernels/isa.py: TraceRecord``). After each plan run the profiler drains the FIFO in one
burst (and during a run with more calls than the FIFO holds, whenever a poll finds it
half full), names the unit each record belongs to (``Segment.units[pc]``) and keeps the
runs in a rolling window. From the window it builds, per unit, an :class:`UnitProfile`
(cycles, unit busy, bytes per inference; compute- or memory-bound) and the order in
which units ran (which units follow which, for the fusion engine); and the value ranges
of the tensors the host reads back (:meth:`Profiler.observe`).

Its own cost is measured, not estimated: the bus words it reads
(``Transport.words_read`` around each drain).

A tile without a trace FIFO (``TileConfig.trace_depth`` 0, the iCEBreaker's) gives no
records: the runs then keep their samples and active cycles only, and there are no
unit profiles or successions (the adaptive runner keeps its first plan there).
"""

from collections import Counter, deque
from dataclasses import dataclass, fields

import numpy as np


__all__ = ["UnitProfile", "Run", "Profiler"]


_SUMMED = ("calls", "cycles", "dma_busy", "mac_busy", "vec_busy", "bytes_in", "bytes_out")


@dataclass
class Run:
    """One plan run: the samples it inferred, its calls as (unit, record fields), and
    its active cycles from the tile's counter (None when not read)."""
    samples: int
    calls: list
    cycles: int = None


@dataclass
class UnitProfile:
    """A unit's totals over the profiler's window (``samples`` inferences)."""
    unit: str
    samples: int = 0
    calls: int = 0
    cycles: int = 0
    dma_busy: int = 0
    mac_busy: int = 0
    vec_busy: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def bound(self):
        """``"memory"`` when the DMA engine was busy longer than the compute units,
        else ``"compute"``."""
        return "memory" if self.dma_busy > max(self.mac_busy, self.vec_busy) else "compute"

    def per_inference(self):
        n = max(self.samples, 1)
        out = {f.name: getattr(self, f.name) / n for f in fields(self)
               if f.name in _SUMMED}
        out["bound"] = self.bound
        return out


class Profiler:
    """Collects the trace of every plan run (:func:`fusetile.host.runner.infer` calls
    :meth:`collect`); keeps the last ``window`` runs.

    Attributes
    ----------
    register_reads : int
        Bus words the profiler has read (all runs, not only the window).
    dropped : int
        Trace records the tile dropped because the FIFO was full (a run with more calls
        than the FIFO holds); the profile then covers the calls that were kept.
    """

    def __init__(self, window=64, *, every=8):
        self.runs = deque(maxlen=window)
        self.every = every
        self._polls = 0
        self._pending = []
        self.register_reads = 0
        self.dropped = self._dropped_seen = 0
        self.samples = 0
        self.last_trace = []        # the last run's records, with unit names and starts
        self.ranges = {}            # tensor -> value range seen (see observe)
        self.routes = {}            # Select name -> Counter of the paths it took

    def reset(self, dev):
        """Forget every run and drain records left from before."""
        self.runs.clear()
        self._pending = []
        dev.read_trace()
        self._dropped_seen = dev.trace_dropped()     # the tile's count never clears

    def poll(self, dev):
        """Called while a run is under way (``Device.wait_done(on_poll=...)``): every
        ``every``-th call, drain the FIFO if it is half full, so that a run with more
        calls than the FIFO holds loses none."""
        self._polls += 1
        if self._polls % self.every or not dev.config.traced:
            return
        before = dev.transport.words_read
        if int(dev.regs.TRACE_STATUS.read().level) * 2 >= dev.config.trace_depth:
            self._pending += dev.read_trace()
        self.register_reads += dev.transport.words_read - before

    def collect(self, dev, segment, samples, cycles=None, *, bank=None):
        """Drain the trace after a run of ``segment`` that inferred ``samples`` (in
        ``cycles`` active cycles, if the caller read them). A speculative segment's
        calls in the other bank than ``bank`` (where it ran) are its fallback's."""
        before = dev.transport.words_read
        records = self._pending + dev.read_trace()
        self._pending = []
        dropped = dev.trace_dropped()
        self.register_reads += dev.transport.words_read - before
        self.dropped += dropped - self._dropped_seen
        self._dropped_seen = dropped
        self.samples += samples
        calls = []
        self.last_trace = []
        for r in records:
            pc = int(r.pc)
            units = segment.units if bank is None or int(r.bank) == bank or \
                segment.fallback_units is None else segment.fallback_units
            unit = units[pc] if pc < len(units) else None
            values = {name: int(getattr(r, name)) for name in _SUMMED if name != "calls"}
            calls.append((unit, values))
            self.last_trace.append({"unit": unit, "slot": int(r.slot), "pc": pc,
                                    "start": int(r.start), **values})
        self.runs.append(Run(samples, calls, cycles))

    def profiles(self):
        """{unit: :class:`UnitProfile`} over the window, in the order units ran."""
        out = {}
        for run in self.runs:
            seen = set()
            for unit, values in run.calls:
                p = out.setdefault(unit, UnitProfile(unit))
                if unit not in seen:
                    p.samples += run.samples
                    seen.add(unit)
                p.calls += 1
                for name, value in values.items():
                    setattr(p, name, getattr(p, name) + value)
        return out

    def successions(self):
        """Counter of (unit, the unit that ran next) over the window's runs: how often
        each pair ran back to back."""
        pairs = Counter()
        for run in self.runs:
            units = [u for u, _ in run.calls]
            pairs.update((a, b) for a, b in zip(units, units[1:]) if a != b)
        return pairs

    def route(self, choice, path):
        """Dataflow statistics: data-dependent choice ``choice`` (a Select) took
        ``path`` in one inference; :attr:`routes` counts them per choice and path."""
        self.routes.setdefault(choice, Counter())[path] += 1

    def observe(self, tensor, values):
        """Dataflow statistics: fold int8 ``values`` of ``tensor`` (e.g. the outputs the
        host read back) into its range: {min, max, mean, count, saturated (at -128 or
        127)} in :attr:`ranges`."""
        v = np.asarray(values, dtype=np.int64).reshape(-1)
        if not v.size:
            return
        r = self.ranges.setdefault(tensor, {"min": 127, "max": -128, "sum": 0, "count": 0,
                                            "saturated": 0})
        r["min"], r["max"] = min(r["min"], int(v.min())), max(r["max"], int(v.max()))
        r["sum"] += int(v.sum())
        r["count"] += int(v.size)
        r["saturated"] += int(np.sum((v == -128) | (v == 127)))
        r["mean"] = r["sum"] / r["count"]

    def window_samples(self):
        return sum(run.samples for run in self.runs)

    def cycles_per_inference(self, units=None):
        """Active cycles per inference over the window's runs, from the counter
        (None if the runs did not record them); with ``units`` (names), over the runs
        that called one of them (on a data-dependent network, the runs that took their
        path: what a change to them is measured on, whatever the mix of paths)."""
        runs = [r for r in self.runs if r.cycles is not None and
                (units is None or any(u in units for u, _ in r.calls))]
        return sum(r.cycles for r in runs) / sum(r.samples for r in runs) if runs else None

    def reads_per_inference(self):
        return self.register_reads / max(self.samples, 1)
