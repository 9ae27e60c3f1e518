# amaranth: UnusedElaboratable=no

"""The compute unit against a sequential reference built on kernels/arith.py.

The scratchpad is a behavioural model (``SpadModel``): a flat memory behind a partition
table, with read data that is only valid the cycle after a performed read, and stalls
injected at random on any port (``b`` also stalls whenever ``a`` reads the same bank in
the same cycle). Programs of compute commands run on the unit and on ``Ref``; after each
command the whole scratchpad, the flag / index writes, the MAC and saturation counts
and the fault state are compared. ACC is observed through REQUANT.
"""

import random
from dataclasses import dataclass, replace

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from fusetile.hdl.compute import ComputeCommand, ComputeUnit
from fusetile.hdl.mac_array import MacArray
from fusetile.hdl.scratchpad import SpadPortSignature
from fusetile.hdl.vector import VectorAlu
from fusetile.kernels import arith
from fusetile.kernels.config import TileConfig
from fusetile.kernels.isa import CmpOp, FaultCause, MicroArgs, MicroOp, VcfgArgs, VectorCfg

from conftest import take_during_abort


CFG_8x8 = TileConfig(rows=8, cols=8, word_bytes=8, spad_banks=4, spad_bank_words=64,
                     partitions=4)
CFG_4x8 = TileConfig(rows=4, cols=8, word_bytes=8, spad_banks=4, spad_bank_words=64,
                     partitions=4)
CFG_8x4 = TileConfig(rows=8, cols=4, word_bytes=8, spad_banks=4, spad_bank_words=64,
                     partitions=4)     # lanes >= cols of REQUANT's rows are 0
CFG_8x8_2 = TileConfig(rows=8, cols=8, word_bytes=8, spad_banks=4, spad_bank_words=64,
                       partitions=4, vector_lanes=2)   # 4 passes per row or scaled word
CFG_4x4_1 = TileConfig(rows=4, cols=4, word_bytes=4, spad_banks=2, spad_bank_words=128,
                       partitions=4, vector_lanes=1,
                       compact=True)   # the iCEBreaker's vector unit, built for area
#: The iCEBreaker's choice of operations: no VCMP, VARGMAX or averaging VPOOL, the
#: units built for area; the vector unit a word per cycle (its path with no passes).
CFG_4x4_LEAN = replace(CFG_4x4_1, vector_lanes=None, decisions=False, pool_average=False)
#: A vector instruction's cycles after its last word is read (VADD, VCLAMP, VPOOL, VCMP,
#: VARGMAX; P - 1 more in P passes), and a REQUANT's after its last row is read.
VEC_END = VectorAlu.LATENCY + 2
RQ_END = VectorAlu.REQUANT_LATENCY + 1

PART = 1                # the partition the programs run in
PART_BASE = 24
PART_LEN = 200          # offsets 200.. of partition 1 fault; words 0..23, 224.. untouched


# --- the scratchpad model ---------------------------------------------------------

