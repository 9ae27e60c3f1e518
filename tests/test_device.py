"""Device: typed registers, counters, windows, trace and control, against a Python
model of the tile's bus behaviour (fast) and the Amaranth stand-in (end to end)."""

import pytest

from fusetile.hdl import regmap
from fusetile.hdl.regmap import tile_memory_map, hwcfg_values, DEBUG_COUNTERS, TRACE_WORDS
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import PlanInstr, PlanOp, MicroInstr, MicroOp, FaultCause, TraceRecord
from fusetile.host.transport import Transport, BusError
from fusetile.host.device import Device, TileFault
from fusetile.host.amaranth_sim import AmaranthTransport

from test_transport import StandInTile


CONFIG = TileConfig()


class FakeTile(Transport):
    """The bus behaviour of a tile, in Python, for testing Device quickly.

    Registers are words in a dict, identity registers are constants, windows are byte
    arrays; CTRL.start makes the tile run for ``run_cycles`` cycles of ``wait_cycles``
    and then finish (or fault with ``fault``); counters latch HI when LO is read and
    advance on every bus access; TRACE_DATA pops words from ``trace``.
    """

    def __init__(self, config=CONFIG, *, run_cycles=None, fault=None):
        super().__init__()
        self.config = config
        self.mm = tile_memory_map(config)
        self.words = dict((self.mm.addr(n), v) for n, v in hwcfg_values(config).items())
        self.windows = {e.item.name: bytearray(e.item.size) for e in self.mm.windows()}
        self.counters = {e.item.name: 0 for e in self.mm.counters()}
        self.latched = {}
        self.trace = []
        self.log = []
        self.run_cycles = run_cycles
        self.fault = fault
        self.remaining = None
        self.waited = 0

    def _status(self, **fields):
        addr = self.mm.addr("STATUS")
        reg = self.mm["STATUS"].item
        old = reg.unpack(self.words.get(addr, 0))
        values = {f.name: int(getattr(old, f.name)) for f in reg.fields}
        values.update(fields)
        self.words[addr] = reg.pack(**values)

    def _tick_counters(self):
        for name in self.counters:
            self.counters[name] += 1

    def _read32(self, addr):
        self.log.append(("r", addr))
        self._tick_counters()
        entry = self.mm.lookup(addr)
        if entry is None:
            raise self._bus_error(addr, False)
        item, offset = entry.item, addr - entry.addr
        if isinstance(item, regmap.Window):
            return int.from_bytes(self.windows[item.name][offset:offset + 4], "little")
        if isinstance(item, regmap.Counter):
            if offset == 0:
                value = self.counters[item.name]
                self.latched[item.name] = value >> 32
                return value & 0xFFFF_FFFF
            return self.latched.get(item.name, 0)
        if item.name == "TRACE_STATUS":
            return item.pack(level=len(self.trace) // TRACE_WORDS)
        if item.name == "TRACE_DATA":
            return self.trace.pop(0) if self.trace else 0
        return self.words.get(addr, 0)

    def _write32(self, addr, value):
        self.log.append(("w", addr, value))
        self._tick_counters()
        entry = self.mm.lookup(addr)
        if entry is None:
            raise self._bus_error(addr, True)
        item, offset = entry.item, addr - entry.addr
        if isinstance(item, regmap.Window):
            self.windows[item.name][offset:offset + 4] = value.to_bytes(4, "little")
            return
        if item.name == "CTRL":
            ctrl = item.unpack(value)
            if ctrl.start:
                self._status(running=1, done=0)
                self.remaining = self.run_cycles
            if ctrl.clear_fault:
                self._status(faulted=0)
            return
        self.words[addr] = value

    def wait_cycles(self, n):
        self.waited += n
        if self.remaining is None:
            return
        self.remaining -= n
        if self.remaining <= 0:
            self.remaining = None
            if self.fault is None:
                self._status(running=0, done=1)
            else:
                cause, plan_pc, micro_pc, addr = self.fault
                self._status(running=0, faulted=1)
                fault = self.mm["FAULT"].item
                # OR the cause in by its offset: pack() refuses values the enum lacks.
                cause_offset = dict((f.name, o) for f, o in fault.field_offsets())["cause"]
                self.words[self.mm.addr("FAULT")] = (
                    fault.pack(in_kernel=1, slot=2, part=3) | getattr(cause, "value", cause) << cause_offset)
                self.words[self.mm.addr("FAULT_PC")] = self.mm["FAULT_PC"].item.pack(
                    plan=plan_pc, micro=micro_pc)
                self.words[self.mm.addr("FAULT_ADDR")] = addr


@pytest.fixture
def fake():
    return FakeTile()


@pytest.fixture
def dev(fake):
    return Device(fake)


# -- discovery -------------------------------------------------------------------------

def test_device_discovers_its_config(fake):
    dev = Device(fake)
    assert dev.config == CONFIG
    assert dev.memory_map is tile_memory_map(CONFIG)
    assert fake.memory_map is dev.memory_map


def test_hardware_profile_round_trip_other_config():
    config = TileConfig(rows=4, cols=16, spad_banks=2, spad_bank_words=256, partitions=4,
                        kernel_slots=4, slot_depth=32, plan_depth=64, gmem_bytes=16384,
                        trace_depth=16, slot_counters=False, branch_counters=False,
                        bank_counters=False)
    dev = Device(FakeTile(config))
    assert dev.config == config
    assert dev.hardware_profile() == config
    assert dev.version() == regmap.VERSION
    assert len(dev.regs.PART) == 4 and len(dev.regs.SLOT) == 4
    assert dev.slot_counters() == [] and dev.branch_counters() == [] and \
        dev.bank_counters() == []
    assert not any("[" in e.item.name for e in dev.memory_map.counters())   # indexed
    # One set left out, the others there.
    config = TileConfig(branch_counters=False)
    dev = Device(FakeTile(config))
    assert dev.config == config and dev.branch_counters() == []
    assert len(dev.bank_counters()) == config.spad_banks


def test_a_tile_without_a_trace_fifo():
    """trace_depth 0: HWCFG_CTRL's trace_depth_log2 reads 0, the TRACE registers are not
    in the map, and the trace reads are empty without a bus access."""
    config = TileConfig(trace_depth=0)
    assert not config.traced and TileConfig().traced
    ctrl = tile_memory_map(config)["HWCFG_CTRL"].item
    assert ctrl.unpack(hwcfg_values(config)["HWCFG_CTRL"]).trace_depth_log2 == 0
    fake = FakeTile(config)
    dev = Device(fake)
    assert dev.config == config and dev.hardware_profile() == config
    assert "TRACE_STATUS" not in dev.memory_map and "TRACE_DATA" not in dev.memory_map
    assert "TRACE_STATUS" in tile_memory_map(TileConfig())
    before = fake.words_read
    assert dev.read_trace() == [] and dev.trace_dropped() == 0
    assert fake.words_read == before
    with pytest.raises(ValueError, match="trace_depth must be 0 .no trace FIFO. or at least "
                                         "2, not 1"):
        TileConfig(trace_depth=1)
    with pytest.raises(ValueError, match="trace_depth must be a power of two, not 3"):
        TileConfig(trace_depth=3)


def test_a_tile_without_speculation():
    """staging_words 0: HWCFG_CTRL's staging_words_log2 reads 0, and the profile reads
    back so (the iCEBreaker's, with no trace FIFO either)."""
    config = TileConfig(staging_words=0, trace_depth=0)
    assert not config.speculates and TileConfig().speculates
    ctrl = tile_memory_map(config)["HWCFG_CTRL"].item
    assert ctrl.unpack(hwcfg_values(config)["HWCFG_CTRL"]).staging_words_log2 == 0
    assert Device(FakeTile(config)).config == config
    with pytest.raises(ValueError, match="staging_words must be 0 .no speculation. or at "
                                         "least 2, not 1"):
        TileConfig(staging_words=1)


def test_a_tile_without_decisions_or_averages():
    """decisions and pool_average False: HWCFG_CTRL's no_decisions and HWCFG_ARRAY's
    no_pool_average read 1, and the profile reads back so; a tile that has them (every
    tile before the fields) reads 0 in both."""
    config = TileConfig(decisions=False, pool_average=False)
    mm = tile_memory_map(config)
    values = hwcfg_values(config)
    assert mm["HWCFG_CTRL"].item.unpack(values["HWCFG_CTRL"]).no_decisions == 1
    assert mm["HWCFG_ARRAY"].item.unpack(values["HWCFG_ARRAY"]).no_pool_average == 1
    assert Device(FakeTile(config)).config == config
    for one in ({"decisions": False}, {"pool_average": False}):
        assert Device(FakeTile(TileConfig(**one))).config == TileConfig(**one)
    values = hwcfg_values(TileConfig())
    assert (values["HWCFG_CTRL"] >> 31, values["HWCFG_ARRAY"] >> 31) == (0, 0)


def test_a_tile_without_word_ops():
    """word_ops False: HWCFG_GMEM.no_word_ops (bit 24, above any GMEM size) reads 1 and
    the profile reads back so; a tile that has them (every tile before the field)
    reads 0 there."""
    config = TileConfig(word_ops=False, gmem_bytes=1 << 20)
    mm = tile_memory_map(config)
    gmem = mm["HWCFG_GMEM"].item.unpack(hwcfg_values(config)["HWCFG_GMEM"])
    assert (gmem.no_word_ops, gmem.bytes) == (1, 1 << 20)
    assert hwcfg_values(TileConfig())["HWCFG_GMEM"] >> 24 == 0
    assert Device(FakeTile(config)).config == config


def test_a_tile_without_a_watchdog():
    """watchdog False: HWCFG_GMEM.no_watchdog (bit 25) reads 1, the profile reads back
    so, and the map has no WATCHDOG register (a tile with one reads 0 there)."""
    config = TileConfig(watchdog=False, word_ops=False)
    mm = tile_memory_map(config)
    gmem = mm["HWCFG_GMEM"].item.unpack(hwcfg_values(config)["HWCFG_GMEM"])
    assert (gmem.no_watchdog, gmem.no_word_ops) == (1, 1)
    assert "WATCHDOG" not in mm and "WATCHDOG" in tile_memory_map(TileConfig())
    assert hwcfg_values(TileConfig())["HWCFG_GMEM"] >> 25 == 0
    dev = Device(FakeTile(config))
    assert dev.config == config and "WATCHDOG" not in dev.regs


def test_a_tile_without_debug_regs():
    """debug_regs False: HWCFG_GMEM.no_debug_regs (bit 26) reads 1, the profile reads
    back so, and the map has neither MARK nor REFUSED_ADDR nor the debugging counters
    (a tile with them reads 0 there)."""
    config = TileConfig(debug_regs=False, watchdog=False)
    mm = tile_memory_map(config)
    value = hwcfg_values(config)["HWCFG_GMEM"]
    gmem = mm["HWCFG_GMEM"].item.unpack(value)
    assert (gmem.no_debug_regs, gmem.no_watchdog, gmem.no_word_ops) == (1, 1, 0)
    assert value >> 26 == 1
    for name in ("MARK", "REFUSED_ADDR", *(c.upper() for c in DEBUG_COUNTERS)):
        assert name not in mm and name in tile_memory_map(TileConfig())
    assert hwcfg_values(TileConfig())["HWCFG_GMEM"] >> 26 == 0
    dev = Device(FakeTile(config))
    assert dev.config == config
    assert "MARK" not in dev.regs and "REFUSED_ADDR" not in dev.regs
    assert Device(FakeTile(TileConfig(debug_regs=False))).config == \
        TileConfig(debug_regs=False)


def test_a_tile_without_slot_versions():
    """slot_versions False: HWCFG_CTRL's no_slot_versions (bit 7, above any slot count)
    reads 1 and the profile reads back so; SLOT[i] has no version field, and
    load_kernel takes version 0 only. A tile that has them reads 0 there."""
    config = TileConfig(slot_versions=False)
    mm = tile_memory_map(config)
    ctrl = mm["HWCFG_CTRL"].item.unpack(hwcfg_values(config)["HWCFG_CTRL"])
    assert (ctrl.no_slot_versions, ctrl.kernel_slots) == (1, config.kernel_slots)
    dev = Device(FakeTile(config))
    assert dev.config == config
    assert dev.regs.SLOT[0].fields == ["valid", "part", "_pad"]
    dev.load_kernel(2, [], part=1)
    assert (dev.regs.SLOT[2].read().valid, dev.regs.SLOT[2].read().part) == (1, 1)
    with pytest.raises(ValueError, match="this tile keeps no kernel version tags"):
        dev.load_kernel(2, [], part=1, version=3)
    with pytest.raises(TypeError, match="Register SLOT.3. has no field 'version'"):
        dev.regs.SLOT[3].write(valid=1, version=3)
    assert hwcfg_values(TileConfig())["HWCFG_CTRL"] >> 7 & 1 == 0
    with_tags = Device(FakeTile(TileConfig()))
    with_tags.load_kernel(2, [], part=1, version=3)
    assert with_tags.regs.SLOT[2].read().version == 3


def test_a_tile_without_a_dma_queue():
    """dma_queue 0: HWCFG_CTRL's dma_queue_log2 reads NO_DMA_QUEUE (7, beyond any depth's
    log2), and the profile reads back so; the depths read back as they are."""
    mm = tile_memory_map(TileConfig())
    for depth, log2 in ((0, regmap.NO_DMA_QUEUE), (1, 0), (16, 4)):
        config = TileConfig(dma_queue=depth)
        ctrl = mm["HWCFG_CTRL"].item.unpack(hwcfg_values(config)["HWCFG_CTRL"])
        assert ctrl.dma_queue_log2 == log2
        assert Device(FakeTile(config)).config == config
    with pytest.raises(ValueError, match="dma_queue must be a power of two, not 3"):
        TileConfig(dma_queue=3)


def test_counter_sets_of_a_tile_before_register_map_0_3():
    """A tile before 0.3 reads 0 in HWCFG_CTRL's branch_counters and bank_counters
    bits, and has both sets of counters."""
    values = hwcfg_values(TileConfig())
    mm = tile_memory_map(TileConfig())
    ctrl = mm["HWCFG_CTRL"].item
    fields = ctrl.unpack(values["HWCFG_CTRL"])
    cleared = ctrl.pack(**{f.name: getattr(fields, f.name) for f in ctrl.fields} |
                        {"branch_counters": 0, "bank_counters": 0})
    version = mm["VERSION"].item.pack(major=0, minor=2, patch=0)
    old = values | {"HWCFG_CTRL": cleared, "VERSION": version}
    assert regmap.config_from_hwcfg(old) == TileConfig()
    now = values | {"HWCFG_CTRL": cleared}
    assert regmap.config_from_hwcfg(now) == TileConfig(branch_counters=False,
                                                       bank_counters=False)


def test_config_switches_are_bools():
    for name in ("slot_counters", "branch_counters", "bank_counters"):
        with pytest.raises(TypeError, match=f"{name} must be a bool, not 1"):
            TileConfig(**{name: 1})


def test_vector_lanes_round_trip():
    """HWCFG_ARRAY.vector_lanes: a tile with fewer vector lanes than word bytes says
    how many; all of them, or 0 (a tile before register map 0.2), read back as None."""
    config = TileConfig(word_bytes=8, vector_lanes=2)
    assert Device(FakeTile(config)).config == config
    assert config.as_built()["vector_lanes"] == 2 and config.vector_passes == 4
    assert TileConfig(vector_lanes=8) == TileConfig()        # one profile for the default
    assert TileConfig(vector_lanes=8).profile_hash == TileConfig().profile_hash
    values = hwcfg_values(TileConfig())
    array = tile_memory_map(TileConfig())["HWCFG_ARRAY"].item
    assert array.unpack(values["HWCFG_ARRAY"]).vector_lanes == 8
    old = values | {"HWCFG_ARRAY": values["HWCFG_ARRAY"] & 0x00FFFFFF}
    assert regmap.config_from_hwcfg(old) == TileConfig()
    assert TileConfig().as_built()["vector_lanes"] == 8


def test_not_a_fusetile(fake):
    fake.words[fake.mm.addr("ID")] = 0x12345678
    with pytest.raises(ValueError, match="not the fusetile magic"):
        Device(fake)


def test_explicit_config_skips_discovery(fake):
    Device(fake, config=CONFIG)
    assert fake.log == []
    with pytest.raises(TypeError, match=r"transport must be a Transport, not 3"):
        Device(3)
    with pytest.raises(TypeError, match=r"config must be a TileConfig or None, not 'x'"):
        Device(fake, config="x")


# -- typed register access ------------------------------------------------------------------

def test_register_read_write_view(dev, fake):
    dev.regs["PART[2]"].write(base=0x40, length=64)
    view = dev.regs.PART[2].read()
    assert (view.base, view.length) == (0x40, 64)
    assert fake.log[-2][0] == "w" and fake.log[-2][1] == fake.mm.addr("PART[2]")
    assert dev.regs.PART[2] is dev.regs["PART[2]"]
    assert dev.regs.PART[2].fields == ["base", "length"]
    assert "STATUS" in dir(dev.regs) and "PART" in dir(dev.regs)
    assert sum(1 for _ in dev.regs) == len(fake.mm.registers())


def test_status_fields_by_attribute(dev, fake):
    fake._status(running=1, slot=5)
    status = dev.status()
    assert status.running == 1 and status.done == 0 and status.slot == 5


def test_modify_keeps_other_fields(dev):
    dev.regs.SLOT[1].write(valid=1, part=3, version=7)
    new = dev.regs.SLOT[1].modify(version=9)
    view = dev.regs.SLOT[1].read()
    assert (view.valid, view.part, view.version) == (1, 3, 9)
    assert new.version == 9
    dev.regs.WATCHDOG.modify(limit=123_456)
    assert dev.regs.WATCHDOG.read().limit == 123_456


def test_modify_never_fires_triggers(dev, fake):
    dev.regs.PERF_CTRL.write(freeze=1, clear=1)
    fake.log.clear()
    dev.regs.PERF_CTRL.modify(freeze=0)
    written = fake.log[-1][2]
    assert dev.regs.PERF_CTRL.register.unpack(written).clear == 0


def test_unknown_field_is_a_clear_error(dev, fake):
    fake.log.clear()
    with pytest.raises(TypeError, match=r"Register CTRL has no field 'strat'; its fields are: "
                                        r"start, swap, clear_fault, abort"):
        dev.regs.CTRL.write(strat=1)
    assert fake.log == []


def test_too_wide_value_raises(dev, fake):
    fake.log.clear()
    with pytest.raises(ValueError, match=r"SLOT\[0\]\.part is 4 bits wide: 16 does not fit"):
        dev.regs.SLOT[0].write(part=16)
    with pytest.raises(ValueError, match="does not fit"):
        dev.regs.PART[0].write(base=-1)
    with pytest.raises(TypeError, match=r"WATCHDOG\.limit must be an integer, not 1\.5"):
        dev.regs.WATCHDOG.write(limit=1.5)
    assert fake.log == []


def test_partition_base_off_a_bank_row_raises(dev, fake):
    fake.log.clear()
    banks = dev.config.spad_banks
    with pytest.raises(ValueError, match=rf"Partition 1: base 6 is not a multiple of "
                                         rf"spad_banks \({banks}\)"):
        dev.set_partition(1, base=6, length=8)
    assert fake.log == []
    dev.set_partition(1, base=2 * banks, length=8)
    assert dev.regs.PART[1].read().base == 2 * banks


def test_read_only_registers_are_not_written(dev, fake):
    fake.log.clear()
    with pytest.raises(ValueError, match="Register STATUS is read-only"):
        dev.regs.STATUS.write(running=1)
    with pytest.raises(ValueError, match="Register ID is read-only"):
        dev.regs.ID.write_raw(0)
    with pytest.raises(ValueError, match="Register FAULT is read-only"):
        dev.regs.FAULT.modify(cause=FaultCause.WATCHDOG)
    with pytest.raises(ValueError, match=r"Field SLOT\[0\]\._pad is read-only"):
        dev.regs.SLOT[0].write(_pad=1)
    with pytest.raises(ValueError, match="Register CTRL is write-only"):
        dev.regs.CTRL.read()
    assert fake.log == []


def test_unknown_register(dev):
    with pytest.raises(AttributeError, match="No register named 'STATUZ'"):
        dev.regs.STATUZ
    with pytest.raises(KeyError, match="No register named 'PART\\[99\\]'"):
        dev.regs["PART[99]"]


def test_enum_field_accepts_members(dev):
    # FAULT is read-only; pack an enum through a register handle's checker directly.
    handle = dev.regs.FAULT
    assert handle._pack(0, {}) == 0
    reg = handle.register
    assert reg.unpack(reg.pack(cause=FaultCause.PARTITION)).cause is FaultCause.PARTITION


# -- counters -------------------------------------------------------------------------------

def test_counter_reads_lo_then_hi(dev, fake):
    fake.counters["CYCLES"] = (5 << 32) | 0xFFFF_FFF0
    fake.log.clear()
    # The fake advances every counter on each access: HI must come from the latch.
    assert dev.counter("cycles") == (5 << 32) | 0xFFFF_FFF1
    lo = fake.mm.addr("CYCLES")
    assert fake.log == [("r", lo), ("r", lo + 4)]


def test_counters_all_names(dev, fake):
    for i, name in enumerate(fake.counters):
        fake.counters[name] = (i << 32) | (0x100 * i)
    values = dev.counters()
    assert list(values) == [name for name, _ in regmap.COUNTERS]
    assert values["inferences"] >> 32 == [n for n, _ in regmap.COUNTERS].index("inferences")
    addrs = [e[1] for e in fake.log if e[0] == "r"][-2 * len(regmap.COUNTERS):]
    assert addrs == sorted(addrs)


def test_unknown_counter(dev):
    with pytest.raises(KeyError, match="No counter named 'cycle' on this tile; its counters "
                                       "are: cycles, "):
        dev.counter("cycle")
    # A counter the tile is built without (debug_regs False): not among its counters.
    lean = Device(FakeTile(TileConfig(debug_regs=False)))
    with pytest.raises(KeyError, match="No counter named 'faults' on this tile; its "
                                       "counters are: cycles, active_cycles, .*, kernel_calls, "
                                       "inferences, spec_hits"):
        lean.counter("faults")


def test_slot_counters(dev, fake):
    fake.counters["SLOT_CALLS[3]"] = 41
    fake.counters["SLOT_CYCLES[3]"] = 7 << 32
    slots = dev.slot_counters()
    assert len(slots) == CONFIG.kernel_slots
    assert slots[3]["calls"] > 41 and slots[3]["cycles"] >> 32 == 7
    assert list(slots[0]) == [name for name, _ in regmap.SLOT_COUNTERS]


def test_counter_control(dev, fake):
    dev.freeze_counters()
    assert dev.regs.PERF_CTRL.read().freeze == 1
    dev.clear_counters()
    writes = [e for e in fake.log if e[0] == "w"]
    view = dev.regs.PERF_CTRL.register.unpack(writes[-1][2])
    assert view.clear == 1 and view.freeze == 1


# -- windows ----------------------------------------------------------------------------------

@pytest.mark.parametrize("offset,length", [(0, 16), (1, 2), (3, 6), (5, 1), (4, 4), (2, 13),
                                           (0, 0)])
def test_window_round_trip_unaligned(dev, fake, offset, length):
    fake.windows["GMEM"][:64] = bytes(range(0x80, 0xC0))
    data = bytes(range(1, length + 1))
    dev.write_window("GMEM", offset, data)
    expect = bytearray(range(0x80, 0xC0))
    expect[offset:offset + length] = data
    assert fake.windows["GMEM"][:64] == expect      # neighbours kept
    assert dev.read_window("GMEM", offset, length) == data


def test_window_bounds(dev, fake):
    size = CONFIG.gmem_bytes
    dev.write_window("GMEM", size - 3, b"abc")
    assert dev.read_window("GMEM", size - 3, 3) == b"abc"
    fake.log.clear()
    with pytest.raises(ValueError, match=r"outside window GMEM \(0x10000 bytes\)"):
        dev.write_window("GMEM", size - 2, b"abc")
    with pytest.raises(ValueError, match="outside window"):
        dev.read_window("GMEM", -1, 2)
    with pytest.raises(KeyError, match="No window named 'GMEN'; windows are: PLAN"):
        dev.read_window("GMEN", 0, 4)
    with pytest.raises(KeyError, match="'STATUS' is not a window"):
        dev.read_window("STATUS", 0, 4)
    assert fake.log == []


def test_window_uses_bursts(dev, fake):
    fake.log.clear()
    dev.write_window("GMEM", 8, bytes(64))
    assert [e[0] for e in fake.log] == ["w"] * 16
    assert [e[1] for e in fake.log] == [fake.mm.addr("GMEM") + 8 + 4 * i for i in range(16)]


def test_write_plan_and_kernel(dev, fake):
    plan = [PlanInstr.const({"op": PlanOp.CALL, "sel": 1, "a": 0x10, "b": 0x20}),
            PlanInstr.const({"op": PlanOp.DONE}).as_bits()]
    dev.write_plan(1, plan, start=2)
    raw = fake.windows["PLAN[1]"]
    assert int.from_bytes(raw[16:24], "little") == plan[0].as_bits()
    assert int.from_bytes(raw[24:32], "little") == plan[1]
    assert dev.read_plan(1, 2, start=2) == [plan[0].as_bits(), plan[1]]
    # Low word first within an instruction.
    words = [e for e in fake.log if e[0] == "w"]
    assert words[0][1] == fake.mm.addr("PLAN[1]") + 16
    micro = [MicroInstr.const({"op": MicroOp.RET}).as_bits(), (1 << 128) - 1]
    dev.write_kernel(3, micro)
    assert dev.read_kernel(3, 2) == micro


def test_write_plan_checks(dev, fake):
    fake.log.clear()
    with pytest.raises(ValueError, match=r"Instruction 1 must be a 64-bit unsigned integer"):
        dev.write_plan(0, [0, 1 << 64])
    with pytest.raises(ValueError, match=r"2 instructions from index 127 do not fit in "
                                         r"PLAN\[0\] \(128 instructions\)"):
        dev.write_plan(0, [0, 0], start=127)
    with pytest.raises(ValueError, match=r"Plan bank must be an integer from 0 to 1, not 2"):
        dev.write_plan(2, [])
    with pytest.raises(ValueError, match=r"Kernel slot must be an integer from 0 to 15, not 16"):
        dev.write_kernel(16, [])
    with pytest.raises(TypeError, match=r"Instruction 0 must be an integer or a data.Const"):
        dev.write_kernel(0, ["nop"])
    assert fake.log == []


# -- trace -------------------------------------------------------------------------------------

def test_read_trace_unpacks_records(dev, fake):
    records = [
        TraceRecord.const({"slot": 2, "bank": 1, "pc": 7, "start": 100, "cycles": 55,
                           "dma_busy": 30, "bytes_in": 256, "bytes_out": 64}),
        TraceRecord.const({"slot": 5, "faulted": 1, "pc": 9, "cycles": 0xFFFF_FFFF}),
    ]
    for rec in records:
        bits = rec.as_bits()
        fake.trace += [(bits >> (32 * i)) & 0xFFFF_FFFF for i in range(TRACE_WORDS)]
    fake.log.clear()
    got = dev.read_trace()
    assert [r.as_bits() for r in got] == [r.as_bits() for r in records]
    assert (got[0].slot, got[0].bank, got[0].cycles, got[0].bytes_in) == (2, 1, 55, 256)
    assert got[1].faulted == 1 and got[1].cycles == 0xFFFF_FFFF
    data_addr = fake.mm.addr("TRACE_DATA")
    assert fake.log[1:] == [("r", data_addr)] * (2 * TRACE_WORDS)
    assert dev.read_trace() == []


# -- control ------------------------------------------------------------------------------------

def test_start_and_wait_done():
    fake = FakeTile(run_cycles=200)
    dev = Device(fake)
    dev.start()
    assert dev.status().running == 1
    status = dev.wait_done(timeout_cycles=1000, poll_cycles=64)
    assert status.done == 1 and status.running == 0
    assert fake.waited == 256


def test_wait_done_timeout_never_hangs():
    fake = FakeTile(run_cycles=None)
    dev = Device(fake)
    dev.start()
    with pytest.raises(TimeoutError, match="tile not done after 100 cycles"):
        dev.wait_done(timeout_cycles=100, poll_cycles=30)
    assert fake.waited == 100


def test_wait_done_raises_tile_fault():
    fake = FakeTile(run_cycles=10, fault=(FaultCause.PARTITION, 4, 11, 0x1234))
    dev = Device(fake)
    dev.start()
    with pytest.raises(TileFault, match=r"tile faulted: PARTITION at plan bank 0 pc 4, "
                                        r"kernel slot 2 micro pc 11, partition 3, "
                                        r"address 0x1234") as info:
        dev.wait_done(timeout_cycles=1000)
    f = info.value
    assert f.cause is FaultCause.PARTITION and (f.plan_pc, f.micro_pc, f.addr) == (4, 11, 0x1234)
    assert dev.fault().cause is FaultCause.PARTITION
    dev.clear_fault()
    assert dev.status().faulted == 0 and dev.fault() is None


def test_unknown_fault_cause_is_an_int():
    fake = FakeTile(run_cycles=1, fault=(15, 0, 0, 0))
    dev = Device(fake)
    dev.start()
    with pytest.raises(TileFault, match="cause 15") as info:
        dev.wait_done()
    assert info.value.cause == 15


def test_control_helpers_write_ctrl(dev, fake):
    ctrl = fake.mm["CTRL"]
    for method, field in [(dev.start, "start"), (dev.request_swap, "swap"),
                          (dev.clear_fault, "clear_fault"), (dev.abort, "abort")]:
        method()
        assert fake.log[-1] == ("w", ctrl.addr, ctrl.item.pack(**{field: 1}))


def test_wait_done_checks_arguments(dev):
    with pytest.raises(ValueError, match="timeout_cycles must be a positive integer, not 0"):
        dev.wait_done(timeout_cycles=0)


def test_bus_error_surfaces(dev):
    with pytest.raises(BusError, match=r"\(unmapped\)"):
        dev.transport.read32(0x3000)


# -- end to end on the Amaranth stand-in ------------------------------------------------------------

def test_device_on_amaranth_stand_in():
    with AmaranthTransport(CONFIG, top=StandInTile(gmem_words=16)) as t:
        dev = Device(t)
        assert dev.config == CONFIG
        dev.regs.PART[2].write(base=0x10, length=0x20)
        assert dev.regs.PART[2].read().length == 0x20
        dev.write_window("GMEM", 3, b"\x11\x22\x33\x44\x55\x66")
        assert dev.read_window("GMEM", 0, 12) == b"\x00\x00\x00\x11\x22\x33\x44\x55\x66\x00\x00\x00"
        dev.regs.WATCHDOG.modify(limit=1000)
        assert dev.regs.WATCHDOG.read().limit == 1000
        with pytest.raises(BusError, match=r"KERNEL\[0\]"):
            dev.write_kernel(0, [1])


def test_device_on_real_tile():
    pytest.importorskip("fusetile.hdl.tile")
    with AmaranthTransport(CONFIG) as t:
        dev = Device(t)
        assert dev.config == CONFIG
        # The active bank (0 after reset) refuses writes: load bank 1 and swap to it.
        with pytest.raises(BusError, match=r"write to 0x00010000 \(PLAN\[0\]\)"):
            dev.write_plan(0, [0])
        dev.write_plan(1, [PlanInstr.const({"op": PlanOp.MARK, "a": 5}),
                           PlanInstr.const({"op": PlanOp.DONE})])
        dev.request_swap()
        t.wait_cycles(4)
        assert dev.status().active_bank == 1
        dev.start()
        status = dev.wait_done(timeout_cycles=1000, poll_cycles=8)
        assert status.done == 1 and dev.regs.MARK.read().value == 5
        counters = dev.counters()
        assert counters["inferences"] == 1 and counters["plan_retired"] == 2
        dev.write_window("GMEM", 5, b"hello")
        assert dev.read_window("GMEM", 4, 7) == b"\x00hello\x00"
        # CALL of an empty slot faults.
        dev.write_plan(0, [PlanInstr.const({"op": PlanOp.CALL, "sel": 3})])
        dev.request_swap()
        t.wait_cycles(4)
        dev.start()
        with pytest.raises(TileFault, match="SLOT_INVALID") as info:
            dev.wait_done(timeout_cycles=1000, poll_cycles=8)
        assert info.value.cause is FaultCause.SLOT_INVALID and info.value.plan_pc == 0
        dev.clear_fault()
        assert dev.status().faulted == 0


def test_trace_and_slot_counters_on_real_tile():
    pytest.importorskip("fusetile.hdl.tile")
    with AmaranthTransport(CONFIG) as t:
        dev = Device(t, config=CONFIG)
        dev.write_kernel(0, [MicroInstr.const({"op": MicroOp.NOP}),
                             MicroInstr.const({"op": MicroOp.RET})])
        dev.write_kernel(1, [MicroInstr.const({"op": MicroOp.RET})])
        dev.regs.PART[0].write(base=0, length=64)
        for slot in (0, 1):
            dev.regs.SLOT[slot].write(valid=1, part=0)
        call = lambda slot: PlanInstr.const({"op": PlanOp.CALL, "sel": slot})
        dev.write_plan(1, [call(0), call(1), call(0), PlanInstr.const({"op": PlanOp.DONE})])
        dev.request_swap()
        t.wait_cycles(4)
        dev.start()
        dev.wait_done(timeout_cycles=2000, poll_cycles=8)
        trace = dev.read_trace()
        assert [(r.slot, r.pc, r.bank) for r in trace] == [(0, 0, 1), (1, 1, 1), (0, 2, 1)]
        assert trace[0].start < trace[1].start < trace[2].start
        assert dev.read_trace() == []
        slots = dev.slot_counters()
        assert [s["calls"] for s in slots[:3]] == [2, 1, 0]
        assert slots[0]["cycles"] >= trace[0].cycles + trace[2].cycles > 0
        assert dev.counter("kernel_calls") == 3
