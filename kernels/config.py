"""The tile's hardware configuration: one object that the gateware elaborates from,
the host talks through, and the docs are generated from.

The same values are reported by the tile in its HWCFG registers (see
:mod:`fusetile.hdl.regmap`), so a host can read a :class:`TileConfig` back from the
hardware: that read-back is the *hardware profile* caches are keyed on.
"""

from dataclasses import dataclass, fields, asdict
import hashlib
import json


__all__ = ["TileConfig", "MAC_LATENCY", "VECTOR_LATENCY", "REQUANT_LATENCY",
           "COMPACT_VECTOR_LATENCY", "COMPACT_REQUANT_LATENCY", "COMPACT_UNSCALED_LATENCY",
           "CHECK_LATENCY", "COMPACT_CHECK_LATENCY"]


# The units' pipeline depths, which the gateware is built to (hdl/mac_array.py,
# hdl/vector.py) and the golden model's cycles follow (kernels/model.py).

#: Cycles from the MAC array accepting a step to the first cycle ACC includes it.
MAC_LATENCY = 3
#: Cycles from the vector unit taking the word that completes a result to the result,
#: with a lane multiplier per lane (:attr:`TileConfig.vector_latency` in general).
VECTOR_LATENCY = 11
#: Cycles from an ACC row into the requantiser to its int8 row, with a lane
#: multiplier per lane (:attr:`TileConfig.requant_latency` in general).
REQUANT_LATENCY = 7
#: The same two for the vector unit built for area (:attr:`TileConfig.compact`:
#: hdl/vector_compact.py), whose pipeline has only the registers a low clock needs.
COMPACT_VECTOR_LATENCY = 6
COMPACT_REQUANT_LATENCY = 5
#: Cycles from the word completing an unscaled result (VCLAMP, a maximum VPOOL, VCMP,
#: VARGMAX) to the result, in that unit: it does not wait for the scaled path's.
COMPACT_UNSCALED_LATENCY = 2
#: Cycles from the operand check's start to its answer (hdl/operands.py; VPOOL's a cycle
#: more), and the same built for area for an instruction whose operand ends take
#: ``count x stride`` products (MATMUL, REQUANT, VPOOL): those are made a bit of the
#: 16-bit count per cycle, in the fabric, where the deep check has two DSP multipliers.
CHECK_LATENCY = 2
COMPACT_CHECK_LATENCY = 17


