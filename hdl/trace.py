"""The trace FIFO: one record per kernel call, drained by the host in bursts."""

from amaranth.hdl import Array, Cat, Const as C, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..kernels.isa import TraceRecord
from .regmap import TRACE_WORDS


__all__ = ["TraceFifo", "TRACE_WORDS"]


_RECORD_BITS = TraceRecord.as_shape().size

#: The control unit pushes at most one record every this many cycles: a push is a RET
#: or a call cut short, and the next call's RET or cut is at least a plan fetch, its
#: CALL and a micro fetch later (``hdl/control.py``).
PUSH_SPACING = 3


class TraceFifo(wiring.Component):
    """A FIFO of :class:`TraceRecord` read 32 bits at a time.

    The host reads ``data`` repeatedly from one address (TRACE_DATA); each read
    advances to the record's next word, and reading the last word pops the record, so
    a non-incrementing burst of ``level * TRACE_WORDS`` reads drains the FIFO. A record
    pushed while the FIFO is full is dropped and counted: tracing never stalls the tile.

    A pushed record is held in a register and written from the cycle after ``push``
    (so that the control unit's decision to push and the FIFO's pointers are separate
    paths); a ``clear`` in the cycle of the push drops it, as if the write had been
    immediate. It is in ``level`` from that cycle.

    The memory is ``width`` bits wide: a record is ``256 / width`` *beats*, written one
    per cycle. A block RAM is a fixed number of bits wide (16 on an iCE40), so a
    record written whole takes as many block RAMs as its width needs whatever the
    depth (16 on an iCE40, for 16 records that would fit in one), and a narrow one
    takes ``256 / width`` times fewer. The host cannot overtake the writer: the word
    it reads next is never in a beat written later than two cycles before it is
    sampled (``data`` is registered).

    The control unit pushes a record at most every :data:`PUSH_SPACING` cycles, and
    at most every four between calls that return (a RET, the plan fetch, its CALL, a
    micro fetch, RET again). So four beats a record keep up. The register that holds
    a record is free again once all but its last beat are written (the last one waits
    in a register of its own and is written next), so a record can come while the
    last beat of the one before is still to write (a call cut short at its first
    fetch); the new record then starts a cycle later. A record that comes while two
    beats of the one before are still to write is dropped and counted like one that
    finds the FIFO full. With four beats that takes two calls cut short at their first
    fetch (a speculative region's miss, then a fault that stops the tile) with nothing
    but one-instruction kernels between them: the dropped record is the one of the
    call that stopped the tile, which ``FAULT`` and ``FAULT_PC`` describe.

    Built for area (``compact``), the FIFO keeps no copy of a whole record: the
    control unit built so holds a record's statistics (all but its first 64 bits)
    still for the two cycles after the push, and the FIFO writes the first beat in
    the cycle of the push and the middle ones from ``record`` in the next two cycles,
    keeping only the last beat (and, for a record that comes while that beat of the
    one before is still to write, the first too, written after the middle ones).
    ``level`` counts a record, and ``dropped`` a record dropped, as above, with one
    exception: a record that starts late is in ``level`` three cycles later than a
    first beat written in time would be. On the iCEBreaker's build that left out 196
    of the FIFO's 462 flip-flops (docs/fpga-timing.md, step 58).

    Parameters
    ----------
    depth : int
        Records held (a power of two).
    width : int
        Bits of the memory: 256 (a record per word), 128 or 64.
    compact : bool
        Write the middle beats from ``record``, whose bits past the first 64 hold
        still for the two cycles after the push, rather than from a copy.

    Attributes
    ----------
    push : In(1)
        Append ``record`` (written from the next cycle, or from this one if
        ``compact``).
    record : In(TraceRecord)
    read : In(1)
        The host read ``data`` this cycle: advance.
    data : Out(32)
        The current word of the head record (0 when empty), registered: it follows a
        ``read`` (and a record's first beat) two cycles later. The CSR bank samples the
        next word three cycles after a read's strobe at the soonest (it strobes ``read``
        two cycles after sampling and samples the next access's value five cycles after
        the last's). From the block RAM through its bypass and the word selection
        straight into the CSR bank's read groups was 11.05 ns of step 36's best ULX3S
        build (docs/fpga-timing.md).
    level : Out(16)
        Records held.
    dropped : Out(16)
        Records dropped because the FIFO was full (saturating).
    clear : In(1)
        Empty the FIFO and zero ``dropped``.
    """

    push: In(1)
    record: In(TraceRecord)
    read: In(1)
    data: Out(32)
    level: Out(16)
    dropped: Out(16)
    clear: In(1)

    WIDTHS = (256, 128, 64)

    def __init__(self, depth, *, width=256, compact=False):
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth must be a power of two >= 2, not {depth!r}")
        if width not in self.WIDTHS:
            raise ValueError(f"width must be one of {', '.join(map(str, self.WIDTHS))}, "
                             f"not {width!r}")
        self.depth = depth
        self.width = width
        self.compact = compact
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        beats = _RECORD_BITS // self.width
        beat_bits = (beats - 1).bit_length()               # a beat's address bits
        word_beats = self.width // 32                      # record words per beat
        ptr_bits = self.depth.bit_length() - 1
        m.submodules.mem = mem = Memory(shape=self.width, depth=self.depth * beats, init=[])
        wr = mem.write_port()
        # Built for area, the read port is not transparent: on the UP5K its emulation
        # (a copy of each written word, and a choice between it and the block RAM's
        # output) took about 130 logic cells. No word read in the cycle it is written
        # is used: a record is counted in `level` from the second cycle after its first
        # beat is written (`data` reads 0 while the FIFO is empty), its other beats are
        # all written by the cycle after that, and the host reads the two words of the
        # first beat before it reads another (three cycles apart at the soonest, above).
        rd = mem.read_port(transparent_for=() if self.compact else (wr,))

        def address(record, b):
            """Record ``record``'s beat ``b``: the beats of a record are consecutive."""
            return Cat(b[:beat_bits], record) if beat_bits else record

        head = Signal(ptr_bits)
        tail = Signal(ptr_bits)
        count = Signal(range(self.depth + 1))
        word = Signal(range(TRACE_WORDS))

        empty = count == 0
        full = count == self.depth
        advance = self.read & ~empty
        pop = advance & (word == TRACE_WORDS - 1)
        next_word = Signal.like(word)
        m.d.comb += [
            next_word.eq(Mux(advance, Mux(word == TRACE_WORDS - 1, 0, word + 1), word)),
            # The beat of the word after this one when the host reads, so that it is
            # ready a cycle later (the record after the head when popping).
            rd.addr.eq(address(head + pop, next_word >> (word_beats.bit_length() - 1))),
            self.level.eq(count),
        ]
        words = Array(rd.data[32 * i:32 * (i + 1)] for i in range(word_beats))
        m.d.sync += self.data.eq(words[word % word_beats] & ~empty.replicate(32))

        writer = self._compact_writer if self.compact else self._writer
        taken, counted, lost, resets = writer(m, wr, address, beats, beat_bits, ptr_bits, tail,
                                              count, full, pop)
        with m.If(self.clear):
            m.d.sync += [head.eq(0), tail.eq(0), count.eq(0), word.eq(0), self.dropped.eq(0),
                         *(r.eq(0) for r in resets)]
        with m.Else():
            m.d.sync += [
                tail.eq(tail + taken),
                head.eq(head + pop),
                count.eq(count + counted - pop),
                word.eq(next_word),
            ]
            with m.If(lost & (self.dropped != 0xFFFF)):
                m.d.sync += self.dropped.eq(self.dropped + 1)
        return m

    def _writer(self, m, wr, address, beats, beat_bits, ptr_bits, tail, count, full, pop):
        """The writes of the records pushed, from a copy of each (:class:`TraceFifo`).

        Returns ``(taken, counted, lost, resets)``: whether a record takes the slot at
        ``tail`` in this cycle, whether one is counted in ``level`` (its first beat
        was written a cycle before), whether one is dropped, and the registers a
        ``clear`` zeroes."""
        # The record being written: `pending` until its first beat is, then `beat` is
        # the next beat of record `at` (while `writing`). A record's last beat moves to
        # `spare` in the cycle that writes the one before it, and is written from there.
        held = Signal(_RECORD_BITS)
        held_beats = Array(held[self.width * b:self.width * (b + 1)] for b in range(beats))
        pending = Signal()
        writing = Signal()
        beat = Signal(range(beats))
        at = Signal(ptr_bits)
        spare = Signal(self.width)
        spare_at = Signal(ptr_bits)
        spare_valid = Signal()

        # `held` takes the record in every cycle it is free, so that its enable comes
        # from registers: the decision to push, late in the cycle, only sets `pending`.
        # (Taken on `push`, the enable of 256 flip-flops was the ULX3S build's worst
        # path.) A push while it is not free is the one dropped.
        free = Signal()
        if beats == 1:
            m.d.comb += free.eq(1)              # written whole the cycle after
        else:
            m.d.comb += free.eq(~pending & ~(writing & (beat < beats - 2)))
        with m.If(free):
            m.d.sync += held.eq(self.record)

        def to_spare(record):
            m.d.sync += [spare.eq(held_beats[beats - 1]), spare_at.eq(record),
                         spare_valid.eq(1)]

        begin = Signal()
        with m.If(spare_valid):
            m.d.comb += [wr.addr.eq(address(spare_at, C(beats - 1, beat_bits))),
                         wr.data.eq(spare), wr.en.eq(1)]
            m.d.sync += spare_valid.eq(0)
        with m.Elif(writing):
            m.d.comb += [wr.addr.eq(address(at, beat)), wr.data.eq(held_beats[beat]),
                         wr.en.eq(1)]
            m.d.sync += beat.eq(beat + 1)
            with m.If(beat == beats - 2):
                m.d.sync += writing.eq(0)
                to_spare(at)
        with m.Elif(pending):
            m.d.comb += begin.eq(1)
            m.d.sync += pending.eq(0)
        do_push = begin & ~full
        with m.If(do_push):
            m.d.comb += [wr.addr.eq(address(tail, C(0, beat_bits))),
                         wr.data.eq(held_beats[0]), wr.en.eq(1)]
            m.d.sync += at.eq(tail)
            if beats == 2:
                to_spare(tail)
            elif beats > 2:
                m.d.sync += [writing.eq(1), beat.eq(1)]

        rejected = Signal()
        with m.If(self.push):
            with m.If(free):
                m.d.sync += pending.eq(1)
            with m.Else():
                m.d.comb += rejected.eq(1)
        return do_push, do_push, (begin & full) | rejected, (pending, writing, spare_valid)

    def _compact_writer(self, m, wr, address, beats, beat_bits, ptr_bits, tail, count, full,
                        pop):
        """The writes of the records pushed, from the record itself (``compact``):
        :meth:`_writer`'s results.

        The record's bits past the first 64 hold still for the two cycles after its
        push (the control unit built for area keeps its statistics), so its first beat
        is written in the cycle of the push, the middle ones in the next two cycles
        from the record, and only its last beat is copied, for the cycle after those
        (with 64-bit beats; with 128, the first and the copied last). A record that
        comes while the last
        beat of the one before is still to write (a call cut short at its first fetch)
        has its first beat copied as well, and written after its middle beats; it is
        counted in ``level`` a cycle after its first beat is written, as every record
        is. One that comes while two beats are still to write is dropped. (``full``
        is not read: a record's slot is reserved from its push, before it is counted.)"""
        beat_of = [self.record.as_value()[self.width * b:self.width * (b + 1)]
                   for b in range(beats)]
        at = Signal(ptr_bits)                   # the record of `live` and `first`
        live = Signal(range(beats))             # its beat written from the record (0: none)
        first = Signal(self.width, reset_less=True)
        first_valid = Signal()
        spare = Signal(self.width, reset_less=True)
        spare_at = Signal(ptr_bits)
        spare_valid = Signal()
        written = Signal()                      # a record's first beat is written
        counted = Signal()

        # Taken in the cycle of the push: the slots reserved are the records counted,
        # the one counted next and the one whose first beat waits (never both).
        reserved = count + (counted | first_valid)
        taken = Signal()
        m.d.comb += taken.eq(self.push & ((reserved != self.depth) | pop)
                             & (live == 0) & ~first_valid)

        with m.If(live != 0):
            m.d.comb += [wr.addr.eq(address(at, live)), wr.data.eq(Array(beat_of)[live]),
                         wr.en.eq(1)]
            m.d.sync += live.eq(Mux(live == beats - 2, 0, live + 1))
        with m.Elif(first_valid):
            m.d.comb += [wr.addr.eq(address(at, C(0, beat_bits))), wr.data.eq(first),
                         wr.en.eq(1), written.eq(1)]
            m.d.sync += first_valid.eq(0)
        with m.Elif(spare_valid):
            m.d.comb += [wr.addr.eq(address(spare_at, C(beats - 1, beat_bits))),
                         wr.data.eq(spare), wr.en.eq(1)]
            m.d.sync += spare_valid.eq(0)
        with m.Elif(taken):
            m.d.comb += [wr.addr.eq(address(tail, C(0, beat_bits))), wr.data.eq(beat_of[0]),
                         wr.en.eq(1), written.eq(1)]
        with m.If(taken):
            m.d.sync += at.eq(tail)
            if beats > 2:
                m.d.sync += live.eq(1)
            if beats > 1:
                m.d.sync += [spare.eq(beat_of[-1]), spare_at.eq(tail), spare_valid.eq(1)]
            # (Taken, the port is busy only with the last beat of the one before.)
            with m.If(spare_valid):
                m.d.sync += [first.eq(beat_of[0]), first_valid.eq(1)]
        m.d.sync += counted.eq(written)
        return taken, counted, self.push & ~taken, (live, first_valid, spare_valid, counted)

