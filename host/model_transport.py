"""The ``model`` transport: the NumPy golden model behind the tile's register map.

:class:`ModelTransport` answers bus accesses exactly as the tile's bus fabric does
(:mod:`fusetile.hdl.csr`, :mod:`fusetile.hdl.stores`, :mod:`fusetile.hdl.gmem`,
:mod:`fusetile.hdl.tile`), from the same :class:`~fusetile.hdl.registers.MemoryMap`:
RW fields are storage, R fields show the model's state, W1 fields are one-cycle
pulses, reading a counter's LO word latches its HI word, reading the last word of a
trace record pops it, and refused writes (the active plan bank, both banks while a
plan is speculating or running the other bank, the executing slot's microcode and
slot-table entry, its partition's table entry) answer ERR, set REFUSED_ADDR and count
in ``refused_writes`` (on a tile that has them: ``TileConfig.debug_regs``). Unmapped
addresses answer ERR.

Time is the model's clock: each bus access takes 2 cycles (the access is seen in the
first, answered in the second; a write of ``CTRL.abort`` takes a third, in which the
tile takes the abort; on the RTL, which registers it before decoding it, a
CSR access takes 2 to 4 cycles and a counter read 5 to 11, and nothing the tile counts
depends on it) and :meth:`wait_cycles` runs the model ``n`` cycles, so a plan takes
time and the host can act while it runs.
"""

from ..kernels.config import TileConfig
from ..kernels.model import TileModel
from ..hdl.registers import Access
from ..hdl.regmap import (tile_memory_map, bus_regions, hwcfg_values, CSR_BASE, CSR_SPAN,
                          PLAN_BASE, SLOT_BASE, GMEM_BASE, GMEM_SPAN)
from .transport import Transport, register_transport


__all__ = ["ModelTransport"]


_W1_PULSES = {("CTRL", "start"): "start", ("CTRL", "swap"): "swap",
              ("CTRL", "clear_fault"): "clear_fault", ("CTRL", "abort"): "abort",
              ("PERF_CTRL", "clear"): "perf_clear"}


