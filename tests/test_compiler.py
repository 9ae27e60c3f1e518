"""The kernel compiler: compiled graphs on the golden model equal the IR's reference
bit for bit, under both policies; Verilator equals the model (``cocotb`` marker)."""

import numpy as np
import pytest

from fusetile.host import open_transport
from fusetile.host.device import Device
from fusetile.host.runner import infer, load_program
from fusetile.kernels.compiler import (POLICIES, CompileError, compile_graph, fusion_kind,
                                       resident, static_groups)
from fusetile.kernels.config import TileConfig
from fusetile.kernels.graph import (Add, AvgPool, Clamp, Conv, Dense, Flatten, Graph, MaxPool,
                                    QTensor, Requant, run_reference)

from conftest import require_simulator


def _rq(rng, n, lo=1e-4, hi=4e-3):
    return Requant.from_scales(rng.uniform(lo, hi, n))


def _w(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def _b(rng, n):
    return rng.integers(-20000, 20000, n).astype(np.int32)


def _t(name, shape, rng):
    return QTensor(name, tuple(shape), float(rng.uniform(0.01, 0.2)), int(rng.integers(-20, 20)))


def conv_net(seed, *, ci=3, co=5, hw=(6, 7), k=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1),
             pool=((2, 2), (2, 2), (0, 0, 0, 0)), dense=10):
    """Conv -> MaxPool -> Flatten -> Dense, random odd sizes."""
    rng = np.random.default_rng(seed)
    H, W = hw
    OH = (H + pads[0] + pads[2] - k[0]) // stride[0] + 1
    OW = (W + pads[1] + pads[3] - k[1]) // stride[1] + 1
    (pk, ps, pp) = pool
    PH = (OH + pp[0] + pp[2] - pk[0]) // ps[0] + 1
    PW = (OW + pp[1] + pp[3] - pk[1]) // ps[1] + 1
    T = {"x": _t("x", (ci, H, W), rng), "c": _t("c", (co, OH, OW), rng)}
    T["p"] = QTensor("p", (co, PH, PW), T["c"].scale, T["c"].zero_point)
    T["f"] = QTensor("f", (co * PH * PW,), T["c"].scale, T["c"].zero_point)
    T["y"] = _t("y", (dense,), rng)
    ops = [Conv("conv", "x", "c", _w(rng, (co, ci) + tuple(k)), _b(rng, co), _rq(rng, co),
                stride, pads, lo=T["c"].zero_point),
           MaxPool("pool", "c", "p", pk, ps, pp),
           Flatten("flat", "p", "f"),
           Dense("fc", "f", "y", _w(rng, (dense, co * PH * PW)), _b(rng, dense),
                 _rq(rng, dense, 1e-5, 1e-3))]
    return Graph(f"conv_net{seed}", T, ops, "x", "y")


def residual_net(seed):
    """Conv -> (Clamp, AvgPool 3x3 pad 1 count_include_pad) -> Add -> GAP -> Dense."""
    rng = np.random.default_rng(seed)
    T = {"x": _t("x", (2, 5, 5), rng), "c": _t("c", (9, 5, 5), rng)}
    T["r"] = QTensor("r", (9, 5, 5), T["c"].scale, T["c"].zero_point)
    T["a"] = _t("a", (9, 5, 5), rng)
    T["s"] = QTensor("s", (9, 5, 5), 1.0, 3)       # so that both scale ratios are < 1
    T["g"] = _t("g", (9, 1, 1), rng)
    T["f"] = QTensor("f", (9,), T["g"].scale, T["g"].zero_point)
    T["y"] = _t("y", (3,), rng)
    ops = [Conv("conv", "x", "c", _w(rng, (9, 2, 3, 3)), _b(rng, 9), _rq(rng, 9), (1, 1),
                (1, 1, 1, 1)),
           Clamp("relu", "c", "r", T["c"].zero_point, 127),
           AvgPool("avg", "c", "a", (3, 3), (1, 1), (1, 1, 1, 1), count_include_pad=True),
           Add("add", "r", "a", "s", int(T["r"].scale * 2**31), int(T["a"].scale * 2**31), 0),
           AvgPool("gap", "s", "g", (5, 5), (1, 1)),
           Flatten("flat", "g", "f"),
           Dense("fc", "f", "y", _w(rng, (3, 9)), _b(rng, 3), _rq(rng, 3))]
    return Graph(f"residual{seed}", T, ops, "x", "y")