class SpadModel(wiring.Component):
    """A scratchpad with ports ``a``, ``b`` (reads) and ``w`` (writes).

    ``stall_a`` / ``stall_b`` / ``stall_w``: an access stalls with probability
    ``rate / 16`` (pseudo-random); ``b`` also stalls when ``a`` reads the same bank.
    ``limit``: the offsets inside partition ``open``, as :attr:`Scratchpad.limit`.
    """

    def __init__(self, config):
        self._config = config
        self.mem = Memory(shape=config.word_bits, depth=config.spad_words, init=[])
        super().__init__({
            "a": In(SpadPortSignature(config)),
            "b": In(SpadPortSignature(config)),
            "w": In(SpadPortSignature(config)),
            "part_base": In(data.ArrayLayout(16, config.partitions)),
            "part_len": In(data.ArrayLayout(16, config.partitions)),
            "stall_a": In(5),
            "stall_b": In(5),
            "stall_w": In(5),
            "abort": In(1),
            "open": In(4),
            "limit": Out(17),
        })

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        m.submodules.mem = self.mem
        wp = self.mem.write_port()
        ports = {"a": self.mem.read_port(), "b": self.mem.read_port(), "w": None}

        base, length = self.part_base[self.open], self.part_len[self.open]
        room = Mux(base < cfg.spad_words, cfg.spad_words - base, 0)
        m.d.comb += self.limit.eq(Mux(self.open < cfg.partitions,
                                      Mux(length < room, length, room), 0))

        performed, bank = {}, {}
        for k, (name, rp) in enumerate(ports.items()):
            port = getattr(self, name)
            lfsr = Signal(16, init=0xACE1 + 0x1357 * k, name=f"lfsr_{name}")
            m.d.sync += lfsr.eq(Cat(lfsr[1:], lfsr[0] ^ lfsr[2] ^ lfsr[3] ^ lfsr[5]))
            word = Signal(17, name=f"{name}_word")
            m.d.comb += word.eq(self.part_base[port.part] + port.offset)
            outside = ((port.part >= cfg.partitions) | (port.offset >= self.part_len[port.part])
                       | (word >= cfg.spad_words))
            stall = lfsr[:4] < getattr(self, f"stall_{name}")
            bank[name] = word % cfg.spad_banks
            if name == "b":
                stall = stall | (performed["a"] & (bank["a"] == bank["b"]))
            ok = port.en & ~outside & ~self.abort      # as Scratchpad.abort
            performed[name] = Signal(name=f"{name}_performed")
            m.d.comb += [
                port.fault.eq(port.en & outside),
                port.stall.eq(ok & stall),
                performed[name].eq(ok & ~stall),
            ]
            if rp is None:
                m.d.comb += [wp.addr.eq(word), wp.data.eq(port.wdata),
                             wp.en.eq(performed[name] & port.we)]
            else:
                read = performed[name] & ~port.we
                was_read = Signal(name=f"{name}_was_read")
                m.d.sync += was_read.eq(read)
                m.d.comb += [rp.addr.eq(word), rp.en.eq(read)]
                # rdata is garbage except in the cycle after a performed read, and so
                # are its parts, which hold the word in the part of its bank's pair
                # (as the scratchpad's) and 0 in the others.
                garbage = Cat(lfsr, lfsr, lfsr, lfsr) ^ 0x5A5A
                read_part = Signal(range(len(port.rdata_parts)), name=f"{name}_read_part")
                m.d.sync += read_part.eq(bank[name] // 2)
                m.d.comb += port.rdata.eq(Mux(was_read, rp.data, garbage))
                for k in range(len(port.rdata_parts)):
                    m.d.comb += port.rdata_parts[k].eq(
                        Mux(was_read, Mux(read_part == k, rp.data, 0), garbage))
        return m


class Harness(wiring.Component):
    def __init__(self, config):
        self.cu = ComputeUnit(config)
        self.spad = SpadModel(config)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.cu = self.cu
        m.submodules.spad = self.spad
        for name in ("a", "b", "w"):
            wiring.connect(m, getattr(self.cu, name), getattr(self.spad, name))
        m.d.comb += self.spad.abort.eq(self.cu.abort)
        # The tile opens a kernel's partition at CALL, before its commands: here each
        # command's own partition is open from the cycle it is accepted.
        cmd = self.cu.cmd
        taken = cmd.valid & cmd.ready
        held = Signal(4)
        with m.If(taken):
            m.d.sync += held.eq(cmd.payload.part)
        m.d.comb += [self.spad.open.eq(Mux(taken, cmd.payload.part, held)),
                     self.cu.limit.eq(self.spad.limit)]
        return m


# --- the reference ----------------------------------------------------------------

class _Fault(Exception):
    def __init__(self, cause, addr, part):
        self.fault = (cause, addr & 0xFFFFFFFF, part)


@dataclass
class Outcome:
    fault: tuple = None
    flag: tuple = None
    index: tuple = None
    macs: int = 0
    sats: int = 0


def _i8(v):
    v &= 0xFF
    return v - 256 if v & 0x80 else v


class Ref:
    """Sequential semantics of docs/isa.md: for each output its inputs, then the
    output; the first access outside the partition stops the operation."""

    VCFG_BITS = [32, 32, 5, 8, 8, 8, 8, 8]
    NAMES = ["mult_a", "mult_b", "shift", "zp_a", "zp_b", "zp_out", "lo", "hi"]

    def __init__(self, config, mem, part_base, part_len):
        self.cfg = config
        self.mem = list(mem)
        self.part_base, self.part_len = part_base, part_len
        self.acc = np.zeros((config.rows, config.cols), dtype=np.int32)
        self.vcfg = dict(mult_a=0, mult_b=0, shift=0, zp_a=0, zp_b=0, zp_out=0,
                         lo=-128, hi=127)

    def _word(self, part, off):
        cfg = self.cfg
        if (part >= cfg.partitions or off >= 1 << 16 or off >= self.part_len[part] or
                self.part_base[part] + off >= cfg.spad_words):
            raise _Fault(FaultCause.PARTITION, off, part)
        return self.part_base[part] + off

    def read(self, part, off):
        return arith.word_to_lanes(self.mem[self._word(part, off)], self.cfg.word_bytes)

    def write(self, part, off, lanes):
        self.mem[self._word(part, off)] = arith.lanes_to_word(lanes)

    def run(self, op, f, part):
        out = Outcome()
        try:
            self._run(op, f, part, out)
        except _Fault as e:
            out.fault = e.fault
        return out

    def _run(self, op, f, part, out):
        cfg = self.cfg
        R, C, wb = cfg.rows, cfg.cols, cfg.word_bytes
        v = self.vcfg
        # Illegal commands are refused by the issuer (the control unit's operand
        # check); the unit does nothing with those it can tell from a bit or two, and
        # what it does with the rest is not specified (it runs them as encoded).
        if op == MicroOp.MATMUL:
            for t in range(f["k"]):
                a = self.read(part, f["a_addr"] + t * f["a_stride"])[:R]
                b = self.read(part, f["b_addr"] + t * f["b_stride"])[:C]
                base = self.acc if t or f["accumulate"] else np.zeros_like(self.acc)
                self.acc = arith.matmul_step(base, a, b)
                out.macs += R * C
        elif op == MicroOp.ACC_BIAS:
            n = -(-4 * R // wb)
            raw_bytes = b"".join(self.read(part, f["addr"] + j).tobytes() for j in range(n))
            bias = np.frombuffer(raw_bytes[:4 * R], dtype="<i4")
            self.acc = np.repeat(bias[:, None], C, axis=1).astype(np.int32)
        elif op == MicroOp.REQUANT:
            if f["per_channel"]:
                n = -(-8 * R // wb)
                table = b"".join(self.read(part, f["param_addr"] + j).tobytes()
                                 for j in range(n))
                mults = [int.from_bytes(table[8 * i:8 * i + 4], "little") for i in range(R)]
                shifts = [table[8 * i + 4] & 31 for i in range(R)]
            else:
                mults, shifts = [v["mult_a"]] * R, [v["shift"]] * R
            for i in range(R):
                val, sat = arith.requantize(self.acc[i], mults[i], shifts[i], v["zp_out"],
                                            v["lo"], v["hi"])
                lanes = np.zeros(wb, dtype=np.int8)
                lanes[:C] = val
                self.write(part, f["out_addr"] + i * f["out_stride"], lanes)
                out.sats += int(sat.sum())
        elif op == MicroOp.VADD:
            for w in range(f["n"]):
                a = self.read(part, f["a_addr"] + w)
                b = self.read(part, f["b_addr"] + w)
                val, sat = arith.vadd(a, b, **v)
                self.write(part, f["out_addr"] + w, val)
                out.sats += int(sat.sum())
        elif op == MicroOp.VPOOL:
            if f["window"] == 0:
                return
            for o in range(f["n"]):
                words = [self.read(part, f["in_addr"] + o * f["in_step"] + t * f["in_stride"])
                         for t in range(f["window"])]
                val, sat = arith.vpool(words, average=f["average"], pairs=f["pairs"],
                                       mult=v["mult_a"], shift=v["shift"], zp_in=v["zp_a"],
                                       zp_out=v["zp_out"], lo=v["lo"], hi=v["hi"])
                self.write(part, f["out_addr"] + o, val)
                out.sats += int(sat.sum())
        elif op == MicroOp.VCLAMP:
            for w in range(f["n"]):
                x = self.read(part, f["in_addr"] + w)
                self.write(part, f["out_addr"] + w, arith.vclamp(x, _i8(f["lo"]), _i8(f["hi"])))
        elif op == MicroOp.VCMP:
            lane = f["lane"]
            first = 0 if f["reduce"] else lane // wb
            lanes = np.concatenate([self.read(part, f["addr"] + j)
                                    for j in range(first, lane // wb + 1)])
            value = lanes[:lane + 1].max() if f["reduce"] else lanes[lane % wb]
            out.flag = (f["flag"], int(arith.vcmp(value, CmpOp(f["op"]), _i8(f["imm"]))))
        elif op == MicroOp.VARGMAX:
            n = f["n"]
            if n == 0:
                return
            if ((f["lane"] >= wb if f["column"] else f["lane"] != 0) or
                    (not f["test"] and (f["flag"] or f["expect"]))):
                raise AssertionError(f"the unit's answer to {op!r} {f} is not specified")
            if f["column"]:
                words = [self.read(part, f["addr"] + w) for w in range(n)]
                result = arith.vargmax_column(words, f["lane"])
            else:
                lanes = np.concatenate([self.read(part, f["addr"] + j)
                                        for j in range(-(-n // wb))])
                result = arith.vargmax(lanes[:n])
            out.index = (f["index"], result)
            if f["test"]:
                out.flag = (f["flag"], int(arith.vargmax_test(result, f["expect"])))
        elif op == MicroOp.VCFG:
            reg = f["reg"]
            if reg >= 8:
                return
            value = f["value"] & ((1 << self.VCFG_BITS[reg]) - 1)
            v[self.NAMES[reg]] = _i8(value) if reg >= 3 else value
        # Any other opcode (not a compute operation) does nothing.


# --- commands ---------------------------------------------------------------------

MEMBER = {
    MicroOp.MATMUL: "matmul", MicroOp.ACC_BIAS: "acc_bias", MicroOp.REQUANT: "requant",
    MicroOp.VADD: "vadd", MicroOp.VPOOL: "vpool", MicroOp.VCLAMP: "vclamp",
    MicroOp.VCMP: "vcmp", MicroOp.VARGMAX: "vargmax", MicroOp.VCFG: "vcfg",
}
DEFAULTS = {
    "matmul": dict(a_addr=0, a_stride=1, b_addr=0, b_stride=1, k=0, accumulate=0),
    "acc_bias": dict(addr=0),
    "requant": dict(out_addr=0, out_stride=1, per_channel=0, param_addr=0),
    "vadd": dict(a_addr=0, b_addr=0, out_addr=0, n=0),
    "vpool": dict(in_addr=0, in_stride=1, in_step=1, out_addr=0, n=0, window=1, average=0,
                  pairs=0),
    "vclamp": dict(in_addr=0, out_addr=0, n=0, lo=0x80, hi=0x7F),
    "vcmp": dict(addr=0, lane=0, reduce=0, op=0, imm=0, flag=0),
    "vargmax": dict(addr=0, n=1, index=0, column=0, lane=0, test=0, flag=0, expect=0),
    "vcfg": dict(reg=0, value=0),
}


@dataclass
class Cmd:
    op: object      # MicroOp or a reserved opcode (int)
    fields: dict
    part: int = PART

    @property
    def args_bits(self):
        member = MEMBER.get(self.op)
        if member is None:
            return 0
        f = dict(self.fields)
        if member == "vcmp":
            f["op"] = CmpOp(f["op"])
        if member == "vcfg":        # raw: registers 8..15 are reserved, not VectorCfg
            layout = VcfgArgs.as_shape()
            return f["reg"] << layout["reg"].offset | f["value"] << layout["value"].offset
        return MicroArgs.const({member: f}).as_bits()

    #: The fields of each operation's ``a``, ``b`` and ``w`` streams' first words.
    FIRST = {
        MicroOp.MATMUL: ("a_addr", "b_addr", None), MicroOp.ACC_BIAS: ("addr", None, None),
        MicroOp.REQUANT: ("param_addr", None, "out_addr"),
        MicroOp.VADD: ("a_addr", "b_addr", "out_addr"),
        MicroOp.VPOOL: ("in_addr", None, "out_addr"),
        MicroOp.VCLAMP: ("in_addr", None, "out_addr"),
        MicroOp.VARGMAX: ("addr", None, None),
    }

    def raw(self, word_bytes):
        """The command as the bits of a ComputeCommand, for words of ``word_bytes``
        (the streams' first words and VCMP's and VARGMAX's words read, which the issuer
        works out)."""
        layout = ComputeCommand.as_shape()
        f = self.fields
        first = [f[name] if name else 0 for name in self.FIRST.get(self.op, (None,) * 3)]
        steps = 0
        if self.op == MicroOp.VCMP:
            first[0] = f["addr"] + (0 if f["reduce"] else f["lane"] // word_bytes)
            steps = f["lane"] // word_bytes + 1 if f["reduce"] else 1
        if self.op == MicroOp.VARGMAX:
            steps = f["n"] if f["column"] else -(-f["n"] // word_bytes)
        bits = (int(getattr(self.op, "value", self.op)) << layout["op"].offset |
                self.args_bits << layout["args"].offset | self.part << layout["part"].offset |
                steps << layout["steps"].offset)
        for port, word in zip("abw", first):
            bits |= word << layout[f"{port}_first"].offset
        return bits


def cmd(opcode, /, part=PART, **fields):
    member = MEMBER.get(opcode)
    full = dict(DEFAULTS[member]) if member else {}
    full.update(fields)
    return Cmd(opcode, full, part)


def vcfg(reg, value):
    return cmd(MicroOp.VCFG, reg=getattr(reg, "value", reg), value=value & 0xFFFFFFFF)


# --- running ----------------------------------------------------------------------

@dataclass
class Result:
    cycles: int
    macs: int = 0
    sats: int = 0
    stalls: int = 0
    flags: list = None
    indexes: list = None
    mac_busy: int = 0
    vec_busy: int = 0


async def issue(ctx, dut, c, *, abort_after=None, abort_when=None):
    """Run one command to completion (or abort it ``abort_after`` cycles after it is
    accepted, or in the first cycle ``abort_when(ctx)`` is true); returns a Result.
    Events are collected from the accept cycle on."""
    res = Result(cycles=0, flags=[], indexes=[])

    def sample():
        res.macs += ctx.get(dut.macs)
        res.sats += ctx.get(dut.saturations)
        res.stalls += ctx.get(dut.stalls)
        res.mac_busy += ctx.get(dut.mac_busy)
        res.vec_busy += ctx.get(dut.vec_busy)
        if not dut.config.decisions:
            return              # (no flag or index ports)
        if ctx.get(dut.flag_we):
            res.flags.append((ctx.get(dut.flag_sel), ctx.get(dut.flag_value)))
        if ctx.get(dut.index_we):
            res.indexes.append((ctx.get(dut.index_sel), ctx.get(dut.index_value)))

    if not ctx.get(dut.cmd.ready):
        await ctx.tick()        # the unit takes a command the cycle after busy falls
    ctx.set(dut.cmd.valid, 1)
    ctx.set(dut.cmd.payload.as_value(), c.raw(dut.config.word_bytes))
    assert ctx.get(dut.cmd.ready), "unit not ready"
    sample()
    await ctx.tick()
    ctx.set(dut.cmd.valid, 0)
    while ctx.get(dut.busy):
        if (abort_after is not None and res.cycles == abort_after or
                abort_when is not None and abort_when(ctx)):
            ctx.set(dut.abort, 1)
            sample()
            await ctx.tick()
            ctx.set(dut.abort, 0)
            return res
        sample()
        res.cycles += 1
        await ctx.tick()
        assert res.cycles < 5000, "command does not finish"
    sample()        # the first idle cycle must be quiet
    return res


class Bench:
    """One simulation: a harness, a reference and helpers to run checked programs."""

    def __init__(self, config, seed=0, stall=(0, 0, 0)):
        self.cfg = config
        self.rng = random.Random(seed)
        self.top = Harness(config)
        self.dut = self.top.cu
        self.spad = self.top.spad
        self.stall = stall
        mem = [self.rng.getrandbits(config.word_bits) for _ in range(config.spad_words)]
        base = [0, PART_BASE, 0, 0][:config.partitions]
        length = [0, PART_LEN, config.spad_words, 0][:config.partitions]
        self.ref = Ref(config, mem, base, length)
        self.timings = {}

    def run(self, bench):
        sim = Simulator(self.top)
        sim.add_clock(1e-8)

        async def tb(ctx):
            for i, word in enumerate(self.ref.mem):
                ctx.set(self.spad.mem.data[i], word)
            for i in range(self.cfg.partitions):
                ctx.set(self.spad.part_base[i], self.ref.part_base[i])
                ctx.set(self.spad.part_len[i], self.ref.part_len[i])
            for name, rate in zip(("stall_a", "stall_b", "stall_w"), self.stall):
                ctx.set(getattr(self.spad, name), rate)
            await bench(ctx)

        sim.add_testbench(tb)
        sim.run()

    def set_mem(self, ctx, off, words, part=PART):
        for j, word in enumerate(words):
            addr = self.ref.part_base[part] + off + j
            self.ref.mem[addr] = word
            ctx.set(self.spad.mem.data[addr], word)

    async def check(self, ctx, c):
        """Run ``c`` on the unit and the reference; compare everything."""
        expect = self.ref.run(c.op, c.fields, c.part)
        res = await issue(ctx, self.dut, c)
        where = f"{c}"
        mem = [ctx.get(self.spad.mem.data[i]) for i in range(self.cfg.spad_words)]
        bad = [i for i in range(len(mem)) if mem[i] != self.ref.mem[i]]
        assert not bad, f"{where}: words {bad[:8]} differ"
        assert res.macs == expect.macs, where
        assert res.sats == expect.sats, where
        assert res.flags == ([expect.flag] if expect.flag else []), where
        assert res.indexes == ([expect.index] if expect.index else []), where
        if expect.fault:
            assert ctx.get(self.dut.fault) == 1, where
            got = (FaultCause(ctx.get(self.dut.fault_cause)), ctx.get(self.dut.fault_addr),
                   ctx.get(self.dut.fault_part))
            assert got == expect.fault, where
            assert not ctx.get(self.dut.cmd.ready)
            await self.abort(ctx)
        else:
            assert ctx.get(self.dut.fault) == 0, where
        self.timings.setdefault(c.op, []).append(res.cycles)
        return res

    async def abort(self, ctx):
        ctx.set(self.dut.abort, 1)
        await ctx.tick()
        ctx.set(self.dut.abort, 0)
        assert ctx.get(self.dut.fault) == 0
        assert ctx.get(self.dut.fault_cause) == FaultCause.NONE
        assert ctx.get(self.dut.cmd.ready)

    async def observe_acc(self, ctx, out_addr):
        """Make ACC visible: REQUANT it with several scales (per-channel and per-tensor),
        each checked against the reference."""
        R, wb = self.cfg.rows, self.cfg.word_bytes
        tw = -(-8 * R // wb)
        table_addr = out_addr + R
        for shifts in ([0] * R, [8] * R, [self.rng.randrange(32) for _ in range(R)]):
            table = b"".join((2**31 - 1).to_bytes(4, "little") + bytes([s, 0, 0, 0])
                             for s in shifts)
            table += bytes(tw * wb - len(table))
            self.set_mem(ctx, table_addr, [int.from_bytes(table[j * wb:(j + 1) * wb],
                                                          "little") for j in range(tw)])
            await self.check(ctx, cmd(MicroOp.REQUANT, out_addr=out_addr, per_channel=1,
                                      param_addr=table_addr))


# --- program generation -----------------------------------------------------------

def rand_vcfg(rng):
    reg = rng.randrange(8)
    if reg in (0, 1):
        value = rng.choice([0, 1, 2**30, 2**31 - 1, rng.randrange(2**31),
                            rng.randrange(2**24, 2**31)])
    elif reg == 2:
        value = rng.choice([0, 1, 3, rng.randrange(32), rng.randrange(256)])
    elif reg in (6, 7):
        value = rng.randrange(-128, 128) if rng.random() < 0.3 else (-128 if reg == 6 else 127)
    else:
        value = rng.randrange(-128, 128)
    return vcfg(reg, value)


def rand_cmd(rng, cfg, op, *, span=PART_LEN):
    """A random legal ``op`` command with operands mostly in offsets 0..span-1."""
    R, wb = cfg.rows, cfg.word_bytes
    addr = lambda need: rng.randrange(max(1, span - need))   # noqa: E731

    def out_addr(n, *inputs):
        """Where ``n`` outputs go: in place (at an input's start) or clear of the
        inputs ((start, words) each). Outputs that overwrite inputs still to be read
        give results that depend on timing (ComputeUnit's docstring)."""
        for _ in range(100):
            out = addr(n)
            if all(out + n <= start or start + words <= out or out == start
                   for start, words in inputs):
                return out
        return inputs[0][0]
    if op == MicroOp.MATMUL:
        k = rng.choice([0, 1, 2, rng.randrange(1, 20), rng.randrange(1, 40)])
        sa, sb = rng.choice([0, 1, 1, 2, 3]), rng.choice([0, 1, 1, 2, 5])
        return cmd(op, a_addr=addr(k * sa + 1), a_stride=sa, b_addr=addr(k * sb + 1),
                   b_stride=sb, k=k, accumulate=rng.randrange(2))
    if op == MicroOp.ACC_BIAS:
        return cmd(op, addr=addr(4))
    if op == MicroOp.REQUANT:
        stride = rng.choice([1, 2, 3])
        return cmd(op, out_addr=addr(R * stride), out_stride=stride,
                   per_channel=rng.randrange(2), param_addr=addr(R))
    if op == MicroOp.VADD:
        n = rng.choice([0, 1, rng.randrange(1, 24)])
        a, b = addr(n), addr(n)
        return cmd(op, a_addr=a, b_addr=b, out_addr=out_addr(n, (a, n), (b, n)), n=n)
    if op == MicroOp.VPOOL:
        window, n = rng.randrange(1, 5), rng.choice([0, 1, rng.randrange(1, 6)])
        stride, step = rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
        span_in = n * step + window * stride
        start = addr(span_in)
        return cmd(op, in_addr=start, in_stride=stride, in_step=step,
                   out_addr=out_addr(n, (start, span_in)), n=n, window=window,
                   average=rng.randrange(2) if cfg.pool_average else 0,
                   pairs=rng.randrange(2))
    if op == MicroOp.VCLAMP:
        n = rng.choice([0, 1, rng.randrange(1, 24)])
        lo, hi = sorted(rng.randrange(-128, 128) for _ in range(2))
        if rng.random() < 0.1:
            lo, hi = hi, lo
        start = addr(n)
        return cmd(op, in_addr=start, out_addr=out_addr(n, (start, n)), n=n, lo=lo & 0xFF,
                   hi=hi & 0xFF)
    if op == MicroOp.VCMP:
        lane = rng.choice([0, wb - 1, rng.randrange(4 * wb), rng.randrange(256)])
        return cmd(op, addr=addr(lane // wb + 1), lane=lane, reduce=rng.randrange(2),
                   op=rng.randrange(4), imm=rng.randrange(256), flag=rng.randrange(8))
    if op == MicroOp.VARGMAX:
        column, test = rng.random() < 0.5, rng.random() < 0.5
        if column:
            n = rng.choice([1, 2, rng.randrange(1, 4 * wb), rng.randrange(1, 60)])
            lane = rng.choice([0, wb - 1, rng.randrange(wb)])
        else:
            n = rng.choice([1, wb, rng.randrange(1, 4 * wb), rng.randrange(1, 200)])
            lane = 0
        expect = rng.choice([0, 1, rng.randrange(n), rng.randrange(4096)]) if test else 0
        return cmd(op, addr=addr(n if column else -(-n // wb)), n=n, index=rng.randrange(4),
                   column=int(column), lane=lane, test=int(test),
                   flag=rng.randrange(8) if test else 0, expect=expect)
    return rand_vcfg(rng)


def tie_words(rng, cfg, n):
    """Words with many equal lanes (ties for VARGMAX, VPOOL max, VCMP)."""
    return [arith.lanes_to_word([rng.choice([-128, -3, 0, 5, 127])
                                 for _ in range(cfg.word_bytes)]) for _ in range(n)]


# --- tests ------------------------------------------------------------------------

def test_config_checked():
    with pytest.raises(TypeError, match=r"config must be a TileConfig, not 4"):
        ComputeUnit(4)
    with pytest.raises(ValueError, match=r"config.rows must be at most config.word_bytes "
                                         r"\(8\), not 16"):
        ComputeUnit(TileConfig(rows=16))
    with pytest.raises(ValueError, match=r"config.cols must be at most config.word_bytes "
                                         r"\(4\), not 8"):
        ComputeUnit(TileConfig(cols=8, rows=4, word_bytes=4))


def test_ports():
    cu = ComputeUnit(CFG_8x8)
    assert cu.a.signature == SpadPortSignature(CFG_8x8)
    assert cu.signature.members["w"].flow == wiring.Out
    assert cu.signature.members["abort"].flow == wiring.In
    assert len(cu.macs) == (64).bit_length()
    assert cu.bias_words == 4 and cu.table_words == 8
    assert ComputeUnit(CFG_4x8).bias_words == 2


@pytest.mark.parametrize("config", [CFG_8x8, CFG_4x8], ids=["8x8", "4x8"])
def test_verilog(config):
    text = verilog.convert(ComputeUnit(config), name="compute")
    assert "module compute" in text


def test_directed_and_timing():
    """Every op on hand-picked cases, no stalls; exact cycle counts."""
    b = Bench(CFG_8x8, seed=1)
    R, C, wb = 8, 8, 8
    rng = b.rng

    async def bench(ctx):
        regs = ctx.get(b.dut.vector_regs)
        assert (regs.lo, regs.hi, regs.mult_a, regs.shift) == (-128, 127, 0, 0)

        # MATMUL throughput: k = 64 steps, a and b in different banks.
        res = await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=0, a_stride=1, b_addr=65,
                                     b_stride=1, k=64))
        assert res.macs == R * C * 64
        mm_end = MacArray.LATENCY + 1       # the MAC array's latency, then drained
        assert res.cycles == 64 + mm_end and res.mac_busy == 64 + mm_end
        assert res.stalls == 0
        await b.observe_acc(ctx, 150)
        # k = 0: nothing at all, ACC unchanged (also with accumulate = 0).
        res = await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=3, b_addr=9, k=0))
        assert res.cycles == 0
        await b.observe_acc(ctx, 150)
        # Same-bank operands: b stalls on every step, no step is lost.
        res = await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=0, a_stride=4, b_addr=8,
                                     b_stride=4, k=10, accumulate=1))
        assert res.stalls == 10
        # Strides 0 and odd, accumulate, then bias then accumulate.
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=5, a_stride=0, b_addr=11,
                               b_stride=3, k=7, accumulate=1))
        await b.observe_acc(ctx, 150)
        res = await b.check(ctx, cmd(MicroOp.ACC_BIAS, addr=40))
        assert res.cycles == 4 + 2
        await b.observe_acc(ctx, 150)
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=60, a_stride=1, b_addr=20,
                               b_stride=2, k=9, accumulate=1))
        await b.observe_acc(ctx, 150)
        # Wrap-around: bias near 2**31, positive products.
        big = b"".join((2**31 - 5 - i).to_bytes(4, "little") for i in range(R))
        b.set_mem(ctx, 100, [int.from_bytes(big[8 * j:8 * j + 8], "little") for j in range(4)])
        b.set_mem(ctx, 110, [arith.lanes_to_word([100] * 8)] * 2)
        await b.check(ctx, cmd(MicroOp.ACC_BIAS, addr=100))
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=110, a_stride=1, b_addr=111,
                               b_stride=0, k=1, accumulate=1))
        await b.check(ctx, vcfg(VectorCfg.MULT_A, 2**31 - 1))
        await b.check(ctx, vcfg(VectorCfg.SHIFT, 24))
        res = await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=120, out_stride=2))
        assert res.cycles == R + RQ_END
        assert all(arith.word_to_lanes(b.ref.mem[PART_BASE + 120 + 2 * i], wb)[0] < 0
                   for i in range(R))

        # REQUANT per-tensor with saturation in both directions, lanes >= C are 0.
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=0, a_stride=1, b_addr=33, k=16))
        await b.check(ctx, vcfg(VectorCfg.SHIFT, 4))
        await b.check(ctx, vcfg(VectorCfg.ZP_OUT, 3))
        res = await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=130, out_stride=1))
        assert res.sats > 0
        await b.check(ctx, vcfg(VectorCfg.LO, -20))
        await b.check(ctx, vcfg(VectorCfg.HI, 50))
        res = await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=140, out_stride=3))
        assert res.sats > 0
        # Per-channel with mixed multipliers and shifts (bytes 5..7 and shift bits
        # above 5 are ignored).
        table = b"".join(rng.randrange(2**31).to_bytes(4, "little") +
                         bytes([rng.randrange(256) | 0xE0 if i % 2 else rng.randrange(12),
                                rng.randrange(256), rng.randrange(256), rng.randrange(256)])
                         for i in range(R))
        b.set_mem(ctx, 170, [int.from_bytes(table[8 * j:8 * j + 8], "little")
                             for j in range(R)])
        res = await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=180, out_stride=1,
                                     per_channel=1, param_addr=170))
        assert res.cycles == 8 + 3 + R + RQ_END

        # VADD, VCLAMP (also in place), VPOOL, VCMP, VARGMAX.
        for reg, value in ((VectorCfg.MULT_A, 2**30), (VectorCfg.MULT_B, 3 * 2**28),
                           (VectorCfg.SHIFT, 0), (VectorCfg.ZP_A, -3), (VectorCfg.ZP_B, 7),
                           (VectorCfg.ZP_OUT, -2), (VectorCfg.LO, -100), (VectorCfg.HI, 90)):
            await b.check(ctx, vcfg(reg, value))
        res = await b.check(ctx, cmd(MicroOp.VADD, a_addr=0, b_addr=31, out_addr=100, n=20))
        assert res.cycles == 20 + VEC_END and res.vec_busy == res.cycles
        assert res.sats > 0
        res = await b.check(ctx, cmd(MicroOp.VCLAMP, in_addr=3, out_addr=120, n=12,
                                     lo=(-10) & 0xFF, hi=20))
        assert res.cycles == 12 + VEC_END and res.sats == 0
        await b.check(ctx, cmd(MicroOp.VCLAMP, in_addr=120, out_addr=120, n=12, lo=0, hi=127))
        for average in (0, 1):
            for pairs in (0, 1):
                res = await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=2, in_stride=3, in_step=2,
                                             out_addr=140 + 4 * (2 * average + pairs), n=4,
                                             window=3, average=average, pairs=pairs))
                assert res.cycles == 4 * 3 + VEC_END
        b.set_mem(ctx, 60, tie_words(rng, b.cfg, 20))
        await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=60, in_stride=1, in_step=5,
                               out_addr=165, n=3, window=5))
        await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=60, in_stride=4, in_step=1,
                               out_addr=170, n=4, window=15, average=1))
        for lane in (0, 5, 7, 8, 13, 31):
            for reduce in (0, 1):
                for op in range(4):
                    res = await b.check(ctx, cmd(MicroOp.VCMP, addr=60, lane=lane,
                                                 reduce=reduce, op=op, imm=rng.choice(
                                                     [0, 5, 0x80, 0x7F, 0xFD]),
                                                 flag=rng.randrange(8)))
                    words = lane // wb + 1 if reduce else 1
                    assert res.cycles == words + VEC_END
        for n in (1, 2, 7, 8, 9, 16, 33, 160):
            res = await b.check(ctx, cmd(MicroOp.VARGMAX, addr=60 if n < 100 else 0, n=n,
                                         index=n % 4))
            assert res.cycles == -(-n // wb) + VEC_END
        # Column mode: n words read; with `test` the flag comes with the index.
        for n, lane in ((1, 0), (2, 7), (7, 3), (20, 0), (20, 5), (160, 6)):
            index = arith.vargmax_column(
                [arith.word_to_lanes(b.ref.mem[PART_BASE + (60 if n < 100 else 0) + w], wb)
                 for w in range(n)], lane)
            for test, expect in ((0, 0), (1, index), (1, index + 1)):
                flag = (n + lane) % 8 if test else 0
                res = await b.check(ctx, cmd(MicroOp.VARGMAX, addr=60 if n < 100 else 0,
                                             n=n, index=n % 4, column=1, lane=lane,
                                             test=test, flag=flag, expect=expect))
                assert res.cycles == n + VEC_END
                assert res.indexes == [(n % 4, index)]
                assert res.flags == ([(flag, int(expect == index))] if test else [])
        # Packed mode with `test`.
        res = await b.check(ctx, cmd(MicroOp.VARGMAX, addr=60, n=20, index=3, test=1, flag=6,
                                     expect=arith.vargmax(np.concatenate(
                                         [arith.word_to_lanes(b.ref.mem[PART_BASE + 60 + w], wb)
                                          for w in range(3)])[:20])))
        assert res.cycles == 3 + VEC_END and res.flags == [(6, 1)]
        # VCFG: truncation and sign extension.
        await b.check(ctx, vcfg(VectorCfg.SHIFT, 0x123))
        await b.check(ctx, vcfg(VectorCfg.ZP_OUT, 0x1F0))
        regs = ctx.get(b.dut.vector_regs)
        assert (regs.shift, regs.zp_out, regs.lo, regs.hi) == (3, -16, -100, 90)
        # In place, a and b the same words: b stalls on every word (same bank).
        res = await b.check(ctx, cmd(MicroOp.VADD, a_addr=7, b_addr=7, out_addr=7, n=9))
        assert res.cycles == 2 * 9 + VEC_END and res.stalls == 9

    b.run(bench)


@pytest.mark.parametrize("compact", [False, True], ids=["deep", "compact"])
def test_timing_in_passes(compact):
    """With 2 vector lanes for 8 (4 passes): rows and scaled words one per 4 cycles,
    the words of a VPOOL window between them, every vector result 3 cycles later.
    Built for area, the vector unit's scaled results come 5 cycles sooner and the
    requantiser's 2, and its unscaled results (VCLAMP, a maximum VPOOL, VARGMAX) 2
    cycles after their last word whatever the passes."""
    b = Bench(replace(CFG_8x8_2, compact=compact), seed=12)
    R, P = 8, 4
    VEC_END = b.cfg.vector_latency - (P - 1) + 2
    RQ_END = b.cfg.requant_latency - (P - 1) + 1
    UNSCALED_END = b.cfg.unscaled_latency + 2  # P - 1 included
    assert (VEC_END, RQ_END, UNSCALED_END) == ((8, 6, 4) if compact else (13, 8, 16))

    async def bench(ctx):
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=0, a_stride=1, b_addr=65,
                               b_stride=1, k=9))
        for reg, value in ((VectorCfg.MULT_A, 2**30), (VectorCfg.MULT_B, 3 * 2**28),
                           (VectorCfg.SHIFT, 3), (VectorCfg.ZP_A, -3), (VectorCfg.ZP_B, 7)):
            await b.check(ctx, vcfg(reg, value))
        res = await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=120, out_stride=2))
        assert res.cycles == R * P + RQ_END
        res = await b.check(ctx, cmd(MicroOp.VADD, a_addr=0, b_addr=31, out_addr=100, n=20))
        assert res.cycles == 20 * P + VEC_END and res.vec_busy == res.cycles
        res = await b.check(ctx, cmd(MicroOp.VCLAMP, in_addr=3, out_addr=120, n=12,
                                     lo=(-10) & 0xFF, hi=20))
        assert res.cycles == 12 + UNSCALED_END
        for window in (1, 3, 4, 6):
            for average in (0, 1):
                res = await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=2, in_stride=3,
                                             in_step=2, out_addr=140, n=5, window=window,
                                             average=average, pairs=window % 2))
                if average:
                    assert res.cycles == 4 * max(window, P) + window + VEC_END + P - 1
                else:
                    assert res.cycles == 5 * window + UNSCALED_END
        res = await b.check(ctx, cmd(MicroOp.VARGMAX, addr=60, n=20, index=1))
        assert res.cycles == 3 + UNSCALED_END

    b.run(bench)


