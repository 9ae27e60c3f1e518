"""The tile as the host sees it: typed registers, counters, windows and control.

:class:`Device` binds to the tile's :class:`~fusetile.hdl.registers.MemoryMap`
(built by :func:`~fusetile.hdl.regmap.tile_memory_map` from the tile's configuration)
and reaches the bus through any :class:`~fusetile.host.transport.Transport`. It never
hand-codes an address or a bit position, and it knows nothing about the transport
beneath it.

    >>> dev = Device(open_transport("amaranth"))
    >>> dev.regs.PART[0].write(base=0, length=256)
    >>> dev.regs.WATCHDOG.modify(limit=100_000)
    >>> dev.start(); dev.wait_done(timeout_cycles=10_000)
    >>> dev.counters()["cycles"]
"""

from amaranth.lib import data

from ..kernels.config import TileConfig
from ..kernels.isa import PLAN_INSTR_BITS, MICRO_INSTR_BITS, FaultCause, TraceRecord, FLAGS
from ..hdl.registers import Access, Window
from ..hdl import regmap
from .transport import Transport


__all__ = ["Device", "RegisterHandle", "RegisterArray", "RegisterFile", "TileFault"]


_BUS_BYTES = 4


class TileFault(Exception):
    """The tile stopped on a fault.

    Attributes
    ----------
    cause : FaultCause or int
        ``FAULT.cause`` (an int if the value has no name in :class:`FaultCause`).
    bank, in_kernel, slot, part : int
        The other ``FAULT`` fields.
    plan_pc, micro_pc : int
        ``FAULT_PC``.
    addr : int
        ``FAULT_ADDR`` (its meaning depends on the cause).
    """

    def __init__(self, cause, *, bank=0, in_kernel=0, slot=0, part=0, plan_pc=0,
                 micro_pc=0, addr=0):
        self.cause = cause
        self.bank = bank
        self.in_kernel = in_kernel
        self.slot = slot
        self.part = part
        self.plan_pc = plan_pc
        self.micro_pc = micro_pc
        self.addr = addr
        name = cause.name if isinstance(cause, FaultCause) else f"cause {cause}"
        where = f"plan bank {bank} pc {plan_pc}"
        if in_kernel:
            where += f", kernel slot {slot} micro pc {micro_pc}"
        extra = f", partition {part}" if cause == FaultCause.PARTITION else ""
        super().__init__(f"tile faulted: {name} at {where}{extra}, address {addr:#x}")


def _field_value(register, field, value):
    """Check one field value for a write and return it as an int."""
    if field.enum is not None and isinstance(value, field.enum):
        value = value.value
    if not isinstance(value, int):
        raise TypeError(f"{register.name}.{field.name} must be an integer"
                        + (f" or a {field.enum.__name__}" if field.enum is not None else "")
                        + f", not {value!r}")
    value = int(value)
    if not 0 <= value < 1 << field.width:
        raise ValueError(f"{register.name}.{field.name} is {field.width} bits wide: "
                         f"{value!r} does not fit")
    return value


