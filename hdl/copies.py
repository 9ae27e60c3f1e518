"""Registers built more than once: a copy of a register for each group of its far-apart
consumers, so that each copy can be placed beside its own.

Yosys merges flip-flops that load the same value (``opt_merge``), and nextpnr does not
duplicate registers, so one register read across the device costs its longest wire
on every path from it. A register marked with :func:`copy` keeps its own flip-flops:
the ECP5 builds mark its cells ``keep`` (:data:`KEEP_COPIES`, in the Yosys script
of ``fusetile.host.fpga``), which ``opt_merge`` leaves alone. (The iCE40 builds do
not: at the UP5K's clock one register feeds far-apart logic in time, and every
flip-flop takes one of its logic cells.) Mark every twin: an
unmarked register that loads what a marked one loads is merged into it (d50c661's
``micro_ir`` into ``check_ir``, docs/fpga-timing.md step 51). In simulation a copy is
just another register with the same value.
"""

from amaranth.hdl import Value


__all__ = ["ATTR", "KEEP_COPIES", "copy"]


#: The attribute that marks a copy (on its signal, which Amaranth puts on the wire).
ATTR = "fusetile_copy"

#: Yosys commands, run after the design is read, that keep each copy's flip-flops: the
#: ``$dff`` cells driving a marked wire get ``keep``.
KEEP_COPIES = [f"setattr -set keep 1 a:{ATTR} %ci1:+$dff[Q] t:$dff %i"]


def copy(signal):
    """Mark register ``signal`` (a :class:`Signal`, or a view of one) as a copy to keep
    apart; returns it."""
    Value.cast(signal).attrs[ATTR] = 1
    return signal
