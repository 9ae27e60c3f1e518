"""The kernel cache and hardware profile database (SQLite).

What the adaptive runtime compiles and measures, kept across runs:

``programs``
    Compiled programs (kernels, plan, buffers) of a graph for one grouping of its ops,
    keyed by (canonical graph hash, hardware profile hash, groups). A warm start takes
    its programs from here: no JIT compile.
``units``
    The measured profile of every unit (cycles, busy cycles, bytes per inference),
    keyed by (canonical hash of the unit's ops, including weights and quantisation
    parameters, hardware profile hash): the hardware profile database.
``plans``
    Per (graph, hardware profile): the grouping the adaptive runtime last settled on,
    its cycles per inference, and the groups it found do not pay (never tried again).

Keys always include the hardware profile hash (``TileConfig.profile_hash``, the one
``ID``/``HWCFG`` report), so a different tile never gets a stale hit; compiled programs
also the fingerprint of the compiler that made them (:data:`COMPILER`, a hash of the
``kernels`` package's sources), so a newer fusetile recompiles rather than run an older
compiler's kernels. The canonical hashes ignore op and tensor names (tensors are
numbered in order of appearance), so renaming nothing changes nothing.

A database that cannot be opened or used (corrupt, locked, unwritable) is reported once
(:attr:`KernelCache.error`, a warning) and the cache turns itself off; the run goes on
without it and loses no result.
"""

from dataclasses import asdict, fields, is_dataclass
import hashlib
import json
from pathlib import Path
import sqlite3
import warnings

import numpy as np

from .. import kernels
from ..kernels.compiler import Buffer, Program, Segment, Tiling


__all__ = ["KernelCache", "COMPILER", "graph_hash", "unit_hash"]


#: The compiler's fingerprint: any change to the ISA, the assembler or the compiler
#: gives compiled programs another key.
COMPILER = hashlib.sha256(b"".join(
    p.read_bytes() for p in sorted(Path(kernels.__file__).parent.glob("*.py")))).hexdigest()[:16]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS programs (graph TEXT, profile TEXT, groups TEXT, data TEXT,
                                     PRIMARY KEY (graph, profile, groups));
CREATE TABLE IF NOT EXISTS units (unit TEXT, profile TEXT, name TEXT, data TEXT,
                                  PRIMARY KEY (unit, profile));
CREATE TABLE IF NOT EXISTS plans (graph TEXT, profile TEXT, groups TEXT, cycles REAL,
                                  refused TEXT, PRIMARY KEY (graph, profile));
CREATE TABLE IF NOT EXISTS images (graph TEXT, profile TEXT, gmem BLOB,
                                   PRIMARY KEY (graph, profile));
"""


def _canonical(value, names):
    """A stable, name-free text form of an op field."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype.str}{value.shape}:{hashlib.sha256(value.tobytes()).hexdigest()}"
    if is_dataclass(value):
        return "(" + ",".join(_canonical(getattr(value, f.name), names)
                              for f in fields(value) if f.name != "name") + ")"
    if isinstance(value, str):
        return names.setdefault(value, f"t{len(names)}")
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_canonical(v, names) for v in value) + "]"
    return repr(value)


def _hash_ops(graph, ops, ends=()):
    """sha256 of ``ops`` in a name-free form (tensors numbered in order of appearance),
    with the shapes and quantisation of their tensors; ``ends`` (the graph's input and
    output) are named by their numbers too."""
    names = {}
    text = [type(op).__name__ + _canonical(op, names) for op in ops]
    text.append("ends" + _canonical(list(ends), names))
    for name, token in sorted(names.items(), key=lambda kv: int(kv[1][1:])):
        t = graph.tensors.get(name)
        if t is not None:
            text.append(f"{token}:{tuple(t.shape)}:{t.scale!r}:{t.zero_point}")
    return hashlib.sha256("\n".join(text).encode()).hexdigest()


def graph_hash(graph):
    """Canonical hash of a whole graph (ops, weights, quantisation, shapes, which
    tensors are its input and output)."""
    return _hash_ops(graph, graph.ops, (graph.input, graph.output))


def unit_hash(graph, group):
    """Canonical hash of the ops of one unit (tuple of op names)."""
    by_name = {op.name: op for op in graph.ops}
    return _hash_ops(graph, [by_name[n] for n in group])


def _groups_key(groups):
    return json.dumps([list(g) for g in groups])


def _program_to_json(program):
    return json.dumps({
        "policy": program.policy,
        "segments": [{"kernels": {str(s): [int(i) for i in k] for s, k in seg.kernels.items()},
                      "plan": [int(i) for i in seg.plan], "units": seg.units}
                     for seg in program.segments],
        "input": asdict(program.input), "output": asdict(program.output),
        "partition": list(program.partition), "lanes": program.lanes,
        "calls": program.calls, "groups": [list(g) for g in program.groups],
        "tilings": {k: asdict(v) for k, v in program.tilings.items()},
        "constant_words": program.constant_words,
        "constant_loads": sorted(int(i) for i in program.constant_loads),
    })