def avg_net(seed, *, co=9, hw=(5, 6), kernel=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1)):
    """Conv -> AvgPool with padding and without count_include_pad (border windows
    divide by the elements inside the map) -> Flatten -> Dense."""
    rng = np.random.default_rng(seed)
    H, W = hw
    OH = (H + pads[0] + pads[2] - kernel[0]) // stride[0] + 1
    OW = (W + pads[1] + pads[3] - kernel[1]) // stride[1] + 1
    T = {"x": _t("x", (2, H, W), rng), "c": _t("c", (co, H, W), rng), "y": _t("y", (4,), rng)}
    T["a"] = QTensor("a", (co, OH, OW), T["c"].scale, 3)     # as the quantiser does
    T["f"] = QTensor("f", (co * OH * OW,), T["a"].scale, T["a"].zero_point)
    ops = [Conv("conv", "x", "c", _w(rng, (co, 2, 3, 3)), _b(rng, co), _rq(rng, co), (1, 1),
                (1, 1, 1, 1)),
           AvgPool("avg", "c", "a", kernel, stride, pads, count_include_pad=False),
           Flatten("flat", "a", "f"),
           Dense("fc", "f", "y", _w(rng, (4, co * OH * OW)), _b(rng, 4),
                 _rq(rng, 4, 1e-5, 1e-3))]
    return Graph(f"avg{seed}", T, ops, "x", "y")


def _planes(graph, seed):
    """``graph`` with its Conv and Dense weights widened to -255..255 (as a folded weight
    zero point leaves them): the compiler runs two int8 planes."""
    rng = np.random.default_rng(seed)
    for op in graph.ops:
        if isinstance(op, (Conv, Dense)):
            op.weight = rng.integers(-255, 256, op.weight.shape).astype(np.int16)
            op.requant = _rq(rng, len(op.bias), 1e-5, 5e-4)
    return graph


GRAPHS = {
    "conv3x3": lambda: conv_net(1),
    "conv5x5_stride2_wide": lambda: conv_net(2, ci=4, co=11, hw=(9, 8), k=(5, 5), stride=(2, 2),
                                             pads=(2, 1, 2, 1), pool=((1, 2), (1, 1), (0, 0, 0, 0))),
    "conv1x1_padded_pool": lambda: conv_net(3, ci=5, co=3, hw=(4, 5), k=(1, 1), pads=(0, 0, 0, 0),
                                            pool=((3, 3), (2, 2), (1, 1, 1, 1))),
    "residual": lambda: residual_net(4),
    "weight_planes": lambda: _planes(conv_net(13), 14),
    "avgpool_borders": lambda: avg_net(19),
    "avgpool_borders_stride2": lambda: avg_net(20, hw=(7, 8), kernel=(3, 2), stride=(2, 2),
                                              pads=(1, 0, 1, 1)),
}


def _samples(graph, n, seed=9):
    rng = np.random.default_rng(seed)
    return rng.integers(-128, 128, (n,) + tuple(graph.tensors[graph.input].shape)).astype(np.int8)


def _reference(graph, xs):
    return np.stack([run_reference(graph, x)[graph.output] for x in xs])


def _run(target, graph, xs, policy, config=TileConfig(), groups=None):
    with open_transport(target, config=config) as transport:
        dev = Device(transport)
        program = compile_graph(graph, config, policy=policy, groups=groups)
        load_program(dev, program)
        return infer(dev, program, xs)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", GRAPHS)
def test_model_target_matches_reference(name, policy):
    graph = GRAPHS[name]()
    xs = _samples(graph, 11)                 # two groups of lanes, the second partial
    y, stats = _run("model", graph, xs, policy)
    assert np.array_equal(y, _reference(graph, xs))
    assert stats.samples == 11 and stats.runs == 2 * len(compile_graph(
        graph, TileConfig(), policy=policy).segments)
    assert stats.macs > 0


def test_static_fuses_conv_and_pool():
    graph = conv_net(1)
    none = compile_graph(graph, TileConfig(), policy="none")
    static = compile_graph(graph, TileConfig(), policy="static")
    assert static.calls < none.calls
    xs = _samples(graph, 8)
    _, s_none = _run("model", graph, xs, "none")
    _, s_static = _run("model", graph, xs, "static")
    assert s_static.dma_bytes_out < s_none.dma_bytes_out


def test_static_fuses_dense_chains():
    graph = _dense_chain(11, 40, 19)
    assert static_groups(graph, TileConfig()) == [("fc1", "fc2")]
    xs = _samples(graph, 8)
    y, s_static = _run("model", graph, xs, "static")
    assert np.array_equal(y, _reference(graph, xs))
    _, s_none = _run("model", graph, xs, "none")
    assert s_static.active_cycles < s_none.active_cycles
    assert s_static.dma_bytes_out < s_none.dma_bytes_out      # the hidden vector stays
    # a chain that does not fit one kernel stays apart
    tiny = TileConfig(spad_banks=2, spad_bank_words=64)
    assert static_groups(graph, tiny) == []


