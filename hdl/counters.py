"""Performance counters: 64-bit event counters kept in a block RAM, with freeze and clear.

A tile has some 80 counters. As 64-bit registers with an adder each they took 5,153
flip-flops and 2,528 carry cells of the ULX3S build, and the CSR bank's multiplexer
over them two thirds of its 4,552 LUT4s (the iCE40UP5K has 5,280 logic cells in all).
Here each counter is a narrow *pending* count in flip-flops, and a scanner adds one
pending count per cycle into a 64-bit word of a RAM, the way network switches keep
their statistics. A read adds the RAM word and the pending count of its counter,
through the same pipeline. (docs/fpga-timing.md, step 14, has the figures before and after.)
"""

from collections.abc import Mapping

from amaranth.hdl import Array, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out


__all__ = ["CounterReadSignature", "PerfCounters"]


class CounterReadSignature(wiring.Signature):
    """A port that reads one 64-bit counter at a time, from the reader's side.

    The reader pulses ``stb`` for one cycle with the counter's ``index``; some cycles
    later ``ack`` pulses for one cycle with its value in ``data``, which holds until
    the next ``stb``. The reader sends the next ``stb`` only after the ``ack``.

    Parameters
    ----------
    count : int
        Counters behind the port (``index`` is ``range(count)``).

    Members
    -------
    stb : Out(1)
    index : Out(range(count))
    ack : In(1)
    data : In(64)
    """

    def __init__(self, *, count):
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise TypeError(f"count must be a positive integer, not {count!r}")
        self.count = count
        super().__init__({
            "stb":   Out(1),
            "index": Out(range(count)),
            "ack":   In(1),
            "data":  In(64),
        })

    def __eq__(self, other):
        return isinstance(other, CounterReadSignature) and self.count == other.count

    def __repr__(self):
        return f"CounterReadSignature(count={self.count})"