@pytest.mark.parametrize("config,seed,stall", [
    (CFG_8x8, 2, (0, 0, 0)),
    (CFG_8x8, 3, (3, 6, 0)),
    (CFG_4x8, 4, (2, 5, 0)),
    (CFG_8x4, 7, (0, 4, 0)),
    (CFG_8x8, 5, (2, 3, 4)),        # write stalls: restart from the unwritten output
    (CFG_8x8_2, 9, (0, 0, 0)),      # vector lanes: 4 passes
    (CFG_8x8_2, 10, (2, 3, 4)),
    (CFG_4x4_1, 11, (0, 3, 0)),
    (CFG_4x4_LEAN, 12, (2, 0, 3)),
    (replace(CFG_4x4_1, decisions=False, pool_average=False), 14, (0, 2, 0)),
], ids=["8x8", "8x8-stall", "4x8-stall", "8x4-stall", "8x8-wstall", "8x8-2lanes",
        "8x8-2lanes-stall", "4x4-1lane-stall", "4x4-lean-stall", "4x4-1lane-lean-stall"])
def test_random_programs(config, seed, stall):
    b = Bench(config, seed=seed, stall=stall)
    rng = b.rng
    built = [op for op in MEMBER
             if config.decisions or op not in (MicroOp.VCMP, MicroOp.VARGMAX)]

    async def bench(ctx):
        b.set_mem(ctx, 150, tie_words(rng, config, 20))
        total_stalls = 0
        ops = built * 7 + [MicroOp.VCFG] * 7
        rng.shuffle(ops)
        for op in ops:
            c = rand_cmd(rng, config, op, span=PART_LEN - 10)
            res = await b.check(ctx, c)
            total_stalls += res.stalls
            if c.op == MicroOp.MATMUL and c.fields["k"] and rng.random() < 0.5:
                await b.observe_acc(ctx, 100)
        if any(stall):
            assert total_stalls > 20
        # Every operation ran (and did something) at least once.
        assert {op for op, t in b.timings.items() if max(t) > 0} == set(built) - {MicroOp.VCFG}

    b.run(bench)