def test_a_resident_kernel_keeps_its_constants_in_the_scratchpad():
    graph = _dense_chain(11, 40, 19)
    cold = compile_graph(graph, TileConfig(), policy="static")
    warm = resident(cold)
    (body,), (kept,) = cold.segments[0].kernels.values(), warm.segments[0].kernels.values()
    assert warm.resident and len(kept) < len(body)
    assert set(body) - set(kept) == cold.constant_loads
    xs = _samples(graph, 8)
    with open_transport("model") as transport:
        dev = Device(transport)
        load_program(dev, warm)                  # nothing has loaded the constants yet
        y, _ = infer(dev, warm, xs)
        assert not np.array_equal(y, _reference(graph, xs))
        load_program(dev, cold)
        _, s_cold = infer(dev, cold, xs)
        load_program(dev, warm)
        y, s_warm = infer(dev, warm, xs)
    assert np.array_equal(y, _reference(graph, xs))
    assert s_cold.dma_bytes_in - s_warm.dma_bytes_in == \
        cold.constant_words * TileConfig().word_bytes
    assert s_warm.active_cycles < s_cold.active_cycles


def test_only_a_one_kernel_plan_keeps_its_constants():
    with pytest.raises(CompileError, match="one kernel runs the whole plan"):
        resident(compile_graph(conv_net(1), TileConfig(), policy="static"))


def test_a_group_runs_where_its_last_op_is():
    """Two chains interleaved in graph order (a mixture of experts' experts): each fused
    unit is compiled once, after every op it reads from."""
    from fusetile.host.bench import _workload
    graph = _workload("moe")
    groups = static_groups(graph, TileConfig())
    assert ("expert0_fc1", "expert0_fc2") in groups
    program = compile_graph(graph, TileConfig(), policy="static")
    assert len(program.groups) == len(set(program.groups))
    xs = _samples(graph, 3)
    y, _ = _run("model", graph, xs, "static")
    assert np.array_equal(y, _reference(graph, xs))


#: Fused units: (graph, groups, kind of the first group).
FUSED = {
    "conv+pool+dense": (lambda: conv_net(1), [("conv", "pool", "flat", "fc")],
                        "conv+pool+dense"),
    "conv+pool+dense_wide": (lambda: conv_net(2, ci=4, co=11, hw=(9, 8), k=(5, 5),
                                              stride=(2, 2), pads=(2, 1, 2, 1),
                                              pool=((1, 2), (1, 1), (0, 0, 0, 0))),
                             [("conv", "pool", "fc")], "conv+pool+dense"),
    "dense chain": (lambda: _dense_chain(11, 40, 19), [("fc1", "fc2")], "dense chain"),
    "add+pool": (lambda: residual_pool_net(12), [("add", "pool")], "add+pool"),
    "conv+add+pool": (lambda: residual_pool_net(22), [("conv2", "add", "pool")],
                      "conv+add+pool"),
    "planes": (lambda: _planes(conv_net(17), 18), [("conv", "pool", "flat", "fc")],
               "conv+pool+dense"),
}


def residual_pool_net(seed):
    """Conv (its map padded by the next conv) + Conv -> Add -> MaxPool 2x2 -> Dense: the
    two addends have different rings, which the compiler evens out."""
    rng = np.random.default_rng(seed)
    T = {"x": _t("x", (3, 6, 6), rng), "c": _t("c", (4, 6, 6), rng),
         "d": _t("d", (4, 6, 6), rng), "s": QTensor("s", (4, 6, 6), 1.0, 2),
         "p": QTensor("p", (4, 3, 3), 1.0, 2), "y": _t("y", (5,), rng)}
    T["f"] = QTensor("f", (36,), 1.0, 2)
    ops = [Conv("conv", "x", "c", _w(rng, (4, 3, 3, 3)), _b(rng, 4), _rq(rng, 4), (1, 1),
                (1, 1, 1, 1)),
           Conv("conv2", "c", "d", _w(rng, (4, 4, 3, 3)), _b(rng, 4), _rq(rng, 4), (1, 1),
                (1, 1, 1, 1)),
           Add("add", "d", "c", "s", int(T["d"].scale * 2**31), int(T["c"].scale * 2**31), 0),
           MaxPool("pool", "s", "p", (2, 2), (2, 2), (0, 0, 0, 0)),
           Flatten("flat", "p", "f"),
           Dense("fc", "f", "y", _w(rng, (5, 36)), _b(rng, 5), _rq(rng, 5, 1e-3, 1e-2))]
    return Graph(f"residual_pool{seed}", T, ops, "x", "y")