def _is_pow2(n):
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True)
class TileConfig:
    """Parameters of one fusetile instance.

    Parameters
    ----------
    rows, cols : int
        MAC array size (R x C int8 multipliers, int32 accumulators).
    word_bytes : int
        Width of a scratchpad / DMA / GMEM word in bytes (a power of two, >= 4).
        The DMA moves one word per cycle; scratchpad and GMEM addresses count words.
    spad_banks : int
        Number of scratchpad banks. Consecutive words are interleaved across banks.
    spad_bank_words : int
        Depth of one scratchpad bank, in words.
    partitions : int
        Entries in the scratchpad partition table.
    kernel_slots : int
        Number of dynamic kernel slots (microcode memories).
    slot_depth : int
        Micro-instructions per kernel slot.
    plan_depth : int
        Plan instructions per plan bank (there are two banks).
    gmem_bytes : int
        Size of the global memory, in bytes (a multiple of ``word_bytes``).
    trace_depth : int
        Records the trace FIFO holds (a power of two), or 0 for a tile without a trace
        FIFO (:attr:`traced`): neither the FIFO nor the control unit's per-call
        statistics are built, the TRACE registers are not in the register map, and
        the host profiles whole runs from the counters alone. The iCEBreaker's choice
        (about 1,000 of its logic cells).
    staging_words : int
        Words of GMEM stores a speculative region can hold until COMMIT publishes them
        (a power of two); a region that stores more is rolled back. 0: a tile without
        speculation (:attr:`speculates`): no staging buffer, ASSUME and COMMIT are
        illegal plan instructions, and the host runs data-dependent networks on their
        unspeculated plans. The iCEBreaker's choice (about 300 of its logic cells):
        the shipped data-dependent workloads need 11 and 21 kernel slots, and it has 4.
    dma_queue : int
        DMA commands a kernel can queue ahead of the engine (a power of two). With 1,
        the queue is a single register: a command waits there while the engine works
        on the one before, and the next push waits until the engine has taken it.
        With 0 (the iCEBreaker's), there is no queue: a DMA instruction waits until
        the engine is idle, which takes its command as it is pushed (a transfer then
        starts a cycle sooner, and a kernel that pushes a second one while the first
        moves waits). The digits workloads run 0.2 % faster so (their kernels rarely
        push a transfer while one moves), and the queue's register, 85 logic cells,
        is not built.
    slot_counters : bool
        Whether per-slot call and cycle counters are built.
    branch_counters : bool
        Whether per-flag BRANCH counters (taken, not taken) are built.
    bank_counters : bool
        Whether per-bank scratchpad counters (reads, writes) are built. Each of these
        three sets of counters is left out on the small boards; the host reads from
        HWCFG which the tile has.
    decisions : bool
        Whether VCMP and VARGMAX are built: the instructions that set the flags and
        index registers a plan branches on (BRANCH, SWITCH, ASSUME). Without them
        both are ILLEGAL_MICRO, the flags and index registers stay 0, and the
        compiler refuses a data-dependent network (its Select). The iCEBreaker's
        choice (about 500 of its LUTs): the shipped data-dependent workloads need 11
        and 21 kernel slots, and it has 4. (The units leave out what serves only the
        instructions not built; of the vector units, the one built for area.)
    pool_average : bool
        Whether VPOOL averages (``average``), its sums scaled by the lane
        multipliers; without it a VPOOL with ``average`` is ILLEGAL_MICRO and VPOOL
        takes maxima only. The compiler never asks for it (an AvgPool is a
        convolution, exact in ACC), and on the iCEBreaker it was about 450 LUTs:
        the sums widened the multipliers' operands.
    word_ops : bool
        Whether VADD, VPOOL and VCLAMP are built: the vector unit's operations on
        streams of words (a network's Add, MaxPool and Clamp). Without them the three
        are ILLEGAL_MICRO and the compiler refuses those nodes; a dense network (Gemm:
        MATMUL, ACC_BIAS and REQUANT, whose clamp is a ReLU's) needs none of them. The
        iCEBreaker's choice (about 1,200 of its logic cells: the vector unit's word
        path and second lane multiplier's operands, the compute unit's window walk,
        the operand check's formats); ``pool_average`` means nothing without them.
    watchdog : bool
        Whether the control unit has a watchdog (the ``WATCHDOG`` register, and a
        plan run's cycle count compared with it). Without it the register is not in
        the map (its address answers a bus error) and a plan that runs too long runs
        until the host stops it: ``CTRL.abort``, after ``Device.wait_done``'s
        timeout. The iCEBreaker's choice (about 200 of its logic cells).
    debug_regs : bool
        Whether the tile has the ``MARK`` and ``REFUSED_ADDR`` registers and the
        counters of ``regmap.DEBUG_COUNTERS``, which only a person debugging reads: a
        plan's progress marker (``mark V`` writes V there), the byte address of the
        last refused bus write (the host's transport has the refused write's ERR,
        with its address), and the counts of retired instructions, swaps, faults,
        refused writes and saturated lanes. Without them none is in the map (their
        addresses answer a bus error) and ``mark`` is a NOP (in the same cycles).
        The iCEBreaker's choice (about 230 of its logic cells).
    slot_versions : bool
        Whether each kernel slot keeps the host's 16-bit version tag
        (``SLOT[i].version``), which only the host reads: without it the field is not
        in the register map and the slot table has no place for it. The iCEBreaker's
        choice (about 140 of its logic cells): the runtime writes 0.
    vector_lanes : int or None
        Lanes the vector unit scales per cycle: its lane multipliers and requantiser
        (a power of two, at most ``word_bytes``). ``None`` (and ``word_bytes``, which
        is stored as None): a word or an ACC row per cycle. With fewer, the
        multipliers and the rounding and clamp after them are built for
        ``vector_lanes`` lanes, and a row or a scaled word (REQUANT, VADD, VPOOL
        average) takes :attr:`vector_passes` cycles of them: the small boards'
        choice.
    compact : bool
        Whether the units are built for area rather than for a fast clock: pipelines
        with only the registers a small FPGA's low clock needs, with cycle counts of
        their own (:attr:`vector_latency`, :attr:`unscaled_latency`,
        :attr:`requant_latency`, :meth:`check_latency`), which the golden model
        follows. So far the vector unit
        (:class:`fusetile.hdl.vector_compact.CompactVectorAlu`), the operand check,
        the counters, the DMA engine, the instruction stores' host reads and writes,
        the compute command, the scratchpad's partition tests, the CSR bank's reads,
        the plan decode's SWITCH, the trace FIFO's writes and the staging buffer's
        drain have such a build, and the compute unit's leaves its partition test to
        the operand check; the small boards' choice.

    Raises
    ------
    TypeError
        If a parameter has the wrong type.
    ValueError
        If a parameter is out of range.
    """

    rows: int = 8
    cols: int = 8
    word_bytes: int = 8
    spad_banks: int = 4
    spad_bank_words: int = 512
    partitions: int = 8
    kernel_slots: int = 16
    slot_depth: int = 256
    plan_depth: int = 128
    gmem_bytes: int = 64 * 1024
    trace_depth: int = 32
    staging_words: int = 64
    dma_queue: int = 4
    slot_counters: bool = True
    vector_lanes: int | None = None
    branch_counters: bool = True
    bank_counters: bool = True
    compact: bool = False
    decisions: bool = True
    pool_average: bool = True
    slot_versions: bool = True
    word_ops: bool = True
    watchdog: bool = True
    debug_regs: bool = True

    # Parts that are built or not, and how.
    _SWITCHES = ("slot_counters", "branch_counters", "bank_counters", "compact",
                 "decisions", "pool_average", "slot_versions", "word_ops", "watchdog",
                 "debug_regs")

    # Upper bounds follow from the HWCFG field widths and the memory map.
    _LIMITS = {
        "rows": (1, 64), "cols": (1, 64), "word_bytes": (4, 64),
        "spad_banks": (1, 64), "spad_bank_words": (1, 0xFFFF),
        "partitions": (1, 16), "kernel_slots": (1, 16),
        "slot_depth": (2, 1024), "plan_depth": (2, 2048),
        "gmem_bytes": (4, 1 << 20), "trace_depth": (0, 256),
        "staging_words": (0, 1024), "dma_queue": (0, 16), "vector_lanes": (1, 64),
    }

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in self._SWITCHES:
                if not isinstance(value, bool):
                    raise TypeError(f"{f.name} must be a bool, not {value!r}")
                continue
            if f.name == "vector_lanes" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{f.name} must be an integer, not {value!r}")
            lo, hi = self._LIMITS[f.name]
            if not lo <= value <= hi:
                raise ValueError(f"{f.name} must be between {lo} and {hi}, not {value!r}")
        for name in ("word_bytes", "trace_depth", "slot_depth", "plan_depth", "staging_words",
                     "dma_queue", "vector_lanes"):
            value = getattr(self, name)
            if name in ("trace_depth", "staging_words", "dma_queue") and value == 0:
                continue
            if value is not None and not _is_pow2(value):
                raise ValueError(f"{name} must be a power of two, not {value!r}")
        if self.trace_depth == 1:
            raise ValueError("trace_depth must be 0 (no trace FIFO) or at least 2, not 1")
        if self.staging_words == 1:
            raise ValueError("staging_words must be 0 (no speculation) or at least 2, not 1")
        if self.spad_words > 0xFFFF:
            raise ValueError(f"spad_banks * spad_bank_words must be at most 65535 words, "
                             f"not {self.spad_words!r}")
        if self.vector_lanes is not None and self.vector_lanes > self.word_bytes:
            raise ValueError(f"vector_lanes must be at most word_bytes ({self.word_bytes}), "
                             f"not {self.vector_lanes!r}")
        if self.vector_lanes == self.word_bytes:
            # One configuration, one profile: a lane per byte is the default.
            object.__setattr__(self, "vector_lanes", None)
        if self.gmem_bytes % self.word_bytes:
            raise ValueError(f"gmem_bytes must be a multiple of word_bytes ({self.word_bytes}), "
                             f"not {self.gmem_bytes!r}")

    @property
    def spad_words(self):
        """Scratchpad size in words, over all banks."""
        return self.spad_banks * self.spad_bank_words

    @property
    def spad_bytes(self):
        return self.spad_words * self.word_bytes

    @property
    def gmem_words(self):
        """GMEM size in words."""
        return self.gmem_bytes // self.word_bytes

    @property
    def word_bits(self):
        return self.word_bytes * 8

    @property
    def traced(self):
        """Whether the tile has a trace FIFO (:attr:`trace_depth` not 0)."""
        return self.trace_depth > 0

    @property
    def speculates(self):
        """Whether the tile runs speculative regions (:attr:`staging_words` not 0)."""
        return self.staging_words > 0

    @property
    def scaler_lanes(self):
        """Lanes the vector unit scales per cycle (:attr:`vector_lanes`, or all of a
        word's)."""
        return self.word_bytes if self.vector_lanes is None else self.vector_lanes

    @property
    def vector_passes(self):
        """Cycles the vector unit's multipliers take per row or scaled word."""
        return self.word_bytes // self.scaler_lanes

    @property
    def vector_latency(self):
        """Cycles from the vector unit taking the word that completes a result to the
        result: a scaled word's last group comes :attr:`vector_passes` - 1 cycles
        after its first."""
        base = COMPACT_VECTOR_LATENCY if self.compact else VECTOR_LATENCY
        return base + self.vector_passes - 1

    @property
    def unscaled_latency(self):
        """Cycles from the vector unit taking the word that completes an unscaled
        result (VCLAMP, a maximum VPOOL, VCMP, VARGMAX) to the result: as a scaled
        one's (:attr:`vector_latency`), or sooner on a :attr:`compact` tile."""
        return COMPACT_UNSCALED_LATENCY if self.compact else self.vector_latency

    @property
    def requant_latency(self):
        """Cycles from an ACC row into the requantiser to its int8 row."""
        base = COMPACT_REQUANT_LATENCY if self.compact else REQUANT_LATENCY
        return base + self.vector_passes - 1

    def check_latency(self, strided):
        """Cycles from the operand check's start to its answer for a compute
        micro-instruction with (``strided``: MATMUL, REQUANT, VPOOL) or without
        ``count x stride`` products in its operand ends; VPOOL's a cycle more."""
        return COMPACT_CHECK_LATENCY if self.compact and strided else CHECK_LATENCY

    def as_dict(self):
        return asdict(self)

    def as_built(self):
        """:meth:`as_dict` with what the hardware has for a default (``vector_lanes``
        None: the number of lanes it stands for): for people and firmware."""
        return {**self.as_dict(), "vector_lanes": self.scaler_lanes}

    @property
    def profile_hash(self):
        """A short stable hash of the configuration: the hardware profile key."""
        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @classmethod
    def from_dict(cls, values):
        return cls(**values)