def test_write_stalls():
    """``w`` stalls (which the tile does not do): the operation restarts from the output
    that was not written and still computes the right words."""
    b = Bench(CFG_8x8, seed=8, stall=(0, 0, 6))

    async def bench(ctx):
        for reg, value in ((VectorCfg.MULT_A, 2**29), (VectorCfg.MULT_B, 2**30),
                           (VectorCfg.ZP_A, 3)):
            await b.check(ctx, vcfg(reg, value))
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=0, b_addr=1, k=20))
        for per_channel in (0, 1, 0):
            res = await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=120, out_stride=3,
                                         per_channel=per_channel, param_addr=40))
            assert res.stalls
        for average in (0, 1):
            res = await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=5, in_stride=2, in_step=3,
                                         out_addr=150, n=12, window=3, average=average,
                                         pairs=average))
            assert res.stalls
        res = await b.check(ctx, cmd(MicroOp.VADD, a_addr=0, b_addr=41, out_addr=100, n=30))
        assert res.stalls
        res = await b.check(ctx, cmd(MicroOp.VCLAMP, in_addr=100, out_addr=100, n=30, lo=0))
        assert res.stalls
        # A write fault after restarts.
        await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=5, in_stride=2, in_step=3,
                               out_addr=PART_LEN - 8, n=12, window=3))

    b.run(bench)