class RegisterHandle:
    """Typed access to one register of a :class:`Device`.

    Attributes
    ----------
    name : str
    addr : int
        Byte address.
    register : Register
    """

    def __init__(self, device, entry):
        self._device = device
        self.register = entry.item
        self.name = entry.item.name
        self.addr = entry.addr

    def __repr__(self):
        return f"<RegisterHandle {self.name} @ {self.addr:#x}>"

    @property
    def fields(self):
        """Names of the register's fields, LSB first."""
        return [f.name for f in self.register.fields]

    def read_raw(self):
        """Read the register as a 32-bit integer."""
        if not self.register.readable:
            raise ValueError(f"Register {self.name} is write-only (it reads as 0)")
        return self._device.transport.read32(self.addr)

    def read(self):
        """Read the register and view it through its layout (fields by attribute)."""
        return self.register.unpack(self.read_raw())

    def _pack(self, base, values):
        reg = self.register
        raw = base
        for name, value in values.items():
            try:
                field = reg.field(name)
            except KeyError:
                raise TypeError(f"Register {self.name} has no field {name!r}; its fields "
                                f"are: {', '.join(self.fields)}") from None
            if not field.access.writable:
                raise ValueError(f"Field {self.name}.{name} is read-only")
            offset = dict((f.name, o) for f, o in reg.field_offsets())[name]
            mask = ((1 << field.width) - 1) << offset
            raw = (raw & ~mask) | (_field_value(reg, field, value) << offset)
        return raw

    def _check_writable(self):
        if not self.register.writable:
            raise ValueError(f"Register {self.name} is read-only")

    def write(self, **values):
        """Write the named fields; fields not named are written as 0."""
        self._check_writable()
        self._device.transport.write32(self.addr, self._pack(0, values))

    def write_raw(self, value):
        """Write a raw 32-bit value."""
        self._check_writable()
        self._device.transport.write32(self.addr, value)

    def modify(self, **values):
        """Read, change the named fields, write back. Trigger (W1) fields not named are
        written as 0, so a modify never fires a command by accident."""
        self._check_writable()
        reg = self.register
        old = self.read_raw() if reg.readable else 0
        for field, offset in reg.field_offsets():
            if field.access is Access.W1:
                old &= ~(((1 << field.width) - 1) << offset)
        new = self._pack(old, values)
        self._device.transport.write32(self.addr, new)
        return reg.unpack(new)


class RegisterArray:
    """The elements ``NAME[0]``, ``NAME[1]``, ... of a register array."""

    def __init__(self, name, handles):
        self.name = name
        self._handles = handles

    def __getitem__(self, index):
        return self._handles[index]

    def __len__(self):
        return len(self._handles)

    def __iter__(self):
        return iter(self._handles)

    def __repr__(self):
        return f"<RegisterArray {self.name}[{len(self)}]>"


class RegisterFile:
    """All registers of a device: ``regs.STATUS``, ``regs["PART[2]"]``, ``regs.PART[2]``."""

    def __init__(self, device):
        self._handles = {}
        arrays = {}
        for entry in device.memory_map.registers():
            handle = RegisterHandle(device, entry)
            self._handles[handle.name] = handle
            if entry.index is not None and "[" in handle.name:
                arrays.setdefault(handle.name.partition("[")[0], []).append(handle)
        self._arrays = {name: RegisterArray(name, handles) for name, handles in arrays.items()}

    def __getitem__(self, name):
        try:
            return self._handles[name]
        except KeyError:
            if name in self._arrays:
                return self._arrays[name]
            raise KeyError(f"No register named {name!r}") from None

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"No register named {name!r}") from None

    def __contains__(self, name):
        return name in self._handles or name in self._arrays

    def __iter__(self):
        return iter(self._handles.values())

    def __dir__(self):
        return [n for n in self._handles if "[" not in n] + list(self._arrays)


def _contiguous_runs(entries, stride):
    """Split address-sorted entries into runs ``stride`` bytes apart: one burst each."""
    runs = []
    for entry in entries:
        if runs and entry.addr == runs[-1][-1].addr + stride:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def _words_to_int(words):
    value = 0
    for i, word in enumerate(words):
        value |= word << (32 * i)
    return value


def _int_to_words(value, n):
    return [(value >> (32 * i)) & 0xFFFF_FFFF for i in range(n)]