def _buffer(d):
    return Buffer(d["name"], tuple(d["shape"]), d["at"], tuple(d["ring"]), d["pad_value"])


def _program_from_json(text, graph, config, gmem):
    d = json.loads(text)
    segments = [Segment({int(s): k for s, k in seg["kernels"].items()}, seg["plan"],
                        seg["units"]) for seg in d["segments"]]
    return Program(config, graph, d["policy"], segments, gmem, _buffer(d["input"]),
                   _buffer(d["output"]), tuple(d["partition"]), d["lanes"], d["calls"],
                   {k: Tiling(**v) for k, v in d["tilings"].items()},
                   [tuple(g) for g in d["groups"]], d["constant_words"],
                   constant_loads=frozenset(d["constant_loads"]))


class KernelCache:
    """The SQLite kernel cache at ``path`` (``":memory:"`` for a private one)."""

    def __init__(self, path):
        self.path = str(path)
        self.error = None
        self.hits = self.misses = 0
        try:
            self.db = sqlite3.connect(self.path, timeout=0.2)
            self.db.executescript(_SCHEMA)
            self.db.commit()
        except sqlite3.Error as e:
            self.db = None
            self._fail(e)

    def _fail(self, e):
        self.error = f"kernel cache {self.path}: {e}; running without it"
        warnings.warn(self.error, RuntimeWarning, stacklevel=3)
        if self.db is not None:
            try:
                self.db.close()
            except sqlite3.Error:
                pass
        self.db = None

    def _query(self, sql, args=(), *, write=False):
        if self.db is None:
            return []
        try:
            rows = self.db.execute(sql, args).fetchall()
            if write:
                self.db.commit()
            return rows
        except sqlite3.Error as e:
            self._fail(e)
            return []

    @property
    def enabled(self):
        return self.db is not None

    def close(self):
        if self.db is not None:
            self.db.close()
            self.db = None

    # -- programs -----------------------------------------------------------------------
    @staticmethod
    def _program_key(graph, config):
        return graph_hash(graph), f"{config.profile_hash}/{COMPILER}"

    def program(self, graph, config, groups):
        """The cached program of ``graph`` with ``groups`` for ``config``, or None."""
        key = self._program_key(graph, config)
        rows = self._query("SELECT data FROM programs WHERE graph=? AND profile=? AND groups=?",
                           key + (_groups_key(groups),))
        image = self._query("SELECT gmem FROM images WHERE graph=? AND profile=?", key)
        if not rows or not image:
            self.misses += 1
            return None
        try:
            program = _program_from_json(rows[0][0], graph, config, bytes(image[0][0]))
        except (KeyError, TypeError, ValueError) as e:
            self._fail(e)
            return None
        self.hits += 1
        return program

    def store_program(self, graph, config, groups, program):
        """Store a program compiled with ``stable_layout`` (all of a graph's share one
        GMEM image, stored once)."""
        key = self._program_key(graph, config)
        self._query("INSERT OR IGNORE INTO images VALUES (?, ?, ?)", key + (program.gmem,),
                    write=True)
        self._query("INSERT OR REPLACE INTO programs VALUES (?, ?, ?, ?)",
                    key + (_groups_key(groups), _program_to_json(program)), write=True)

    # -- measurements -------------------------------------------------------------------
    def record(self, graph, config, groups, profiler, engine):
        """Store the units' measured profiles and the grouping the runtime settled on."""
        profiles = profiler.profiles()
        samples = profiler.window_samples()
        if not profiles or not samples:
            return
        for group in groups:
            p = profiles.get("+".join(group))
            if p is None:
                continue
            self._query("INSERT OR REPLACE INTO units VALUES (?, ?, ?, ?)",
                        (unit_hash(graph, group), config.profile_hash, "+".join(group),
                         json.dumps(p.per_inference())), write=True)
        cycles = sum(p.cycles for p in profiles.values()) / samples
        refused = [list(g) for g, n in engine.refusions.items() if n >= engine.max_refusions]
        self._query("INSERT OR REPLACE INTO plans VALUES (?, ?, ?, ?, ?)",
                    (graph_hash(graph), config.profile_hash, _groups_key(groups), cycles,
                     json.dumps(refused)), write=True)

    def best_groups(self, graph, config):
        rows = self._query("SELECT groups FROM plans WHERE graph=? AND profile=?",
                           (graph_hash(graph), config.profile_hash))
        return [tuple(g) for g in json.loads(rows[0][0])] if rows else None

    def refused(self, graph, config):
        rows = self._query("SELECT refused FROM plans WHERE graph=? AND profile=?",
                           (graph_hash(graph), config.profile_hash))
        return {tuple(g): 10**6 for g in json.loads(rows[0][0])} if rows else {}

    def unit_profile(self, graph, config, group):
        rows = self._query("SELECT data FROM units WHERE unit=? AND profile=?",
                           (unit_hash(graph, group), config.profile_hash))
        return json.loads(rows[0][0]) if rows else None