@register_transport("model")
class ModelTransport(Transport):
    """The golden model (:class:`~fusetile.kernels.model.TileModel`) as a transport.

    Parameters
    ----------
    config : TileConfig or None
        Configuration of the modelled tile (``None``: the default).
    model : TileModel or None
        A model to drive instead of a fresh one (its configuration wins).

    Attributes
    ----------
    config : TileConfig
    model : TileModel
    cycles : int
        Model cycles so far.
    """

    def __init__(self, config=None, *, model=None):
        if model is not None:
            if not isinstance(model, TileModel):
                raise TypeError(f"model must be a TileModel, not {model!r}")
            config = model.config
        if config is None:
            config = TileConfig()
        if not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig, not {config!r}")
        mm = tile_memory_map(config)
        super().__init__(memory_map=mm)
        self.config = config
        self.model = model if model is not None else TileModel(config)
        self._hwcfg = hwcfg_values(config)
        self._shadow = 0
        self._refused_addr = 0
        self._storage = {}            # RW fields the model does not use
        # CSR decode: word address -> ("reg", Register) / ("lo" | "hi", Counter name)
        self._csr = {}
        for entry in mm.registers():
            if entry.addr < CSR_SPAN:
                self._csr[entry.addr] = ("reg", entry.item)
        for entry in mm.counters():
            if entry.addr + 8 <= CSR_SPAN:
                self._csr[entry.addr] = ("lo", entry.item.name)
                self._csr[entry.addr + 4] = ("hi", entry.item.name)
        self._plan_span = mm["PLAN[1]"].addr - mm["PLAN[0]"].addr
        self._slot_span = mm["KERNEL[0]"].item.span
        self._kernel_window = bus_regions(config)["kernel"][1]

    @property
    def cycles(self):
        return self.model.now

    # -- register values ----------------------------------------------------------------
    def _counter(self, name):
        m = self.model
        base, _, rest = name.partition("[")
        if rest:
            i = int(rest[:-1])
            lists = {"SLOT_CALLS": m.slot_calls, "SLOT_CYCLES": m.slot_cycles,
                     "BRANCH_TAKEN": m.branch_taken, "BRANCH_NOT_TAKEN": m.branch_not_taken}
            values = lists.get(base)
            return values[i] if values is not None and i < len(values) else 0
        return m.counters.get(name.lower(), 0)

    def _field(self, reg, field):
        """The value an R or RW field of ``reg`` reads."""
        m = self.model
        name = reg.name
        base, _, rest = name.partition("[")
        i = int(rest[:-1]) if rest else None
        if field.access is Access.RW:
            if base == "PART":
                return (m.part_base if field.name == "base" else m.part_len)[i]
            if base == "SLOT":
                return {"valid": m.slot_valid, "part": m.slot_part,
                        "version": m.slot_version}[field.name][i]
            if (name, field.name) == ("WATCHDOG", "limit"):
                return m.watchdog_limit
            if (name, field.name) == ("PERF_CTRL", "freeze"):
                return m.freeze
            if name == "IRQ_ENABLE":
                return m.irq_enable_done if field.name == "done" else m.irq_enable_fault
            return self._storage.get((name, field.name), field.init)
        if name in self._hwcfg:
            offset = dict((f.name, o) for f, o in reg.field_offsets())[field.name]
            return self._hwcfg[name] >> offset
        fault = m.fault
        values = {
            "STATUS": lambda: dict(running=m.running, done=m.done, faulted=m.faulted,
                                   active_bank=m.active_bank, swap_pending=m.swap_pending,
                                   dma_busy=m.dma_busy, in_kernel=m.in_kernel, slot=m.slot,
                                   speculating=m.speculating, exec_bank=m.exec_bank),
            "MARK": lambda: dict(value=m.mark),
            "PC": lambda: dict(plan=m.plan_pc, micro=m.micro_pc),
            "FLAGS": lambda: dict(flags=sum(f << k for k, f in enumerate(m.flags))),
            "MISS_PC": lambda: dict(pc=m.miss_pc),
            "INDEX": lambda: dict(value=m.index[i]),
            "FAULT": lambda: dict(cause=fault.cause.value, bank=fault.bank,
                                  in_kernel=fault.in_kernel, slot=fault.slot,
                                  part=fault.part),
            "FAULT_PC": lambda: dict(plan=fault.plan_pc, micro=fault.micro_pc),
            "FAULT_ADDR": lambda: dict(addr=fault.addr),
            "REFUSED_ADDR": lambda: dict(addr=self._refused_addr),
            "TRACE_STATUS": lambda: dict(level=len(m.trace), dropped=m.trace_dropped),
            "TRACE_DATA": lambda: dict(data=m.trace_read_word()),
        }.get(base)
        return values().get(field.name, 0) if values is not None else 0

    def _read_register(self, reg):
        value = 0
        for field, offset in reg.field_offsets():
            if field.access is not Access.W1:
                value |= (int(self._field(reg, field)) & ((1 << field.width) - 1)) << offset
        return value

    def _refuse_register(self, reg):
        m = self.model
        base, _, rest = reg.name.partition("[")
        if not rest or not m.in_kernel:
            return False
        i = int(rest[:-1])
        if base == "PART":
            return m.slot_part[m.slot] == i
        if base == "SLOT":
            return m.slot == i
        return False

    def _write_register(self, reg, value):
        """Store RW fields; return the W1 pulses."""
        m = self.model
        name = reg.name
        base, _, rest = name.partition("[")
        i = int(rest[:-1]) if rest else None
        pulses = {}
        for field, offset in reg.field_offsets():
            v = (value >> offset) & ((1 << field.width) - 1)
            if field.access is Access.W1:
                pulse = _W1_PULSES.get((name, field.name))
                if pulse is not None and v:
                    pulses[pulse] = 1
            elif field.access is Access.RW:
                if base == "PART":
                    (m.part_base if field.name == "base" else m.part_len)[i] = v
                elif base == "SLOT":
                    {"valid": m.slot_valid, "part": m.slot_part,
                     "version": m.slot_version}[field.name][i] = v
                elif (name, field.name) == ("WATCHDOG", "limit"):
                    m.watchdog_limit = v
                elif (name, field.name) == ("PERF_CTRL", "freeze"):
                    m.freeze = v
                elif (name, field.name) == ("IRQ_ENABLE", "done"):
                    m.irq_enable_done = v
                elif (name, field.name) == ("IRQ_ENABLE", "fault"):
                    m.irq_enable_fault = v
                else:
                    self._storage[(name, field.name)] = v
        return pulses

    # -- one bus access -------------------------------------------------------------------
    def _access(self, addr, write, value=0):
        """One access: seen in this cycle, answered in the next. Returns (ok, data)."""
        m = self.model
        ok, data, effect, pulses = self._decode(addr, write, value)
        m.step(1)                                   # the cycle the access is seen
        if effect is not None:
            effect()                                # storage updates at its end
        if write and ok is None:                    # refused
            pulses = dict(pulses, refused=1)
            self._refused_addr = addr
        m.step(1, **pulses)                         # the cycle of ACK / ERR
        if pulses.get("abort"):
            # The control unit takes an abort the cycle after its pulse; on the RTL the
            # next access reads nothing sooner.
            m.step(1)
        return bool(ok), data

    def _decode(self, addr, write, value):
        """(ok: True / False / None = refused, read data, storage effect, pulses), from
        the state in the cycle the access is seen."""
        m = self.model
        cfg = self.config
        if CSR_BASE <= addr < CSR_BASE + CSR_SPAN:
            kind, item = self._csr.get(addr - CSR_BASE, (None, None))
            if kind is None:
                return False, 0, None, {}
            if kind == "reg":
                if not write:
                    data = self._read_register(item)
                    pulses = {"trace_read": 1} if item.read_strobe else {}
                    return True, data, None, pulses
                if not item.writable:
                    return False, 0, None, {}
                if self._refuse_register(item):
                    return None, 0, None, {}
                pulses = {}

                def effect():
                    pulses.update(self._write_register(item, value))
                return True, 0, effect, pulses
            if write:
                return False, 0, None, {}
            live = self._counter(item)
            if kind == "lo":
                self._shadow = live >> 32
                return True, live & 0xFFFF_FFFF, None, {}
            return True, self._shadow & 0xFFFF_FFFF, None, {}

        if PLAN_BASE <= addr < PLAN_BASE + 2 * self._plan_span:
            off = addr - PLAN_BASE
            bank, word = divmod(off, self._plan_span)
            index, half = divmod(word // 4, 2)
            if not write:
                return True, (m.plans[bank][index] >> (32 * half)) & 0xFFFF_FFFF, None, {}
            lock_all = m.running and (m.speculating or m.exec_bank != m.active_bank)
            if bank == m.active_bank or lock_all:
                return None, 0, None, {}

            def effect():
                old = m.plans[bank][index]
                mask = 0xFFFF_FFFF << (32 * half)
                m.plans[bank][index] = (old & ~mask) | (value << (32 * half))
            return True, 0, effect, {}

        if SLOT_BASE <= addr < SLOT_BASE + self._kernel_window:
            slot, word = divmod(addr - SLOT_BASE, self._slot_span)
            if slot >= cfg.kernel_slots:
                return False, 0, None, {}
            index, quarter = divmod(word // 4, 4)
            if not write:
                return True, (m.kernels[slot][index] >> (32 * quarter)) & 0xFFFF_FFFF, None, {}
            if m.in_kernel and m.slot == slot:
                return None, 0, None, {}

            def effect():
                old = m.kernels[slot][index]
                mask = 0xFFFF_FFFF << (32 * quarter)
                m.kernels[slot][index] = (old & ~mask) | (value << (32 * quarter))
            return True, 0, effect, {}

        if GMEM_BASE <= addr < GMEM_BASE + GMEM_SPAN:
            off = addr - GMEM_BASE
            if off >= cfg.gmem_bytes:
                return False, 0, None, {}
            if not write:
                return True, int.from_bytes(m.gmem[off:off + 4].tobytes(), "little"), None, {}

            def effect():
                m.gmem[off:off + 4] = list(value.to_bytes(4, "little"))
            return True, 0, effect, {}

        return False, 0, None, {}

    # -- Transport ---------------------------------------------------------------------------
    def _read32(self, addr):
        ok, data = self._access(addr, False)
        if not ok:
            raise self._bus_error(addr, False)
        return data

    def _write32(self, addr, value):
        ok, _ = self._access(addr, True, value)
        if not ok:
            raise self._bus_error(addr, True)

    def wait_cycles(self, n):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"Cycle count must be a non-negative integer, not {n!r}")
        self._check_open()
        self.model.step(n)

    def irq(self):
        """The level the tile's ``irq`` output would have (0 or 1)."""
        return self.model.irq