@pytest.mark.parametrize("name", FUSED)
def test_fused_units_match_reference(name):
    make, groups, kind = FUSED[name]
    graph = make()
    assert fusion_kind(graph, TileConfig(), groups[0]) == kind
    program = compile_graph(graph, TileConfig(), groups=groups)
    assert tuple(n for n in groups[0] if n != "flat") in program.groups   # Flatten moves nothing
    unfused = compile_graph(graph, TileConfig(), policy="none")
    assert program.calls < unfused.calls
    xs = _samples(graph, 11)
    y, stats = _run("model", graph, xs, "none", groups=groups)
    assert np.array_equal(y, _reference(graph, xs))
    _, none = _run("model", graph, xs, "none")
    assert stats.dma_bytes_in + stats.dma_bytes_out < none.dma_bytes_in + none.dma_bytes_out


def test_stable_layout_shares_one_gmem_image():
    graph = conv_net(1)
    images = {compile_graph(graph, TileConfig(), groups=g, stable_layout=True).gmem
              for g in ([], static_groups(graph, TileConfig()), FUSED["conv+pool+dense"][1])}
    assert len(images) == 1
    compact = compile_graph(graph, TileConfig(), policy="static")
    assert len(compact.gmem) < len(images.pop())     # the conv map is not allocated


@pytest.mark.parametrize("groups, message", [
    ([("conv", "fc")], "not the only consumer"),
    ([("conv", "pool"), ("pool", "fc")], "in two groups"),
    ([("conv", "nope")], "no op 'nope'"),
    ([("pool", "fc")], "fuses a conv or an add with a max-pool"),
])
def test_groups_that_do_not_fuse_are_refused(groups, message):
    with pytest.raises(CompileError, match=message):
        compile_graph(conv_net(1), TileConfig(), groups=groups)


def test_padded_pool_does_not_fuse():
    graph = GRAPHS["conv1x1_padded_pool"]()
    assert static_groups(graph, TileConfig()) == []
    with pytest.raises(CompileError, match="padded max-pool"):
        fusion_kind(graph, TileConfig(), ("conv", "pool"))


def test_segments_when_the_plan_is_short():
    """A plan bank too short for all the calls: the program runs in segments."""
    config = TileConfig(plan_depth=8)
    graph = conv_net(1)
    program = compile_graph(graph, config, policy="none")
    assert len(program.segments) > 1
    assert all(len(s.plan) <= 8 for s in program.segments)
    xs = _samples(graph, 3)
    y, _ = _run("model", graph, xs, "none", config)
    assert np.array_equal(y, _reference(graph, xs))


def big_net(seed):
    """Conv 3x3 32 -> 64 channels on 4x4 (weights of 8 groups: 2,400 words) -> Flatten ->
    Dense 1024 -> 10 (2,072 words): on the default 2,048-word scratchpad the conv runs
    in passes over output channels and the dense layer streams its weights."""
    return conv_net(seed, ci=32, co=64, hw=(4, 4), pool=((1, 1), (1, 1), (0, 0, 0, 0)))


#: Layers that do not fit a small scratchpad (512 words) in one piece.
SPLIT_GRAPHS = {
    # conv weights 3 groups x 160 words: passes over output channels
    "conv_passes": lambda: conv_net(5, ci=16, co=20, hw=(6, 7)),
    # dense over a 20 x 5 x 5 map (500 words): window rows streamed with the weights
    "dense_streamed_rows": lambda: conv_net(6, ci=3, co=20, hw=(10, 10), dense=11),
    # dense over a vector of 700: pieces of one window row, window not resident
    "dense_streamed_pieces": lambda: _dense_chain(7, 700, 13),
    # dense over a vector of 300: the window resident, the weights streamed in pieces
    "dense_streamed_resident": lambda: _dense_chain(9, 300, 10),
    # weights in two planes, streamed: every chunk once per plane
    "dense_streamed_planes": lambda: _planes(_dense_chain(15, 300, 10), 16),
    # an AvgPool over 40 channels (one-hot weights of 5 groups do not fit): streamed,
    # each border pixel with its own requantisation table
    "avgpool_borders_streamed": lambda: avg_net(21, co=40, hw=(4, 5)),
    # 5x5 conv over 24 channels (K = 600): each pixel's window streamed
    "conv_streamed": lambda: conv_net(8, ci=24, co=9, hw=(5, 5), k=(5, 5),
                                      pads=(2, 2, 2, 2), pool=((2, 2), (1, 1), (0, 0, 0, 0))),
}