def test_faults_and_abort():
    """PARTITION faults on every kind of access, illegal commands, abort."""
    b = Bench(CFG_8x8, seed=6, stall=(2, 4, 0))
    L = PART_LEN

    async def bench(ctx):
        await b.check(ctx, vcfg(VectorCfg.MULT_A, 2**30))
        await b.check(ctx, vcfg(VectorCfg.MULT_B, 2**29))
        # Reads running out of the partition part-way (earlier outputs are written).
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=L - 5, a_stride=1, b_addr=0, k=9))
        await b.observe_acc(ctx, 100)
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=0, b_addr=L - 30, b_stride=7, k=9,
                               accumulate=1))
        await b.observe_acc(ctx, 100)
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=0xFFF0, a_stride=0, b_addr=0, k=3))
        await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=9, a_stride=0x7000, b_addr=0, k=3))
        await b.check(ctx, cmd(MicroOp.ACC_BIAS, addr=L - 2))
        await b.observe_acc(ctx, 100)
        await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=10, per_channel=1, param_addr=L - 3))
        await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=L - 20, out_stride=4))
        await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=L - 20, out_stride=0xFFFF))
        await b.check(ctx, cmd(MicroOp.VADD, a_addr=L - 12, b_addr=3, out_addr=20, n=15))
        await b.check(ctx, cmd(MicroOp.VADD, a_addr=3, b_addr=L - 12, out_addr=40, n=15))
        await b.check(ctx, cmd(MicroOp.VADD, a_addr=3, b_addr=40, out_addr=L - 12, n=15))
        # The write fault of an earlier output is reported before a later read fault.
        await b.check(ctx, cmd(MicroOp.VADD, a_addr=L - 12, b_addr=3, out_addr=L - 14, n=15))
        await b.check(ctx, cmd(MicroOp.VCLAMP, in_addr=L - 3, out_addr=60, n=6, hi=5))
        await b.check(ctx, cmd(MicroOp.VCLAMP, in_addr=0xFFFE, out_addr=60, n=6))
        await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=L - 20, in_stride=3, in_step=4,
                               out_addr=80, n=6, window=3, average=1))
        await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=0, in_stride=1, in_step=2,
                               out_addr=L - 2, n=6, window=2))
        # ... at the step to the next output's window (its first word, L, is outside).
        await b.check(ctx, cmd(MicroOp.VPOOL, in_addr=L - 10, in_stride=1, in_step=5,
                               out_addr=80, n=4, window=2))
        await b.check(ctx, cmd(MicroOp.VCMP, addr=L - 2, lane=40, reduce=1, flag=3))
        await b.check(ctx, cmd(MicroOp.VCMP, addr=L - 2, lane=20, reduce=0, flag=3))
        await b.check(ctx, cmd(MicroOp.VARGMAX, addr=L - 2, n=30, index=1))
        await b.check(ctx, cmd(MicroOp.VARGMAX, addr=L - 5, n=9, index=1, column=1, lane=3,
                               test=1, flag=2, expect=1))
        # Partitions that do not exist or are empty.
        await b.check(ctx, cmd(MicroOp.VCLAMP, part=0, in_addr=0, out_addr=0, n=1))
        await b.check(ctx, cmd(MicroOp.VCLAMP, part=9, in_addr=0, out_addr=0, n=1))
        await b.check(ctx, cmd(MicroOp.VCLAMP, part=2, in_addr=255, out_addr=0, n=1))
        await b.check(ctx, cmd(MicroOp.VCLAMP, part=2, in_addr=255, out_addr=256, n=1))

        # Illegal commands the unit can tell from a bit or two (the operand check
        # refuses them in the tile) complete at once and do nothing: reserved opcodes,
        # VPOOL with window 0, VARGMAX with n 0, VCFG of a register 8+.
        for c in (*(Cmd(op, {}) for op in (0, 1, 2, 4, 5, 7, 17, 63)),
                  cmd(MicroOp.VPOOL, in_addr=0, out_addr=0, n=3, window=0),
                  cmd(MicroOp.VPOOL, in_addr=0, out_addr=0, n=0, window=0),
                  cmd(MicroOp.VARGMAX, addr=0, n=0, index=2),
                  cmd(MicroOp.VARGMAX, addr=0, n=0, index=2, test=1, flag=5),
                  cmd(MicroOp.VCFG, reg=9, value=5)):
            res = await b.check(ctx, c)
            assert res.cycles == 0 and res.stalls == 0, c
        regs = ctx.get(b.dut.vector_regs)
        assert (regs.mult_a, regs.mult_b) == (2**30, 2**29)

        # Abort in the middle of MATMUL / VADD / REQUANT: then everything works again.
        # (The reference cannot say what an aborted command did, so the words it may
        # have written are re-synchronised from the unit.)
        for c, after in ((cmd(MicroOp.MATMUL, a_addr=0, b_addr=1, k=50), 10),
                         (cmd(MicroOp.VADD, a_addr=0, b_addr=30, out_addr=100, n=30), 12),
                         (cmd(MicroOp.VPOOL, in_addr=0, out_addr=140, n=10, window=3), 6),
                         (cmd(MicroOp.REQUANT, out_addr=160, out_stride=1), 4)):
            await issue(ctx, b.dut, c, abort_after=after)
            assert not ctx.get(b.dut.busy) and ctx.get(b.dut.cmd.ready)
            for _ in range(12):     # results still in flight must not reach the ports
                assert not ctx.get(b.dut.w.en) and not ctx.get(b.dut.macs)
                assert not ctx.get(b.dut.flag_we) and not ctx.get(b.dut.index_we)
                await ctx.tick()
            for i in range(CFG_8x8.spad_words):
                b.ref.mem[i] = ctx.get(b.spad.mem.data[i])
            # The aborted MATMUL leaves ACC undefined for the reference: reset it.
            await b.check(ctx, cmd(MicroOp.MATMUL, a_addr=0, b_addr=3, k=4))
            await b.check(ctx, cmd(MicroOp.REQUANT, out_addr=180, out_stride=1))
        # Abort right after acceptance, back to back with the next command.
        await issue(ctx, b.dut, cmd(MicroOp.VCMP, addr=0, lane=60, reduce=1, flag=2),
                    abort_after=0)
        await b.check(ctx, cmd(MicroOp.VCMP, addr=0, lane=60, reduce=1, flag=5))
        # An abort in a VCMP's last busy cycle, which writes its flag, cancels the write
        # as it cancels the cycle's scratchpad accesses. (The stalls come from a
        # free-running generator, so the cycle is found by its flag write, not counted.)
        flagged = cmd(MicroOp.VCMP, addr=0, lane=60, reduce=1, flag=4)
        whole = await issue(ctx, b.dut, flagged)
        assert [sel for sel, _ in whole.flags] == [4]
        cut = await issue(ctx, b.dut, flagged,
                          abort_when=lambda ctx: ctx.get(b.dut.flag_we))
        assert cut.flags == [] and cut.cycles >= 9

        # Taken in the cycle of an abort: a command is dropped, a VCFG too.
        shift = ctx.get(b.dut.vector_regs).shift
        assert shift != 7
        for c in (cmd(MicroOp.MATMUL, a_addr=0, b_addr=1, k=5),
                  cmd(MicroOp.VCLAMP, in_addr=0, out_addr=200, n=4),
                  vcfg(VectorCfg.SHIFT, 7)):
            if not ctx.get(b.dut.cmd.ready):
                await ctx.tick()
            await take_during_abort(ctx, b.dut, c.raw(b.dut.config.word_bytes))
            for _ in range(12):
                assert not ctx.get(b.dut.busy) and not ctx.get(b.dut.w.en)
                assert not ctx.get(b.dut.macs) and not ctx.get(b.dut.fault)
                await ctx.tick()
        assert ctx.get(b.dut.vector_regs).shift == shift

    b.run(bench)