class Device:
    """One fusetile, reached through a transport.

    Parameters
    ----------
    transport : Transport
    config : TileConfig or None
        The tile's configuration. ``None``: read it from the tile's identity registers
        (:meth:`hardware_profile`).

    Attributes
    ----------
    transport : Transport
    config : TileConfig
    memory_map : MemoryMap
    regs : RegisterFile
        Typed access to every register by name.

    Raises
    ------
    ValueError
        If ``config`` is ``None`` and the identity registers do not describe a fusetile.
    """

    def __init__(self, transport, *, config=None):
        if not isinstance(transport, Transport):
            raise TypeError(f"transport must be a Transport, not {transport!r}")
        if config is not None and not isinstance(config, TileConfig):
            raise TypeError(f"config must be a TileConfig or None, not {config!r}")
        self.transport = transport
        if config is None:
            config = self.hardware_profile()
        self.config = config
        self.memory_map = regmap.tile_memory_map(config)
        if transport.memory_map is None:
            transport.memory_map = self.memory_map
        self.regs = RegisterFile(self)

    def __repr__(self):
        return f"<Device {type(self.transport).__name__} {self.config.profile_hash}>"

    def close(self):
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- identity -------------------------------------------------------------------
    def identity(self):
        """Raw identity registers (ID, VERSION, HWCFG_*): {name: int}."""
        # Their layout and addresses do not depend on the configuration.
        entries = regmap.tile_memory_map(TileConfig()).group("identity")
        values = {}
        for run in _contiguous_runs(entries, _BUS_BYTES):
            words = self.transport.read_burst(run[0].addr, len(run))
            values.update((e.item.name, w) for e, w in zip(run, words))
        return values

    def hardware_profile(self):
        """Read the tile's configuration from its identity registers.

        Raises
        ------
        ValueError
            If the ID register does not hold the fusetile magic number, or the register
            map's major version differs from the host's.
        """
        return regmap.config_from_hwcfg(self.identity())

    def version(self):
        """The tile's register map / ISA version as ``(major, minor, patch)``."""
        view = self.regs.VERSION.read()
        return int(view.major), int(view.minor), int(view.patch)

    # -- control --------------------------------------------------------------------
    def status(self):
        """``STATUS`` as a view: ``.running``, ``.done``, ``.faulted``, ..."""
        return self.regs.STATUS.read()

    def start(self):
        """Run the active plan bank from PC 0."""
        self.regs.CTRL.write(start=1)

    def request_swap(self):
        """Ask for a plan bank swap at the next safe point."""
        self.regs.CTRL.write(swap=1)

    def clear_fault(self):
        """Leave the fault state (the tile goes idle)."""
        self.regs.CTRL.write(clear_fault=1)

    def abort(self):
        """Stop a running plan at once."""
        self.regs.CTRL.write(abort=1)

    def fault(self):
        """The last fault as a :class:`TileFault` (not raised), or ``None`` if the tile
        is not faulted."""
        if not int(self.status().faulted):
            return None
        return self._read_fault()

    def _read_fault(self):
        fault_reg = self.regs.FAULT.register
        raw = self.regs.FAULT.read_raw()
        fields = {}
        for field, offset in fault_reg.field_offsets():
            value = (raw >> offset) & ((1 << field.width) - 1)
            if field.enum is not None:
                try:
                    value = field.enum(value)
                except ValueError:
                    pass
            fields[field.name] = value
        pc = self.regs.FAULT_PC.read()
        addr = int(self.regs.FAULT_ADDR.read().addr)
        return TileFault(fields["cause"], bank=fields["bank"], in_kernel=fields["in_kernel"],
                         slot=fields["slot"], part=fields["part"], plan_pc=int(pc.plan),
                         micro_pc=int(pc.micro), addr=addr)

    def wait_done(self, timeout_cycles=100_000, *, poll_cycles=64, on_poll=None):
        """Wait until the running plan reaches DONE.

        Polls ``STATUS`` and lets the tile run ``poll_cycles`` cycles between polls;
        ``on_poll()`` is called at every poll while the plan runs (the profiler drains
        the trace FIFO there).

        Returns
        -------
        The final ``STATUS`` view.

        Raises
        ------
        TileFault
            If the tile stopped on a fault (cause, PCs and address decoded).
        TimeoutError
            If the plan neither finished nor faulted within ``timeout_cycles``.
        """
        for name, value in (("timeout_cycles", timeout_cycles), ("poll_cycles", poll_cycles)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        waited = 0
        while True:
            status = self.status()
            if int(status.faulted):
                raise self._read_fault()
            if int(status.done) and not int(status.running):
                return status
            if waited >= timeout_cycles:
                raise TimeoutError(f"tile not done after {waited} cycles "
                                   f"(running={int(status.running)}, "
                                   f"plan pc {int(self.regs.PC.read().plan)})")
            if on_poll is not None:
                on_poll()
            step = min(poll_cycles, timeout_cycles - waited)
            self.transport.wait_cycles(step)
            waited += step

    # -- counters -------------------------------------------------------------------
    def _read_counters(self, entries):
        values = {}
        # LO then HI, in address order: reading LO latches HI, so each pair is atomic.
        for run in _contiguous_runs(entries, 8):
            words = self.transport.read_burst(run[0].addr, 2 * len(run))
            for i, entry in enumerate(run):
                values[entry.item.name] = words[2 * i] | words[2 * i + 1] << 32
        return values

    def counter(self, name):
        """The 64-bit counter ``name`` (lower-case, from ``regmap.COUNTERS``)."""
        known = [n for n, _ in regmap.COUNTERS if n.upper() in self.memory_map]
        if name not in known:
            raise KeyError(f"No counter named {name!r} on this tile; its counters are: "
                           f"{', '.join(known)}")
        entry = self.memory_map[name.upper()]
        return self._read_counters([entry])[entry.item.name]

    def counters(self):
        """All global counters: {name: int}, names lower-case as in ``regmap.COUNTERS``
        (less ``regmap.DEBUG_COUNTERS`` on a tile without them: ``debug_regs``)."""
        values = self._read_counters(self.memory_map.group("counter"))
        return {name: values[name.upper()] for name, _ in regmap.COUNTERS
                if name.upper() in values}

    def _indexed_counters(self, prefix, names, count):
        entries = [e for e in self.memory_map.counters()
                   if e.group.startswith(f"{prefix.lower()}_counter_")]
        values = self._read_counters(entries)
        return [{name: values[f"{prefix}_{name.upper()}[{i}]"] for name, _ in names}
                for i in range(count)]

    def slot_counters(self):
        """Per-slot counters: a list (index = slot) of {name: int}, names as in
        ``regmap.SLOT_COUNTERS``. Empty if the tile has no per-slot counters."""
        if not self.config.slot_counters:
            return []
        return self._indexed_counters("SLOT", regmap.SLOT_COUNTERS, self.config.kernel_slots)

    def bank_counters(self):
        """Per-bank scratchpad counters: a list (index = bank) of {"reads": int,
        "writes": int}. Empty if the tile has no per-bank counters."""
        if not self.config.bank_counters:
            return []
        return self._indexed_counters("BANK", regmap.BANK_COUNTERS, self.config.spad_banks)

    def branch_counters(self):
        """Per-flag branch counters: a list (index = flag) of {"taken": int,
        "not_taken": int}, counting the BRANCHes that tested that flag. Empty if the
        tile has no per-flag branch counters."""
        if not self.config.branch_counters:
            return []
        return self._indexed_counters("BRANCH", regmap.BRANCH_COUNTERS, FLAGS)

    def freeze_counters(self, freeze=True):
        """Stop (or restart) all counters."""
        self.regs.PERF_CTRL.modify(freeze=int(bool(freeze)))

    def clear_counters(self):
        """Zero all counters."""
        self.regs.PERF_CTRL.modify(clear=1)

    # -- windows ---------------------------------------------------------------------
    def _window(self, name, offset, length):
        try:
            entry = self.memory_map[name]
        except KeyError:
            names = [e.item.name for e in self.memory_map.windows()]
            raise KeyError(f"No window named {name!r}; windows are: {', '.join(names)}") from None
        if not isinstance(entry.item, Window):
            raise KeyError(f"{name!r} is not a window")
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise TypeError(f"Window offset must be an integer, not {offset!r}")
        if offset < 0 or length < 0 or offset + length > entry.item.size:
            raise ValueError(f"Bytes {offset:#x}..{offset + length:#x} are outside window "
                             f"{name} ({entry.item.size:#x} bytes)")
        return entry

    def write_window(self, name, offset, data):
        """Write ``data`` (bytes) to window ``name`` at byte ``offset``.

        Whole bus words are written in one burst; a partial word at the head or tail is
        read, merged and written back.
        """
        data = bytes(data)
        entry = self._window(name, offset, len(data))
        if not entry.item.writable:
            raise ValueError(f"Window {name} is read-only")
        if not data:
            return
        start = offset - offset % _BUS_BYTES
        end = -(-(offset + len(data)) // _BUS_BYTES) * _BUS_BYTES
        buf = bytearray(end - start)
        head, tail = offset - start, end - (offset + len(data))
        if head:
            buf[0:_BUS_BYTES] = self.transport.read32(entry.addr + start).to_bytes(4, "little")
        if tail and (end - _BUS_BYTES > start or not head):
            buf[-_BUS_BYTES:] = self.transport.read32(
                entry.addr + end - _BUS_BYTES).to_bytes(4, "little")
        buf[head:head + len(data)] = data
        words = [int.from_bytes(buf[i:i + 4], "little") for i in range(0, len(buf), 4)]
        self.transport.write_burst(entry.addr + start, words)

    def read_window(self, name, offset, length):
        """Read ``length`` bytes from window ``name`` at byte ``offset``."""
        if not isinstance(length, int) or isinstance(length, bool):
            raise TypeError(f"length must be an integer, not {length!r}")
        entry = self._window(name, offset, length)
        if not length:
            return b""
        start = offset - offset % _BUS_BYTES
        end = -(-(offset + length) // _BUS_BYTES) * _BUS_BYTES
        words = self.transport.read_burst(entry.addr + start, (end - start) // _BUS_BYTES)
        raw = b"".join(w.to_bytes(4, "little") for w in words)
        return raw[offset - start:offset - start + length]

    def _write_instrs(self, window, instrs, bits, start):
        entry = self.memory_map[window]
        depth = entry.item.size * 8 // bits
        values = []
        for i, instr in enumerate(instrs):
            if isinstance(instr, data.Const):
                instr = instr.as_bits()
            if not isinstance(instr, int) or isinstance(instr, bool):
                raise TypeError(f"Instruction {i} must be an integer or a data.Const, "
                                f"not {instr!r}")
            if not 0 <= instr < 1 << bits:
                raise ValueError(f"Instruction {i} must be a {bits}-bit unsigned integer, "
                                 f"not {instr:#x}")
            values.append(instr)
        if not isinstance(start, int) or not 0 <= start or start + len(values) > depth:
            raise ValueError(f"{len(values)} instructions from index {start} do not fit in "
                             f"{window} ({depth} instructions)")
        words_per = bits // 32
        # Low word first: an element is complete when its last bus word is written.
        words = [w for v in values for w in _int_to_words(v, words_per)]
        if words:
            self.transport.write_burst(entry.addr + start * bits // 8, words)

    def _read_instrs(self, window, count, bits, start):
        entry = self.memory_map[window]
        words_per = bits // 32
        words = self.transport.read_burst(entry.addr + start * bits // 8, count * words_per)
        return [_words_to_int(words[i:i + words_per]) for i in range(0, len(words), words_per)]

    def _index(self, kind, index, limit):
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < limit:
            raise ValueError(f"{kind} must be an integer from 0 to {limit - 1}, not {index!r}")

    def write_plan(self, bank, instrs, *, start=0):
        """Write 64-bit plan instructions (ints or ``PlanInstr`` consts) into plan bank
        ``bank`` from instruction index ``start``."""
        self._index("Plan bank", bank, 2)
        self._write_instrs(f"PLAN[{bank}]", instrs, PLAN_INSTR_BITS, start)

    def load_plan(self, instrs):
        """Write a plan into the inactive bank and request the swap; return that bank.

        An idle tile swaps at once; a running one at its next DONE, so the plan being
        run is never split (poll ``status().swap_pending`` to see the swap taken).
        """
        bank = 1 - int(self.status().active_bank)
        self.write_plan(bank, instrs)
        self.request_swap()
        return bank

    def load_kernel(self, slot, instrs, *, part, version=0):
        """Write a kernel into slot ``slot`` and mark it valid, bound to partition ``part``.

        ``version`` is the slot's version tag, for the host's own bookkeeping; a tile
        built without them (``HWCFG_CTRL.no_slot_versions``) takes only 0.

        Raises :class:`BusError` if the slot is executing (the tile refuses the write),
        :class:`ValueError` for a version the tile has no place for.
        """
        self._index("Kernel slot", slot, self.config.kernel_slots)
        if self.config.slot_versions:
            tag = {"version": version}
        elif version:
            raise ValueError(f"this tile keeps no kernel version tags "
                             f"(HWCFG_CTRL.no_slot_versions): version must be 0, "
                             f"not {version!r}")
        else:
            tag = {}
        self.regs.SLOT[slot].write(valid=0, part=part, **tag)
        self.write_kernel(slot, instrs)
        self.regs.SLOT[slot].write(valid=1, part=part, **tag)

    def set_partition(self, index, *, base, length):
        """Carve scratchpad partition ``index`` as words [base, base + length).

        Raises :class:`ValueError` if ``base`` is not a multiple of ``spad_banks`` (the
        tile would fault every access to such a partition), or on a tile with one
        partition, which is the whole scratchpad (no ``PART`` register), if the
        partition asked for is not that."""
        self._index("Partition", index, self.config.partitions)
        if self.config.partitions == 1:
            words = self.config.spad_words
            if (base, length) != (0, words):
                raise ValueError(f"Partition 0: this tile has one partition, the whole "
                                 f"scratchpad (base 0, length {words}), not base {base}, "
                                 f"length {length}")
            return
        banks = self.config.spad_banks
        if base % banks:
            raise ValueError(f"Partition {index}: base {base} is not a multiple of "
                             f"spad_banks ({banks}); a partition starts at a bank's "
                             f"first word")
        self.regs.PART[index].write(base=base, length=length)

    def read_plan(self, bank, count, *, start=0):
        """Read ``count`` plan instructions of bank ``bank`` as ints."""
        self._index("Plan bank", bank, 2)
        return self._read_instrs(f"PLAN[{bank}]", count, PLAN_INSTR_BITS, start)

    def write_kernel(self, slot, instrs, *, start=0):
        """Write 128-bit micro-instructions (ints or ``MicroInstr`` consts) into kernel
        slot ``slot`` from instruction index ``start``."""
        self._index("Kernel slot", slot, self.config.kernel_slots)
        self._write_instrs(f"KERNEL[{slot}]", instrs, MICRO_INSTR_BITS, start)

    def read_kernel(self, slot, count, *, start=0):
        """Read ``count`` micro-instructions of kernel slot ``slot`` as ints."""
        self._index("Kernel slot", slot, self.config.kernel_slots)
        return self._read_instrs(f"KERNEL[{slot}]", count, MICRO_INSTR_BITS, start)

    # -- trace ------------------------------------------------------------------------
    def read_trace(self):
        """Drain the trace FIFO: a list of ``TraceRecord`` views, oldest first. Empty
        if the tile has no trace FIFO (``config.trace_depth`` 0)."""
        if not self.config.traced:
            return []
        level = int(self.regs.TRACE_STATUS.read().level)
        if not level:
            return []
        words = self.transport.read_burst(self.regs.TRACE_DATA.addr, level * regmap.TRACE_WORDS,
                                          increment=False)
        n = regmap.TRACE_WORDS
        return [TraceRecord.from_bits(_words_to_int(words[i:i + n]))
                for i in range(0, len(words), n)]

    def trace_dropped(self):
        """Trace records dropped because the FIFO was full (saturating); 0 if the tile
        has no trace FIFO."""
        if not self.config.traced:
            return 0
        return int(self.regs.TRACE_STATUS.read().dropped)
