"""The tile with the RAM contracts the bitstream builds rely on asserted in every cycle.

The builds declare that a block RAM read meeting a write of its word may return
anything (`fusetile.host.fpga.UNDEFINED_COLLISIONS`: no read-during-write emulation,
whose multiplexer after the RAM's output was on the ULX3S build's worst paths). Amaranth
cannot say that, and its simulation returns the old word; so the tests that run
programs simulate this tile, which fails the simulation at the first cycle that breaks
the contract:

* the instruction stores: a read the control unit uses (``*_rd_en``) is of a bank or
  slot whose host writes the store refuses in that cycle and in the one before, or
  holds in the one before (a host write is posted: it lands the cycle after it is
  decided; built for area it lands in that cycle; ``hdl/stores.py``);
* the units' own partition tests (``hdl/dma.py``, ``hdl/compute.py``) agree with the
  scratchpad's: no unit presents an access that the scratchpad finds outside the
  partition;
* the compute unit takes a command in the cycle after the control unit issues it
  (the cycle its ``valid`` rises), unless it is stopped on a fault: a compact build
  decodes the command from the instruction register in that cycle alone
  (``hdl/control.py``);
* the control unit built for area (``compact``) holds a trace record's statistics (all
  but its first 64 bits) still for the two cycles after its push: the trace FIFO
  built so writes them from there (``hdl/trace.py``);
* the scratchpad: no performed read is of a word written in the cycle before (its
  write is posted: it reaches the bank in the cycle of that read; ``hdl/scratchpad.py``).
  The hardware does not prevent it; a program does it only by racing a DMA transfer
  against an instruction on the same words without a WAIT between
  (``docs/architecture.md``, "Scratchpad races").
"""

from amaranth.hdl import Assert, Signal

from fusetile.hdl.tile import Tile


__all__ = ["CheckedTile"]


class CheckedTile(Tile):
    """:class:`~fusetile.hdl.tile.Tile`, asserting the RAM contracts above."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        ctrl = m.submodules.control
        spad = m.submodules.spad
        # The locks as they were in the cycle before, when a host write that lands
        # with a fetch was decided.
        active_bank_1 = Signal(name="active_bank_1")
        plan_lock_all_1 = Signal(name="plan_lock_all_1")
        slot_lock_1 = Signal(name="slot_lock_1")
        locked_slot_1 = Signal(4, name="locked_slot_1")
        slot_hold_1 = Signal(name="slot_hold_1")
        m.d.sync += [active_bank_1.eq(ctrl.active_bank), plan_lock_all_1.eq(ctrl.plan_lock_all),
                     slot_lock_1.eq(ctrl.slot_lock), locked_slot_1.eq(ctrl.locked_slot),
                     slot_hold_1.eq(ctrl.slot_hold)]
        with m.If(ctrl.plan_rd_en):
            for bank, lock_all in ((ctrl.active_bank, ctrl.plan_lock_all),
                                   (active_bank_1, plan_lock_all_1)):
                m.d.comb += Assert((ctrl.plan_rd_bank == bank) | lock_all,
                                   "a plan fetch from a bank the host may write")
        with m.If(ctrl.kern_rd_en):
            m.d.comb += [
                Assert(ctrl.slot_lock & (ctrl.locked_slot == ctrl.kern_rd_slot),
                       "a kernel fetch from a slot the host may write"),
                Assert(slot_hold_1 | slot_lock_1 & (locked_slot_1 == ctrl.kern_rd_slot),
                       "a kernel fetch of a word the host may have written in the cycle "
                       "before"),
            ]
        if self.config.compact and self.config.traced:
            stats = ctrl.trace_record.as_value()[64:]
            pushed, held = ctrl.trace_push, stats
            for cycle in (1, 2):
                pushed_n = Signal(name=f"trace_pushed_{cycle}")
                held_n = Signal.like(stats, name=f"trace_stats_{cycle}")
                m.d.sync += [pushed_n.eq(pushed), held_n.eq(held)]
                with m.If(pushed_n):
                    when = {1: "in the cycle", 2: "two cycles"}[cycle]
                    m.d.comb += Assert(stats == held_n, f"a trace record's statistics "
                                                        f"changed {when} after its push")
                pushed, held = pushed_n, held_n
        # (Checked at the clock edge, on the cycle's settled values: `waited` and the
        # command's `valid` change together.)
        cmd = ctrl.compute_cmd
        waited = Signal(name="compute_cmd_waited")
        m.d.sync += waited.eq(cmd.valid)
        with m.If(cmd.valid & ~cmd.ready):
            m.d.sync += Assert(m.submodules.compute.fault,
                               "a compute command the running unit does not take at once")
        with m.If(cmd.valid & waited):
            m.d.sync += Assert(m.submodules.compute.fault | ctrl.dma_abort,
                               "a compute command left in the register past its cycle")
        for name in spad.PORTS:
            port = getattr(spad, name)
            with m.If(port.en):
                m.d.comb += Assert(~port.fault, f"scratchpad port {name}: an access outside "
                                                f"its partition")
        # A performed access is in the open partition, so equal offsets are one word
        # (the partition changes only at a CALL, when no access is in flight).
        ports = {name: getattr(spad, name) for name in spad.PORTS}
        done = {name: p.en & ~p.fault & ~p.stall & ~spad.abort for name, p in ports.items()}
        for w, wp in ports.items():
            written = Signal(name=f"{w}_wrote")
            offset = Signal.like(wp.offset, name=f"{w}_wrote_offset")
            m.d.sync += [written.eq(done[w] & wp.we), offset.eq(wp.offset)]
            for r, rp in ports.items():
                with m.If(written & done[r] & ~rp.we & (rp.offset == offset)):
                    m.d.comb += Assert(0, f"scratchpad: port {r} reads the word port {w} "
                                          f"wrote in the cycle before")
        return m