@pytest.mark.parametrize("stall", [(0, 0, 0), (2, 4, 3)], ids=["no-stall", "stall"])
def test_unit_built_for_area_makes_no_partition_test(stall):
    """Built for area, the unit leaves the partition test to the operand check: given
    commands that reach outside their partition (as the tile never issues), it does
    not fault, finishes, and changes no word outside the partition (the scratchpad
    performs no access there); the words it writes inside are the reference's up to
    where the reference faults."""
    b = Bench(CFG_4x4_1, seed=13, stall=stall)
    L = PART_LEN
    base = b.ref.part_base[PART]
    outside = [i for i in range(CFG_4x4_1.spad_words) if not base <= i < base + L]

    async def bench(ctx):
        await b.check(ctx, vcfg(VectorCfg.MULT_A, 2**30))
        before = [ctx.get(b.spad.mem.data[i]) for i in outside]
        # (ACC's commands last: after them the unit's ACC is its own.)
        for c in (cmd(MicroOp.REQUANT, out_addr=L - 20, out_stride=8),
                  cmd(MicroOp.VADD, a_addr=3, b_addr=40, out_addr=L - 12, n=15),
                  cmd(MicroOp.VCLAMP, in_addr=L - 3, out_addr=60, n=6, hi=5),
                  cmd(MicroOp.VCLAMP, in_addr=0, out_addr=0xFFFE, n=6),
                  cmd(MicroOp.VPOOL, in_addr=0, in_stride=1, in_step=2, out_addr=L - 2,
                      n=6, window=2),
                  cmd(MicroOp.VARGMAX, addr=L - 2, n=30, index=1),
                  cmd(MicroOp.VCLAMP, part=9, in_addr=0, out_addr=0, n=1),
                  cmd(MicroOp.MATMUL, a_addr=L - 5, a_stride=1, b_addr=0, k=9),
                  cmd(MicroOp.ACC_BIAS, addr=L - 2)):
            ref_before = list(b.ref.mem)
            assert b.ref.run(c.op, c.fields, c.part).fault, c
            ref_wrote = [i for i, word in enumerate(b.ref.mem) if word != ref_before[i]]
            res = await issue(ctx, b.dut, c)
            assert res.cycles > 0 and not ctx.get(b.dut.fault), c
            await ctx.tick()
            assert ctx.get(b.dut.cmd.ready) and not ctx.get(b.dut.fault), c
            mem = [ctx.get(b.spad.mem.data[i]) for i in range(CFG_4x4_1.spad_words)]
            assert [mem[i] for i in outside] == before, c
            # What the reference wrote before its fault, the unit wrote too.
            assert [mem[i] for i in ref_wrote] == [b.ref.mem[i] for i in ref_wrote], c
            b.ref.mem = mem         # the unit's words past the fault are its own

    b.run(bench)