def _dense_chain(seed, k, n):
    rng = np.random.default_rng(seed)
    T = {"x": _t("x", (k,), rng), "h": _t("h", (n,), rng), "y": _t("y", (5,), rng)}
    ops = [Dense("fc1", "x", "h", _w(rng, (n, k)), _b(rng, n), _rq(rng, n, 1e-5, 5e-4)),
           Dense("fc2", "h", "y", _w(rng, (5, n)), _b(rng, 5), _rq(rng, 5))]
    return Graph(f"dense{seed}", T, ops, "x", "y")


SMALL_SPAD = TileConfig(spad_banks=2, spad_bank_words=256)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", SPLIT_GRAPHS)
def test_large_layers_split_across_passes(name, policy):
    graph = SPLIT_GRAPHS[name]()
    program = compile_graph(graph, SMALL_SPAD, policy=policy)
    split = {name: t for name, t in program.tilings.items()
             if t.streamed or t.passes > 1}
    assert split, program.tilings        # at least one layer did not fit in one piece
    xs = _samples(graph, 9)
    y, _ = _run("model", graph, xs, policy, SMALL_SPAD)
    assert np.array_equal(y, _reference(graph, xs))


def test_too_big_is_a_clear_error():
    # a map larger than GMEM: named by the graph
    graph = conv_net(1, ci=64, co=64, hw=(30, 30))
    with pytest.raises(CompileError, match=r"conv_net1.*GMEM"):
        compile_graph(graph, TileConfig(), policy="none")
    # a max-pool whose window the vector unit cannot take: named by the node
    graph = conv_net(1, pool=((16, 2), (1, 1), (0, 0, 0, 0)), hw=(17, 7), pads=(1, 1, 1, 1))
    with pytest.raises(CompileError, match=r"node 'pool' \(MaxPool\)"):
        compile_graph(graph, TileConfig(), policy="none")


@pytest.mark.cocotb
@pytest.mark.parametrize("policy", POLICIES)
def test_verilator_matches_model(policy):
    require_simulator("verilator")
    graph = residual_net(4) if policy == "none" else conv_net(1)
    xs = _samples(graph, 8)
    y_model, model_stats = _run("model", graph, xs, policy)
    y_rtl, stats = _run("verilator", graph, xs, policy)
    assert np.array_equal(y_rtl, y_model)
    assert stats.macs == model_stats.macs


@pytest.mark.cocotb
@pytest.mark.parametrize("name", ["big_net", "dense_2400"])
def test_verilator_runs_split_layers(name):
    """Passes over output channels and streamed weights (double-buffered DMA beside the
    MAC array) on the RTL, default configuration: bit-identical to the model."""
    require_simulator("verilator")
    graph = big_net(3) if name == "big_net" else _dense_chain(10, 2400, 6)
    program = compile_graph(graph, TileConfig(), policy="none")
    assert any(t.streamed for t in program.tilings.values())
    xs = _samples(graph, 8)
    y_model, model_stats = _run("model", graph, xs, "none")
    y_rtl, stats = _run("verilator", graph, xs, "none")
    assert np.array_equal(y_rtl, _reference(graph, xs))
    assert np.array_equal(y_rtl, y_model)
    assert stats.macs == model_stats.macs


@pytest.mark.cocotb
@pytest.mark.parametrize("name", ["conv+pool+dense", "dense chain", "add+pool", "conv+add+pool",
                                  "planes"])
def test_verilator_runs_fused_units(name):
    """The fused kinds beyond the static rules on the RTL: bit-identical to the model."""
    require_simulator("verilator")
    make, groups, _ = FUSED[name]
    graph = make()
    xs = _samples(graph, 8)
    y_model, model_stats = _run("model", graph, xs, "none", groups=groups)
    y_rtl, stats = _run("verilator", graph, xs, "none", groups=groups)
    assert np.array_equal(y_rtl, y_model)
    assert stats.macs == model_stats.macs and stats.kernel_calls == model_stats.kernel_calls


@pytest.mark.cocotb
def test_verilator_avgpool_borders():
    """Border pixels of an AvgPool without count_include_pad use their own tables."""
    require_simulator("verilator")
    graph = GRAPHS["avgpool_borders_stride2"]()
    xs = _samples(graph, 8)
    y_rtl, _ = _run("verilator", graph, xs, "none")
    assert np.array_equal(y_rtl, _reference(graph, xs))