class PerfCounters(wiring.Component):
    """A set of named 64-bit counters, read one at a time through :attr:`read`.

    Counting is exact: a counter's value is every increment from its last ``clear``,
    less those made while ``freeze`` was high. ``freeze`` and ``clear`` act on the
    events of their own cycle: an event in the cycle before a freeze is counted, one
    in a clear's cycle is not.

    How: each counter's increments are registered twice (as they come, then with
    ``freeze`` and ``clear`` applied), then gather in a pending count. Every cycle one step of
    a three-stage pipeline runs. A *flush* step, taken by a scanner going round the
    counters, adds a counter's pending count to its RAM word and restarts the pending
    count; a *read* step (for :attr:`read`) adds them without writing. A read step is
    taken only after a flush step and never on a counter whose flush is in flight, so
    a counter is flushed at least once every ``2 * max(counters, 3)`` cycles; that
    bounds its pending count to its increment's width plus that many cycles' bits.
    ``clear`` zeroes the pending counts and marks every RAM word stale (read as 0 until
    its next flush), so it takes effect at once.

    A read's value counts the events up to a cycle between the ``stb`` and the ``ack``
    (6 to 8 cycles later; 2 for a counter in a register): an event reaches the pending
    count two cycles after it happens, and a read step is taken no sooner than two
    cycles after the ``stb``. Counters named in ``immediate`` are plain 64-bit registers
    instead, readable every cycle through :attr:`value` (``CYCLES``, which the control
    unit stamps into trace records); they count the increment of their own cycle.
    Counters named in ``pipelined`` register their increments once more, with
    ``freeze``, ``clear`` and ``void`` delayed to match, so they count exactly the
    same; a read of one counts the events up to a cycle from two before its ``stb``.
    They are for events decided far from the counters, in long logic (the
    scratchpad's bank accesses, behind its arbitration).

    Parameters
    ----------
    names : iterable of str
        Counter names, unique; a counter's :attr:`read` index is its position.
    inc_width : int or mapping of str to int
        Width of each counter's per-cycle increment (one width for all, or per name).
    immediate : iterable of str
        Names of counters kept in registers.
    voidable : iterable of str
        Names of counters (kept in the RAM) whose increments :attr:`void` cancels.
    pipelined : iterable of str
        Names of counters (kept in the RAM) whose increments are registered once more.
    compact : bool
        Built for area (:attr:`TileConfig.compact`): each increment is registered
        once, with ``freeze``, ``clear`` and ``void`` of its own cycle applied, a RAM
        word is added and written back in the cycle it is read, and a read step's sum
        is the flush's adder's. The counts are the same; a read is answered a cycle
        sooner (5 to 7 cycles after its ``stb``), and the ``pipelined`` counters are
        not pipelined (their reads count as the others' do).

    Attributes
    ----------
    freeze : In(1)
        While high, no event is counted.
    clear : In(1)
        Zero every counter (wins over increments; works while frozen).
    void : In(1)
        The increments of this cycle of the ``voidable`` counters are not counted.
        It is applied with ``freeze``, after the increments are registered: an event
        may then be signalled before the decision that cancels it is made (the
        control unit's events, before its fault decision: docs/fpga-timing.md, step 33).
    read : In(CounterReadSignature(count=len(names)))
        Reads a counter; an index past the last counter reads 0.
    inc : dict of str to Signal
        Amount added to each counter this cycle; driven by the parent (0 if undriven).
    value : dict of str to Signal(64)
        Current value of each immediate counter.
    ram_ports : (WritePort, ReadPort)
        After elaboration, the RAM's ports, for the tests (no read is of the word
        written in its cycle).

    Raises
    ------
    ValueError
        If a name repeats, an increment width is not from 1 to 32 (or a mapping
        misses or adds names), ``immediate`` names a counter that does not exist, or
        ``voidable`` or ``pipelined`` one that does not exist or is immediate.
    """

    #: Counters per group of the first step of a read's pending-count selection, and
    #: groups per group of the second.
    READ_GROUP = 8
    READ_GROUP2 = 4

    def __init__(self, names, *, inc_width=8, immediate=(), voidable=(), pipelined=(),
                 compact=False):
        names = list(names)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"Counter names must be unique and at least one, not {names!r}")
        if isinstance(inc_width, Mapping):
            if set(inc_width) != set(names):
                raise ValueError(f"inc_width must give a width for each counter and no other, "
                                 f"not for {sorted(inc_width)!r}")
            widths = dict(inc_width)
        else:
            widths = dict.fromkeys(names, inc_width)
        for width in widths.values():
            if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= 32:
                raise ValueError(f"inc_width must be an integer from 1 to 32, not {width!r}")
        unknown = set(immediate) - set(names)
        if unknown:
            raise ValueError(f"immediate names counters that do not exist: {sorted(unknown)!r}")
        for option, given in (("voidable", voidable), ("pipelined", pipelined)):
            wrong = set(given) - (set(names) - set(immediate))
            if wrong:
                raise ValueError(f"{option} names counters that do not exist or are "
                                 f"immediate: {sorted(wrong)!r}")
        self.names = names
        self.immediate = frozenset(immediate)
        self.voidable = frozenset(voidable)
        self.pipelined = frozenset(pipelined)
        self.compact = bool(compact)
        self.inc = {n: Signal(widths[n], name=f"inc_{_ident(n)}") for n in names}
        self.value = {n: Signal(64, name=f"ctr_{_ident(n)}") for n in names
                      if n in self.immediate}
        super().__init__({
            "freeze": In(1),
            "clear":  In(1),
            "void":   In(1),
            "read":   In(CounterReadSignature(count=len(names))),
        })

    def elaborate(self, platform):
        m = Module()
        rd = self.read
        in_ram = [n for n in self.names if n not in self.immediate]
        in_regs = [n for n in self.names if n in self.immediate]

        for n in in_regs:
            with m.If(self.clear):
                m.d.sync += self.value[n].eq(0)
            with m.Elif(~self.freeze):
                m.d.sync += self.value[n].eq(self.value[n] + self.inc[n])

        # The read request, held until it is answered. ``req_slot`` is the counter's
        # RAM word, or (``req_reg``) its register; past the last counter it is a
        # register slot that reads 0.
        req = Signal()
        req_reg = Signal()
        req_slot = Signal(range(max(len(in_ram), len(in_regs) + 1)))
        m.d.sync += rd.ack.eq(0)
        with m.If(req & req_reg):
            values = Array([self.value[n] for n in in_regs] + [Const(0, 64)])
            m.d.sync += [rd.data.eq(values[req_slot]), rd.ack.eq(1), req.eq(0)]

        if in_ram:
            self._elaborate_ram(m, in_ram, req, req_reg, req_slot)

        with m.If(rd.stb):
            m.d.sync += [req.eq(1), req_reg.eq(1), req_slot.eq(len(in_regs))]
            with m.Switch(rd.index):
                for i, n in enumerate(self.names):
                    with m.Case(i):
                        if n in self.immediate:
                            m.d.sync += req_slot.eq(in_regs.index(n))
                        else:
                            m.d.sync += [req_reg.eq(0), req_slot.eq(in_ram.index(n))]
        return m

    def _elaborate_ram(self, m, in_ram, req, req_reg, req_slot):
        rd = self.read
        # At least three words, so that a word's flush has been written before the
        # scanner comes back to it (the unused words are never written).
        slots = max(len(in_ram), 3)
        extra = (2 * slots).bit_length()
        pending = [Signal(len(self.inc[n]) + extra, name=f"pend_{_ident(n)}") for n in in_ram]
        stale = Signal(slots, init=(1 << slots) - 1)
        scan = Signal(range(slots))

        # Built for area, one more word, never written, reads 0 (below).
        m.submodules.ram = ram = Memory(shape=64, depth=slots + self.compact, init=[])
        wr = ram.write_port()
        rp = ram.read_port()
        # No read is of the word written in its cycle (below): the iCE40 build declares
        # that such a read may return anything (`fusetile.host.fpga`).
        self.ram_ports = (wr, rp)

        # Stage 1: the RAM word is being read; stage 2: it is added and written back
        # (a flush); stage 3: it is added and returned (a read). (Built for area, the
        # first two are one, and a read is answered from the second: below.)
        s1_slot, s2_slot = Signal.like(scan), Signal.like(scan)
        s1_flush, s2_flush = Signal(), Signal()
        s1_read, s2_read = Signal(), Signal()
        s1_stale = Signal()
        pend_width = max(len(p) for p in pending)
        s2_pend = Signal(pend_width)
        s2_word = Signal(64)
        # A read's third stage: its RAM word and its pending count, added into the
        # answer.
        s3_read = Signal()
        s3_word = Signal(64)
        s3_pend = Signal(pend_width)

        # Whether the RAM word addressed in this cycle is a read's (else the scanner's),
        # a register: it decides the RAM's address, the scanner's step and every
        # pending count's flush, and worked out in its own cycle it was 12.0 ns of
        # 1bd7667's ULX3S build (docs/fpga-timing.md, step 38). A request is read no sooner
        # than a cycle after it is taken (by then the events of its `stb`'s cycle are
        # in the pending counts, two cycles after them), not in the cycle after
        # another read, and not while its word's flush is still in stages 1 and 2:
        # `reading` is set for the next cycle when the request is in and none of that
        # will hold then (the flush in stage 1 then is the scanner's word now, the
        # one in stage 2 then is stage 1's now).
        reading = Signal()
        flush_in_flight = (((scan < len(in_ram)) & (scan == req_slot)) |
                           (s1_flush & (s1_slot == req_slot)))
        m.d.sync += reading.eq(req & ~req_reg & ~reading & ~rd.stb & ~flush_in_flight)
        slot = Signal.like(scan)
        m.d.comb += [
            slot.eq(Mux(reading, req_slot, scan)),
        ]
        # The pending count of the scanner's word is selected in two registered
        # steps, within each group of READ_GROUP counters by the low bits of `scan`,
        # then among the groups by stage 1's slot (in one step from `scan` it was
        # 10.10 ns of c475267's ULX3S build, docs/fpga-timing.md step 39). A read's is
        # selected in three registered steps, one per stage: within each group of
        # READ_GROUP counters by the low bits of `req_slot`, within each group of
        # READ_GROUP2 groups by the next bits, then among those (in two steps, from
        # pending counts all over the chip, the last was 11.38 ns of step 36's best
        # ULX3S build), and added to its RAM word in a third stage of its own. The
        # first groups are loaded every cycle, so in stage 1 they hold the pending
        # counts of the cycle the RAM word was addressed; `req_slot` stays until the
        # answer.

        def select_in_groups(values, n, index, name):
            """Registers, one per group of ``n`` of ``values``, each loaded with the
            group's member ``index``."""
            groups = [values[i:i + n] for i in range(0, len(values), n)]
            chosen = [Signal(pend_width, name=f"{name}{k}") for k in range(len(groups))]
            for value, group in zip(chosen, groups):
                m.d.sync += value.eq(Array(group + [Const(0)] * (n - len(group)))[index])
            return chosen

        low = (self.READ_GROUP - 1).bit_length()
        mid = low + (self.READ_GROUP2 - 1).bit_length()
        # Built compact, one selection serves both steps, by the RAM's address: a read
        # step's pending count is added by the flush's adder, in the second stage.
        s1_scan_group = select_in_groups(pending, self.READ_GROUP,
                                         (slot if self.compact else scan)[:low],
                                         "s1_scan_group")
        if not self.compact:
            s1_pend_group = select_in_groups(pending, self.READ_GROUP, req_slot[:low],
                                             "s1_pend_group")
            s2_pend_group = select_in_groups(s1_pend_group, self.READ_GROUP2,
                                             req_slot[low:mid], "s2_pend_group")
        # Whether the RAM word is stale, for the request's word and for the
        # scanner's next, each registered a cycle ahead (selected in stage 1's cycle,
        # both selections and the choice between them were 10.18 ns of c475267's
        # build). The request's bit does not change in the cycle before it is read
        # (not its flush's: `flush_in_flight`) unless by a clear; the scanner's next
        # word is the one after `scan`, or `scan` again while a read holds it. The
        # one after `scan` is a register that steps with it (an adder and a comparison
        # in front of the selection, it was 10.47 to 10.74 ns of 7a057ba's builds).
        req_stale = Signal()
        scan_stale = Signal(init=1)
        after_scan = Signal.like(scan, init=1)
        m.d.sync += [
            req_stale.eq(stale.bit_select(req_slot, 1) | self.clear),
            scan_stale.eq(Mux(reading, stale.bit_select(scan, 1),
                              stale.bit_select(after_scan, 1)) | self.clear),
        ]
        m.d.sync += [
            s1_slot.eq(slot),
            s1_flush.eq(~reading & (scan < len(in_ram))),
            s1_read.eq(reading),
            # (Built for area, a stale word is read as 0 from the RAM: below.)
            *([] if self.compact else [s1_stale.eq(Mux(reading, req_stale, scan_stale))]),
        ]
        with m.If(reading):
            m.d.sync += req.eq(0)
        with m.Else():
            m.d.sync += [scan.eq(after_scan),
                         after_scan.eq(Mux(after_scan == slots - 1, 0, after_scan + 1))]

        # Each increment is registered as it comes, then with `freeze` and `clear` of
        # its cycle (and a clear of the next) applied, then added: the logic deciding
        # an event (the scratchpad's arbitration, the control unit's fault decision),
        # the selection of a per-slot or per-flag counter, and the adder are three
        # paths. (With the selection in the first, the control unit's events into the
        # per-flag counters were the ULX3S build's worst path, step 32.)
        # A pipelined counter's increment is registered once more first (`early`),
        # with `freeze`, `clear` and `void` a cycle later to match, and a clear of the
        # cycle between dropping it too.
        freeze_1, freeze_2 = Signal(name="freeze_1"), Signal(name="freeze_2")
        clear_1, clear_2 = Signal(name="clear_1"), Signal(name="clear_2")
        void_1, void_2 = Signal(name="void_1"), Signal(name="void_2")
        m.d.sync += [freeze_1.eq(self.freeze), clear_1.eq(self.clear), void_1.eq(self.void),
                     freeze_2.eq(freeze_1), clear_2.eq(clear_1), void_2.eq(void_1)]
        for i, (n, p) in enumerate(zip(in_ram, pending)):
            raw = Signal.like(self.inc[n], name=f"raw_{_ident(n)}")
            staged = Signal.like(self.inc[n], name=f"staged_{_ident(n)}")
            if self.compact:
                # The increment as it comes, with its own cycle's freeze, clear and
                # void (a clear in the next cycle zeroes the pending count it joins).
                m.d.comb += raw.eq(self.inc[n])
                dropped = self.freeze | self.clear
                voided = self.void
            elif n in self.pipelined:
                early = Signal.like(self.inc[n], name=f"early_{_ident(n)}")
                m.d.sync += [early.eq(self.inc[n]), raw.eq(early)]
                dropped = freeze_2 | clear_2 | clear_1 | self.clear
                voided = void_2
            else:
                m.d.sync += raw.eq(self.inc[n])
                dropped = freeze_1 | clear_1 | self.clear
                voided = void_1
            if n in self.voidable:
                dropped = dropped | voided
            m.d.sync += staged.eq(Mux(dropped, 0, raw))
            with m.If(self.clear):
                m.d.sync += p.eq(0)
            with m.Elif(~reading & (scan == i)):
                m.d.sync += p.eq(staged)
            with m.Else():
                m.d.sync += p.eq(p + staged)
        with m.If(self.clear):
            m.d.sync += stale.eq((1 << slots) - 1)
        with m.Elif(~reading):
            m.d.sync += stale.eq(stale & ~(Const(1, slots) << scan))

        if self.compact:
            # Built for area, the word is added and written back in the cycle it comes
            # out of the RAM: a second stage held it in 64 flip-flops that took a logic
            # cell each on the UP5K, loaded from the RAM with no LUT in front. A read's
            # sum is registered then and answered a cycle later, when the deep build's
            # second stage would answer it. (A word written a cycle sooner is read
            # again no sooner: the rules above wait for the second stage still.) A
            # stale word is read from the word past the counters', never written, so
            # 0: zeroed after the RAM, each bit took a LUT of its own in front of
            # the adder's carry chain.
            m.d.comb += rp.addr.eq(Mux(Mux(reading, req_stale, scan_stale), slots, slot))
            total = Signal(64)
            m.d.comb += [
                total.eq(rp.data + Array(s1_scan_group)[s1_slot[low:]]),
                wr.addr.eq(s1_slot),
                wr.data.eq(total),
                wr.en.eq(s1_flush),
            ]
            with m.If(s1_read):
                m.d.sync += rd.data.eq(total)
            m.d.sync += s2_read.eq(s1_read)
            with m.If(s2_read):
                m.d.sync += rd.ack.eq(1)
            return
        m.d.comb += rp.addr.eq(slot)
        m.d.sync += [
            s2_slot.eq(s1_slot),
            s2_flush.eq(s1_flush),
            s2_read.eq(s1_read),
            s2_word.eq(Mux(s1_stale, 0, rp.data)),
            s2_pend.eq(Array(s1_scan_group)[s1_slot[low:]]),
        ]
        m.d.comb += [
            wr.addr.eq(s2_slot),
            wr.data.eq(s2_word + s2_pend),
            wr.en.eq(s2_flush),
        ]
        m.d.sync += [
            s3_read.eq(s2_read),
            s3_word.eq(s2_word),
            s3_pend.eq(Array(s2_pend_group)[req_slot[mid:]]),
        ]
        with m.If(s3_read):
            m.d.sync += [rd.data.eq(s3_word + s3_pend), rd.ack.eq(1)]


def _ident(name):
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()
