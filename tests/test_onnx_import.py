"""The ONNX importer against onnxruntime.

Small float models are built with ``onnx.helper``, quantised with onnxruntime's
``quantize_static`` (QDQ; int8 and uint8 activations; per-tensor and per-channel
weights), imported with :func:`load_model` and run with the IR's reference
(:func:`run_reference`), sample by sample; onnxruntime runs the quantised model. Every
output element must be within one quantisation step of onnxruntime's, and at least
99.9 % of them identical over all samples and models. QOperator models (QLinearConv,
QLinearMatMul) are built by hand and compared the same way, and the importer must
refuse what the IR cannot express with a :class:`GraphError` naming node and op.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

from fusetile.host.onnx_import import load_model
from fusetile.workloads.digits import session
from fusetile.kernels.graph import Add, AvgPool, Conv, Dense, GraphError, run_reference


SAMPLES = 64            # per model
OPSET = 13
IR_VERSION = 8          # what onnxruntime 1.18+ loads


# -- building and quantising models -------------------------------------------------------

def _init(name, array, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(array, dtype=dtype), name)


def _model(name, nodes, inits, in_shape, out_shape, *, in_type=TensorProto.FLOAT,
           out_type=TensorProto.FLOAT, opset=OPSET):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", in_type, in_shape)],
                              [helper.make_tensor_value_info("y", out_type, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    return model


def _weights(rng, *shape):
    """He-scaled normal weights, so that activations neither vanish nor explode."""
    fan_in = int(np.prod(shape[1:]))
    return rng.normal(size=shape) * np.sqrt(2.0 / fan_in)


def mlp(rng):
    """Gemm (transB 1) -> Relu -> Gemm (transB 0) -> Relu -> Gemm."""
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1", transB=1),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], name="fc2"),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node("Gemm", ["r2", "w3", "b3"], ["y"], name="fc3", transB=1),
    ]
    inits = [_init("w1", _weights(rng, 23, 37)), _init("b1", rng.normal(size=23) * 0.1),
             _init("w2", _weights(rng, 11, 23).T), _init("b2", rng.normal(size=11) * 0.1),
             _init("w3", _weights(rng, 5, 11)), _init("b3", rng.normal(size=5) * 0.1)]
    return _model("mlp", nodes, inits, [1, 37], [1, 5])


def convnet(rng):
    """Conv 3x3 pad 1 (3 -> 5), Conv 5x5 stride 2 (5 -> 7), Conv 1x1 (7 -> 4), MaxPool,
    Flatten, Gemm, on an odd-sized map."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv3x3", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv5x5", strides=[2, 2],
                         pads=[2, 2, 2, 2], kernel_shape=[5, 5]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv1x1"),
        helper.make_node("MaxPool", ["c3"], ["p"], name="maxpool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["y"], name="fc", transB=1),
    ]
    inits = [_init("w1", _weights(rng, 5, 3, 3, 3)), _init("b1", rng.normal(size=5) * 0.1),
             _init("w2", _weights(rng, 7, 5, 5, 5)), _init("b2", rng.normal(size=7) * 0.1),
             _init("w3", _weights(rng, 4, 7, 1, 1)), _init("b3", rng.normal(size=4) * 0.1),
             _init("w4", _weights(rng, 6, 36)), _init("b4", rng.normal(size=6) * 0.1)]
    # 13 x 11 -> 13 x 11 -> 7 x 6 -> 7 x 6 -> 3 x 3
    return _model("convnet", nodes, inits, [1, 3, 13, 11], [1, 6])


def pools(rng):
    """AveragePool with pads (count_include_pad 1), MaxPool with pads, AveragePool
    without pads (count_include_pad 0), GlobalAveragePool, Reshape, MatMul."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("AveragePool", ["r1"], ["a1"], name="avg_pad_incl",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        helper.make_node("MaxPool", ["a1"], ["m1"], name="max_pad", kernel_shape=[3, 3],
                         strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["m1"], ["a2"], name="avg_nopad",
                         kernel_shape=[3, 3], count_include_pad=0),
        helper.make_node("GlobalAveragePool", ["a2"], ["g"], name="gap"),
        helper.make_node("Reshape", ["g", "shape"], ["f"], name="reshape"),
        helper.make_node("MatMul", ["f", "w2"], ["y"], name="matmul"),
    ]
    inits = [_init("w1", _weights(rng, 6, 3, 3, 3)), _init("b1", rng.normal(size=6) * 0.1),
             _init("shape", [1, -1], np.int64), _init("w2", _weights(rng, 5, 6).T)]
    # 12 x 10 -> 12 x 10 -> 12 x 10 -> 6 x 5 -> 4 x 3 -> 1 x 1. The quantiser gives an
    # AveragePool its input's scale, so a window of an even count often has a mean
    # ending in exactly .5, where onnxruntime's float paths disagree with each other:
    # these windows all have 9 elements (see test_avgpool_border_windows for the rest).
    return _model("pools", nodes, inits, [1, 3, 12, 10], [1, 5])


def residual(rng):
    """Two ReLU branches added (a residual block), GlobalAveragePool, Flatten, Gemm.
    (Both addends are ReLU'd: after an Add of a signed tensor and a ReLU, the output
    scale can be finer than an input's, which the tile's VADD cannot do.)"""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="stem_relu"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv_a", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu_a"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv_b"),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu_b"),
        helper.make_node("Add", ["r1", "r3"], ["s"], name="residual_add"),
        helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["y"], name="fc", transB=1),
    ]
    inits = [_init("w1", _weights(rng, 6, 4, 3, 3)), _init("b1", rng.normal(size=6) * 0.1),
             _init("w2", _weights(rng, 6, 6, 3, 3)), _init("b2", rng.normal(size=6) * 0.1),
             _init("w3", _weights(rng, 6, 6, 1, 1)), _init("b3", rng.normal(size=6) * 0.1),
             _init("w4", _weights(rng, 3, 6)), _init("b4", rng.normal(size=3) * 0.1)]
    return _model("residual", nodes, inits, [1, 4, 9, 9], [1, 3])


MODELS = {"mlp": mlp, "convnet": convnet, "pools": pools, "residual": residual}
VARIANTS = [(act, pc) for act in ("int8", "uint8") for pc in (False, True)]


class _Reader(CalibrationDataReader):
    def __init__(self, samples):
        self._it = iter([{"x": s[None]} for s in samples])

    def get_next(self):
        return next(self._it, None)


def _input_shape(model):
    return [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][1:]


def quantise(model, path, *, activations="int8", per_channel=False, seed=0,
             weights=QuantType.QInt8, **kwargs):
    """QDQ-quantise ``model`` to ``path`` with a small random calibration set."""
    rng = np.random.default_rng(seed)
    calibration = rng.normal(size=[16] + _input_shape(model)).astype(np.float32)
    act = QuantType.QInt8 if activations == "int8" else QuantType.QUInt8
    float_path = f"{path}.float.onnx"
    onnx.save(model, float_path)
    quantize_static(float_path, str(path), _Reader(calibration), quant_format=QuantFormat.QDQ,
                    activation_type=act, weight_type=weights,
                    per_channel=per_channel, **kwargs)
    return str(path)


def compare_with_ort(path, graph, samples):
    """Output differences (reference - onnxruntime) in output quantisation steps."""
    sess = session(path)
    name = sess.get_inputs()[0].name
    scale = graph.tensors[graph.output].scale
    steps = []
    for x in samples:
        ref = run_reference(graph, graph.quantize_input(x[None])[0])[graph.output]
        theirs = sess.run(None, {name: x[None]})[0].reshape(-1)
        diff = (graph.dequantize_output(ref).reshape(-1) - theirs) / scale
        steps.append(np.rint(diff).astype(np.int64))
    return np.concatenate(steps)


def compare_tensors(path, graph, samples):
    """Differences (reference - onnxruntime, int8 steps) of every IR tensor that is an
    ONNX tensor, from onnxruntime run with them as extra graph outputs."""
    model = onnx.load(path)
    known = {o for n in model.graph.node for o in n.output}
    names = [t for t in graph.tensors if t in known and t != graph.input]
    sess = _session_with_outputs(path, names)
    diffs = []
    for x in samples:
        env = run_reference(graph, graph.quantize_input(x[None])[0])
        outs = sess.run(names, {"x": x[None]})
        for t, theirs in zip(names, outs):
            theirs = theirs.astype(np.int64) - (128 if theirs.dtype == np.uint8 else 0)
            diffs.append(env[t].astype(np.int64).reshape(-1) - theirs.reshape(-1))
    return names, np.concatenate(diffs)


@pytest.fixture(scope="module")
def qdq_results(tmp_path_factory):
    """{(model, activations, per_channel): (graph, output step differences, tensor
    step differences)} for every model and quantisation."""
    out = tmp_path_factory.mktemp("qdq")
    results = {}
    for m_index, (name, build) in enumerate(MODELS.items()):
        model = build(np.random.default_rng(100 + m_index))
        for v_index, (act, pc) in enumerate(VARIANTS):
            path = quantise(model, out / f"{name}_{act}_{pc}.onnx", activations=act,
                            per_channel=pc, seed=m_index)
            graph = load_model(path)
            rng = np.random.default_rng(1000 + 10 * m_index + v_index)
            samples = rng.normal(size=[SAMPLES] + _input_shape(model)).astype(np.float32)
            _, tensors = compare_tensors(path, graph, samples[:16])
            results[name, act, pc] = (graph, compare_with_ort(path, graph, samples), tensors)
    return results


# -- QDQ: agreement with onnxruntime ------------------------------------------------------

@pytest.mark.parametrize("act,per_channel", VARIANTS)
@pytest.mark.parametrize("name", list(MODELS))
def test_qdq_within_one_step(qdq_results, name, act, per_channel):
    _, steps, tensors = qdq_results[name, act, per_channel]
    assert np.abs(steps).max() <= 1
    assert np.abs(tensors).max() <= 1


def test_qdq_agreement_overall(qdq_results):
    steps = np.concatenate([s for _, s, _ in qdq_results.values()])
    identical = np.mean(steps == 0)
    assert steps.size >= 16 * SAMPLES * 3
    assert identical >= 0.999, f"only {identical:.4%} of the outputs identical"
    tensors = np.concatenate([t for _, _, t in qdq_results.values()])
    identical = np.mean(tensors == 0)
    assert identical >= 0.999, f"only {identical:.4%} of the tensors identical"


def test_qdq_lowering(qdq_results):
    """The ops the importer made, and the names it gave the tensors."""
    kinds = {name: [type(op).__name__ for op in g.ops]
             for (name, act, pc), (g, _, _) in qdq_results.items() if (act, pc) == ("int8", False)}
    assert kinds["mlp"] == ["Dense"] * 3
    assert kinds["convnet"] == ["Conv", "Conv", "Conv", "MaxPool", "Flatten", "Dense"]
    assert kinds["pools"] == ["Conv", "AvgPool", "MaxPool", "AvgPool", "AvgPool", "Flatten",
                              "Dense"]
    assert kinds["residual"] == ["Conv"] * 3 + ["Add", "AvgPool", "Flatten", "Dense"]
    g = qdq_results["convnet", "uint8", True][0]
    conv = g.ops[0]
    assert conv.name == "conv3x3" and conv.x == g.input and conv.weight.shape == (5, 3, 3, 3)
    assert conv.pads == (1, 1, 1, 1) and g.ops[1].stride == (2, 2)
    assert len(set(conv.requant.multiplier.tolist())) > 1          # per channel
    assert g.tensors[g.input].shape == (3, 13, 11)
    assert g.tensors[g.output].shape == (6,)
    assert g.ops[0].y.endswith("QuantizeLinear_Output")
    assert all(-128 <= t.zero_point <= 127 for t in g.tensors.values())
    # uint8 activations: a ReLU'd tensor's zero point is 0 - 128
    assert g.tensors[g.ops[1].y].zero_point == -128


# -- QDQ: ops the quantiser leaves as nodes -------------------------------------------------

@pytest.mark.parametrize("act", ["int8", "uint8"])
def test_requantising_relu_and_flatten(tmp_path, act):
    """The quantiser keeps a ReLU whose input has another reader, with its own output
    scale; and quantises a Flatten after a float MaxPool with a new scale. Both need a
    requantisation, which the IR writes as a 1x1 convolution with weights k * I (ratio
    of scales 2 or more) or an Add of the tensor with itself (below 2)."""
    rng = np.random.default_rng(31)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Add", ["c1", "r2"], ["a"], name="add"),
        helper.make_node("Identity", ["a"], ["ai"], name="identity"),
        helper.make_node("MaxPool", ["ai"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1),
    ]
    inits = [_init("w1", rng.normal(size=(5, 3, 3, 3)) * 0.3),
             _init("b1", rng.normal(size=5) * 0.1),
             _init("w2", rng.normal(size=(5, 5, 3, 3)) * 0.3),
             _init("b2", rng.normal(size=5) * 0.1),
             _init("w3", rng.normal(size=(7, 80)) * 0.1), _init("b3", rng.normal(size=7))]
    model = _model("requant", nodes, inits, [1, 3, 8, 8], [1, 7])
    path = quantise(model, tmp_path / "m.onnx", activations=act, seed=0)
    graph = load_model(path)
    names = [f"{type(op).__name__}:{op.name}" for op in graph.ops]
    assert names[0] == "Conv:conv1" and names[1] in ("Conv:relu1", "Add:relu1")
    assert graph.ops[1].lo == graph.tensors[graph.ops[1].y].zero_point   # the ReLU
    assert "Add:flatten:requant" in names
    samples = rng.normal(size=(SAMPLES, 3, 8, 8)).astype(np.float32)
    steps = compare_with_ort(path, graph, samples)
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


@pytest.mark.parametrize("ratio", [1.37, 2.9, 21.0])
def test_requantising_relu(tmp_path, ratio):
    """DQ -> Relu -> Q to a finer scale: an Add of the tensor with itself below a ratio
    of 2, else a 1x1 convolution with weights k * I; both clamp at the zero point."""
    s_x = 0.0473
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
        helper.make_node("Relu", ["xd"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["rq"], name="qr"),
        helper.make_node("DequantizeLinear", ["rq", "sy", "zy"], ["y"], name="dqr"),
    ]
    inits = [_init("sx", s_x), _init("zx", 7, np.int8), _init("sy", s_x / ratio),
             _init("zy", -128, np.int8)]
    path = tmp_path / "relu.onnx"
    onnx.save(_model("relu", nodes, inits, [1, 4, 3, 5], [1, 4, 3, 5]), path)
    graph = load_model(path)
    (op,) = graph.ops
    assert op.name == "relu" and op.lo == -128
    if ratio < 2:
        assert isinstance(op, Add) and op.a == op.b == graph.input
    else:
        k = 2 ** int(np.ceil(np.log2(ratio)))
        assert isinstance(op, Conv)
        assert np.array_equal(op.weight.reshape(4, 4), k * np.eye(4))
    samples = np.random.default_rng(13).normal(size=(SAMPLES, 4, 3, 5)).astype(np.float32)
    steps = compare_with_ort(str(path), graph, samples * 0.1)
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


def test_relu_and_clip_between_dq_and_q(tmp_path):
    """Hand-written QDQ: Conv -> Relu -> Q folds into the Conv's clamp; a standalone
    DQ -> Relu -> Q with the same parameters becomes a Clamp, which then folds into its
    producer; Clip(0, 6) the same way."""
    rng = np.random.default_rng(7)
    s_x, s_y = 0.0473, 0.0391           # not round: round ones make exact ties common
    w = rng.integers(-127, 128, size=(4, 2, 3, 3)).astype(np.int8)
    b = rng.integers(-500, 500, size=4).astype(np.int32)
    s_w = np.float32(0.0107)
    w2 = rng.integers(-127, 128, size=(3, 4, 1, 1)).astype(np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], name="dqw"),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"], name="dqb"),
        helper.make_node("DequantizeLinear", ["w2q", "sw2", "zw"], ["wd2"], name="dqw2"),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu_fused"),
        helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["rq"], name="qr"),
        helper.make_node("DequantizeLinear", ["rq", "sy", "zy"], ["rd"], name="dqr"),
        helper.make_node("Conv", ["rd", "wd2"], ["c2"], name="conv2"),
        helper.make_node("QuantizeLinear", ["c2", "sy", "zy"], ["c2q"], name="qc2"),
        helper.make_node("DequantizeLinear", ["c2q", "sy", "zy"], ["c2d"], name="dqc2"),
        helper.make_node("Clip", ["c2d", "lo", "hi"], ["cl"], name="clip"),
        helper.make_node("QuantizeLinear", ["cl", "sy", "zy"], ["y8"], name="qy"),
        helper.make_node("DequantizeLinear", ["y8", "sy", "zy"], ["y"], name="dqy"),
    ]
    inits = [_init("sx", s_x), _init("zx", 3, np.int8), _init("wq", w, np.int8),
             _init("sw", s_w), _init("zw", 0, np.int8), _init("bq", b, np.int32),
             _init("sb", np.float32(s_x) * s_w), _init("zb", 0, np.int32),
             _init("w2q", w2, np.int8), _init("sw2", 0.0213),
             _init("sy", s_y), _init("zy", -10, np.int8), _init("lo", 0.0), _init("hi", 1.0)]
    model = _model("relu_clip", nodes, inits, [1, 2, 7, 5], [1, 3, 7, 5])
    path = tmp_path / "relu_clip.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    assert [type(op).__name__ for op in graph.ops] == ["Conv", "Conv"]
    conv, conv2 = graph.ops
    assert conv.lo == -10 and conv.hi == 127                          # Relu: lo = zp_y
    assert conv2.lo == -10 and conv2.hi == -10 + 26                   # Clip(0, 1): 1 / s_y
    samples = np.random.default_rng(8).normal(size=(SAMPLES, 2, 7, 5)).astype(np.float32)
    steps = compare_with_ort(str(path), graph, samples)
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


def test_avgpool_border_windows(tmp_path):
    """AveragePool 3x3 with pads and count_include_pad 0 divides border windows by 4
    and 6. The quantiser gives it its input's scale, so a window's exact mean often
    ends in .5; onnxruntime rounds those to even, while the tile's Q0.31 multiplier for
    1/6 is a little below it and rounds them down. So: within one step, and every
    difference on the pool's own output is such a tie."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["c"], ["y"], name="avg", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], count_include_pad=0),
    ]
    model = _model("avg_border", nodes, [_init("w", _weights(rng, 3, 2, 3, 3)),
                                         _init("b", np.zeros(3))], [1, 2, 7, 9], [1, 3, 7, 9])
    path = quantise(model, tmp_path / "avg.onnx")
    graph = load_model(path)
    assert isinstance(graph.ops[-1], AvgPool) and not graph.ops[-1].count_include_pad
    samples = rng.normal(size=(SAMPLES, 2, 7, 9)).astype(np.float32)
    steps = compare_with_ort(path, graph, samples)
    assert np.abs(steps).max() <= 1
    # The differences are ties: feed onnxruntime's own pool input to the rule.
    sess = _session_with_outputs(path, [graph.ops[-1].x])
    tx = graph.tensors[graph.ops[-1].x]
    for x, d in zip(samples, steps.reshape(SAMPLES, 3, 7, 9)):
        y, c = sess.run(None, {"x": x[None]})
        total = np.pad(c[0].astype(np.int64) - tx.zero_point, ((0, 0), (1, 1), (1, 1)))
        count = np.pad(np.ones((7, 9)), 1)
        for ch, i, j in zip(*np.nonzero(d)):
            s, n = total[ch, i:i + 3, j:j + 3].sum(), count[i:i + 3, j:j + 3].sum()
            assert 2 * s % n == 0 and (2 * s // n) % 2 == 1, "difference not at a tie"


def test_global_average_to_a_finer_scale(tmp_path):
    """GlobalAveragePool whose output scale is finer than ``s_x / count``: no AvgPool
    can requantise by 1 or more, so it becomes a convolution with weights k * I."""
    s_x, s_y = 0.0473, 0.0473 / 6.3                                 # count 4: ratio 1.575
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
        helper.make_node("GlobalAveragePool", ["xd"], ["g"], name="gap"),
        helper.make_node("QuantizeLinear", ["g", "sy", "zy"], ["gq"], name="qg"),
        helper.make_node("DequantizeLinear", ["gq", "sy", "zy"], ["y"], name="dqg"),
    ]
    inits = [_init("sx", s_x), _init("zx", 5, np.int8), _init("sy", s_y),
             _init("zy", -3, np.int8)]
    model = _model("gap_fine", nodes, inits, [1, 5, 2, 2], [1, 5, 1, 1])
    path = tmp_path / "gap.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    (op,) = graph.ops
    assert isinstance(op, Conv) and op.weight.shape == (5, 5, 2, 2)
    assert set(np.unique(op.weight)) == {0, 2}
    samples = np.random.default_rng(12).normal(size=(SAMPLES, 5, 2, 2)).astype(np.float32)
    steps = compare_with_ort(str(path), graph, samples * 0.3)
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


def test_uint8_weights_with_zero_point_128(tmp_path):
    """Symmetric uint8 weights (zero point 128) are int8 weights, shifted."""
    path = quantise(mlp(np.random.default_rng(21)), tmp_path / "u8w.onnx",
                    activations="uint8", weights=QuantType.QUInt8,
                    extra_options={"WeightSymmetric": True})
    zps = [numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer
           if i.name.endswith("zero_point") and i.data_type == TensorProto.UINT8]
    assert any(np.all(z == 128) for z in zps)
    graph = load_model(path)
    samples = np.random.default_rng(22).normal(size=(SAMPLES, 37)).astype(np.float32)
    steps = compare_with_ort(path, graph, samples)
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


def _matmul_add(rng):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b"], ["y"], name="bias_add")]
    return _model("mm_add", nodes, [_init("w", _weights(rng, 9, 13).T),
                                    _init("b", rng.normal(size=9))], [1, 13], [1, 9])


def test_matmul_bias_add(tmp_path):
    """The quantiser quantises a MatMul's output before a separate bias Add, which then
    adds a constant tensor: refused (the IR has no constants), with the way out,
    quant_pre_process, which fuses MatMul + Add into a Gemm that imports."""
    from onnxruntime.quantization.shape_inference import quant_pre_process
    model = _matmul_add(np.random.default_rng(23))
    with pytest.raises(GraphError, match=r"node 'bias_add' \(Add\): adds a constant.*"
                                         r"quant_pre_process"):
        load_model(quantise(model, tmp_path / "q.onnx"))
    onnx.save(model, tmp_path / "f.onnx")
    quant_pre_process(str(tmp_path / "f.onnx"), str(tmp_path / "pre.onnx"),
                      skip_symbolic_shape=True)
    path = quantise(onnx.load(tmp_path / "pre.onnx"), tmp_path / "qpre.onnx")
    graph = load_model(path)
    assert [type(op).__name__ for op in graph.ops] == ["Dense"]
    samples = np.random.default_rng(24).normal(size=(SAMPLES, 13)).astype(np.float32)
    steps = compare_with_ort(path, graph, samples)
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


def test_bias_add_before_quantize_folds(tmp_path):
    """DQ -> MatMul -> Add(DQ(int32 bias)) -> Relu -> Q, no Q in between: the Add is
    the Dense's bias and the Relu its clamp. (A float bias would be rounded to
    accumulator units, which is not always the float sum onnxruntime rounds.)"""
    rng = np.random.default_rng(25)
    w = rng.integers(-127, 128, size=(13, 9)).astype(np.int8)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], name="dqw", axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["m"], name="matmul"),
        helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["b"], name="dqb", axis=1),
        helper.make_node("Add", ["b", "m"], ["a"], name="bias_add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["yq"], name="qy"),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], name="dqy"),
    ]
    s_w = rng.uniform(0.003, 0.006, size=9).astype(np.float32)
    inits = [_init("sx", 0.0313), _init("zx", 4, np.int8), _init("wq", w, np.int8),
             _init("sw", s_w), _init("zw", np.zeros(9), np.int8),
             _init("bq", rng.integers(-3000, 3000, size=(1, 9)), np.int32),
             _init("sb", np.float32(0.0313) * s_w), _init("zb", np.zeros(9), np.int32),
             _init("sy", 0.0217), _init("zy", -128, np.int8)]
    model = _model("fold", nodes, inits, [1, 13], [1, 9])
    path = tmp_path / "fold.onnx"
    onnx.save(model, path)
    graph = load_model(path)
    (dense,) = graph.ops
    assert isinstance(dense, Dense) and dense.lo == -128 and np.any(dense.bias != 0)
    assert len(set(dense.requant.multiplier.tolist())) == 9                 # per column
    samples = np.random.default_rng(26).normal(size=(SAMPLES, 13)).astype(np.float32)
    steps = compare_with_ort(str(path), graph, samples)
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


@pytest.mark.parametrize("name", ["digits_mlp.onnx", "digits_cnn.onnx", "digits_rescnn.onnx",
                                  "digits_exit.onnx", "digits_moe.onnx"])
def test_shipped_workloads(name):
    """The int8 QDQ models shipped in workloads/ import and agree with onnxruntime (the
    MLP flattens its float input before quantising it)."""
    from importlib.resources import files
    path = files("fusetile.workloads") / name
    if not path.is_file():
        pytest.skip(f"{name} is not shipped")
    graph = load_model(str(path))
    assert graph.tensors[graph.input].size == 64
    samples = np.random.default_rng(14).uniform(0, 1, size=(SAMPLES, 1, 8, 8))
    steps = compare_with_ort(str(path), graph, samples.astype(np.float32))
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


def _session_with_outputs(path, names):
    model = onnx.load(path)
    for n in names:
        model.graph.output.append(onnx.ValueInfoProto(name=n))
    return session(model)


# -- QOperator ----------------------------------------------------------------------------

def _qop_model(dtype, rng, per_channel):
    """uint8/int8 input -> QLinearConv (3 -> 5, 3x3, stride 2, pads) -> MaxPool (integer)
    -> QLinearConv 1x1 (5 -> 4) -> Flatten -> QLinearMatMul (constant B) -> output."""
    tp = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    off = 128 if dtype == np.uint8 else 0
    w1 = rng.integers(-127, 128, size=(5, 3, 3, 3))
    w2 = rng.integers(-127, 128, size=(4, 5, 1, 1))
    b = rng.integers(-127, 128, size=(24, 7))
    s_w1 = rng.uniform(0.002, 0.004, size=5) if per_channel else 0.003

    def zp(v, name):
        return _init(name, v + off, dtype)
    nodes = [
        helper.make_node("QLinearConv", ["x", "sx", "zx", "w1", "sw1", "zw1", "s1", "z1", "b1"],
                         ["c1"], name="qconv1", strides=[2, 2], pads=[1, 0, 1, 2]),
        helper.make_node("MaxPool", ["c1"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[1, 1]),
        helper.make_node("QLinearConv", ["p", "s1", "z1", "w2", "sw2", "zw2", "s2", "z2"],
                         ["c2"], name="qconv2"),
        helper.make_node("Flatten", ["c2"], ["f"], name="flatten"),
        helper.make_node("QLinearMatMul", ["f", "s2", "z2", "b", "sb", "zb", "sy", "zy"],
                         ["y"], name="qmatmul"),
    ]
    inits = [_init("sx", 0.02), zp(-5, "zx"), _init("w1", w1, np.int8), _init("sw1", s_w1),
             _init("zw1", 0, np.int8), _init("s1", 0.05), zp(-20, "z1"),
             _init("b1", rng.integers(-2000, 2000, size=5), np.int32),
             _init("w2", w2, np.int8), _init("sw2", 0.004), _init("zw2", 0, np.int8),
             _init("s2", 0.06), zp(3, "z2"),
             _init("b", b + off, dtype), _init("sb", 0.003), zp(0, "zb"),
             _init("sy", 0.1), zp(7, "zy")]
    # 7 x 5 -> conv 3x3, stride 2, pads (1, 0, 1, 2): 4 x 3 -> pool 2x2/1: 3 x 2 -> 4 x 3 x 2
    return _model("qop", nodes, inits, [1, 3, 7, 5], [1, 7], in_type=tp, out_type=tp)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_qoperator_models(dtype, per_channel):
    rng = np.random.default_rng(11)
    model = _qop_model(dtype, rng, per_channel)
    graph = load_model(model)
    assert [type(op).__name__ for op in graph.ops] == ["Conv", "MaxPool", "Conv", "Flatten",
                                                       "Dense"]
    assert graph.ops[0].name == "qconv1" and graph.ops[0].pads == (1, 0, 1, 2)
    off = 128 if dtype == np.uint8 else 0
    sess = session(model)
    info = np.iinfo(dtype)
    same = total = 0
    for _ in range(SAMPLES):
        x = rng.integers(info.min, info.max + 1, size=(1, 3, 7, 5)).astype(dtype)
        theirs = sess.run(None, {"x": x})[0].reshape(-1).astype(np.int64) - off
        ours = run_reference(graph, (x[0].astype(np.int64) - off).astype(np.int8))[graph.output]
        d = ours.reshape(-1).astype(np.int64) - theirs
        assert np.abs(d).max() <= 1
        same, total = same + np.sum(d == 0), total + d.size
    assert same / total >= 0.999


def test_qoperator_int32_output_refused():
    """MatMulInteger as the whole graph: int32 output, which the IR has no tensor for."""
    nodes = [helper.make_node("MatMulInteger", ["x", "b", "zx"], ["y"], name="mmi")]
    inits = [_init("b", np.ones((4, 3)), np.int8), _init("zx", 2, np.int8)]
    model = _model("mmi", nodes, inits, [1, 4], [1, 3], in_type=TensorProto.INT8,
                   out_type=TensorProto.INT32, opset=13)
    with pytest.raises(GraphError, match=r"node 'mmi' \(MatMulInteger\): int32 output"):
        load_model(model)


def test_matmulinteger_requantised():
    """MatMulInteger -> Cast -> Mul(scale) -> Add(bias) -> QuantizeLinear is one Dense."""
    rng = np.random.default_rng(5)
    b = rng.integers(-127, 128, size=(6, 4))
    nodes = [
        helper.make_node("MatMulInteger", ["x", "b", "zx"], ["acc"], name="mmi"),
        helper.make_node("Cast", ["acc"], ["accf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "scale"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "bias"], ["a"], name="add"),
        helper.make_node("QuantizeLinear", ["a", "sy", "zy"], ["y"], name="q"),
    ]
    inits = [_init("b", b, np.int8), _init("zx", 3, np.int8), _init("scale", 0.01),
             _init("bias", rng.normal(size=4)), _init("sy", 0.2), _init("zy", -4, np.int8)]
    model = _model("mmi_q", nodes, inits, [1, 6], [1, 4], in_type=TensorProto.INT8,
                   out_type=TensorProto.INT8)
    graph = load_model(model)
    assert [type(op).__name__ for op in graph.ops] == ["Dense"]
    sess = session(model)
    for _ in range(SAMPLES):
        x = rng.integers(-128, 128, size=(1, 6)).astype(np.int8)
        ours = run_reference(graph, x[0])[graph.output]
        assert np.abs(ours.astype(int) - sess.run(None, {"x": x})[0][0]).max() <= 1


# -- what the importer refuses ------------------------------------------------------------

def _small_conv(**conv_attrs):
    rng = np.random.default_rng(2)
    group = conv_attrs.get("group", 1)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="the_conv", **conv_attrs),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    inits = [_init("w", _weights(rng, 4, 4 // group, 3, 3)), _init("b", np.zeros(4))]
    return _model("small", nodes, inits, [1, 4, 9, 9], [1, 4, None, None])


@pytest.mark.parametrize("attrs,reason", [
    ({"group": 2}, "group 2"),
    ({"dilations": [2, 2]}, "dilations"),
    ({"auto_pad": "SAME_UPPER"}, "auto_pad SAME_UPPER"),
])
def test_refuses_conv_attributes(tmp_path, attrs, reason):
    path = quantise(_small_conv(**attrs), tmp_path / "m.onnx")
    with pytest.raises(GraphError, match=rf"node 'the_conv' \(Conv\): {reason}"):
        load_model(path)


def test_refuses_softmax(tmp_path):
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1),
             helper.make_node("Softmax", ["h"], ["s"], name="softmax"),
             helper.make_node("Gemm", ["s", "w2", "b2"], ["y"], name="fc2", transB=1)]
    inits = [_init("w", _weights(rng, 6, 5)), _init("b", np.zeros(6)),
             _init("w2", _weights(rng, 3, 6)), _init("b2", np.zeros(3))]
    path = quantise(_model("soft", nodes, inits, [1, 5], [1, 3]), tmp_path / "m.onnx")
    with pytest.raises(GraphError, match=r"node 'softmax' \(Softmax\): unsupported operator"):
        load_model(path)


def test_refuses_float_op_in_the_middle(tmp_path):
    """A Sigmoid left in float (excluded from quantisation) between quantised Gemms."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1),
             helper.make_node("Sigmoid", ["h"], ["s"], name="sigmoid"),
             helper.make_node("Gemm", ["s", "w2", "b2"], ["y"], name="fc2", transB=1)]
    inits = [_init("w", _weights(rng, 6, 5)), _init("b", np.zeros(6)),
             _init("w2", _weights(rng, 3, 6)), _init("b2", np.zeros(3))]
    path = quantise(_model("sig", nodes, inits, [1, 5], [1, 3]), tmp_path / "m.onnx",
                    nodes_to_exclude=["sigmoid"])
    with pytest.raises(GraphError, match=r"node 'sigmoid' \(Sigmoid\): unsupported operator"):
        load_model(path)


def test_weight_zero_point_beyond_int8():
    """A weight zero point that moves w - zp outside int8: int16 weights in the IR (the
    compiler runs them as two int8 planes), equal to onnxruntime and, compiled, to the
    reference."""
    from fusetile.host import open_transport
    from fusetile.host.device import Device
    from fusetile.host.runner import infer, load_program
    from fusetile.kernels.compiler import compile_graph
    from fusetile.kernels.config import TileConfig

    rng = np.random.default_rng(9)
    model = _qop_model(np.int8, rng, False)
    for init in model.graph.initializer:
        if init.name == "zw1":
            init.CopyFrom(_init("zw1", 100, np.int8))
    graph = load_model(model)
    w = graph.ops[0].weight
    assert w.dtype == np.int16 and w.min() < -128
    sess = session(model)
    xs = rng.integers(-128, 128, size=(16, 3, 7, 5)).astype(np.int8)
    ours = np.stack([run_reference(graph, x)[graph.output] for x in xs])
    theirs = np.concatenate([sess.run(None, {"x": x[None]})[0] for x in xs])
    assert np.abs(ours.reshape(theirs.shape).astype(np.int64) - theirs).max() <= 1
    with open_transport("model") as transport:
        dev = Device(transport)
        program = compile_graph(graph, TileConfig(), policy="static")
        load_program(dev, program)
        y, _ = infer(dev, program, xs)
    assert np.array_equal(y, ours)


@pytest.mark.parametrize("change,match", [
    (lambda m: m.graph.input[0].type.tensor_type.shape.dim[0].__setattr__("dim_param", "N"),
     "symbolic"),
    (lambda m: m.graph.input.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT,
                                                                  [1, 5])),
     "2 graph inputs"),
])
def test_refuses_graph_shapes(tmp_path, change, match):
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)]
    model = _model("g", nodes, [_init("w", _weights(rng, 6, 5)), _init("b", np.zeros(6))],
                   [1, 5], [1, 6])
    path = quantise(model, tmp_path / "m.onnx")
    q = onnx.load(path)
    change(q)
    with pytest.raises(GraphError, match=match):
        load_model(q)


def test_refuses_ceil_mode(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("MaxPool", ["c"], ["y"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2], ceil_mode=1)]
    model = _model("p", nodes, [_init("w", np.ones((2, 2, 1, 1)))], [1, 2, 5, 5], [1, 2, 3, 3])
    path = quantise(model, tmp_path / "m.onnx")
    with pytest.raises(GraphError, match=r"node 'pool' \(MaxPool\): ceil_mode=1"):
        load_model(path)


# -- the generated models on the tile's golden model --------------------------------------

@pytest.mark.parametrize("policy", ["none", "static"])
def test_generated_models_on_the_model_target(qdq_results, policy):
    """Every onnxruntime-quantised model above, compiled and run on the ``model`` target,
    gives exactly the reference's outputs (which are within a step of onnxruntime's)."""
    from fusetile.host import open_transport
    from fusetile.host.device import Device
    from fusetile.host.runner import infer, load_program
    from fusetile.kernels.compiler import compile_graph
    from fusetile.kernels.config import TileConfig

    config = TileConfig()
    with open_transport("model", config=config) as transport:
        dev = Device(transport)
        for key, (graph, _, _) in qdq_results.items():
            rng = np.random.default_rng(7)
            shape = tuple(graph.tensors[graph.input].shape)
            xs = rng.integers(-128, 128, (9,) + shape).astype(np.int8)
            program = compile_graph(graph, config, policy=policy)
            load_program(dev, program)
            y, _ = infer(dev, program, xs)
            expected = np.stack([run_reference(graph, x)[graph.output] for x in xs])
            assert np.array_equal(y, expected), key


# -- data-dependent choices ---------------------------------------------------------------

def _exit_model(rng, threshold=0.5, compare="GreaterOrEqual"):
    """fc -> (head | fc2) -> Where(ReduceMax(head) >= T, head, fc2): an early exit."""
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc", transB=1),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "we", "be"], ["e"], name="head", transB=1),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["f"], name="fc2", transB=1),
             helper.make_node("ReduceMax", ["e"], ["m"], name="max", axes=[1], keepdims=1),
             helper.make_node(compare, ["m", "t"], ["c"], name="test"),
             helper.make_node("Where", ["c", "e", "f"], ["y"], name="where")]
    inits = [_init("w", _weights(rng, 12, 6)), _init("b", np.zeros(12)),
             _init("we", _weights(rng, 5, 12)), _init("be", np.zeros(5)),
             _init("w2", _weights(rng, 5, 12)), _init("b2", np.zeros(5)),
             _init("t", np.float32(threshold))]
    return _model("exit", nodes, inits, [1, 6], [1, 5])


def _route_model(rng, last_index=0):
    """gate | three experts -> Gather(Concat(experts), ArgMax(gate)): top-1 routing."""
    nodes = [helper.make_node("Gemm", ["x", "wg", "bg"], ["g"], name="gate", transB=1),
             helper.make_node("ArgMax", ["g"], ["k"], name="route", axis=1, keepdims=0,
                              select_last_index=last_index)]
    for i in range(3):
        nodes.append(helper.make_node("Gemm", ["x", f"w{i}", f"b{i}"], [f"o{i}"],
                                      name=f"expert{i}", transB=1))
    nodes += [helper.make_node("Concat", ["o0", "o1", "o2"], ["s"], name="stack", axis=0),
              helper.make_node("Gather", ["s", "k"], ["y"], name="select", axis=0)]
    inits = [_init("wg", _weights(rng, 3, 6)), _init("bg", np.zeros(3))]
    inits += [t for i in range(3) for t in (_init(f"w{i}", _weights(rng, 4, 6)),
                                            _init(f"b{i}", np.zeros(4)))]
    return _model("route", nodes, inits, [1, 6], [1, 4])


@pytest.mark.parametrize("make", [_exit_model, _route_model])
def test_data_dependent_choices_agree_with_onnxruntime(tmp_path, make):
    """An early exit (Where of ReduceMax >= T) and a top-1 route (Gather of stacked
    results by ArgMax) become one Select; the reference agrees with onnxruntime."""
    from fusetile.kernels.graph import Select
    path = quantise(make(np.random.default_rng(5)), tmp_path / "m.onnx")
    graph = load_model(path)
    (sel,) = [op for op in graph.ops if isinstance(op, Select)]
    assert sel.mode == ("threshold" if make is _exit_model else "argmax")
    samples = np.random.default_rng(6).normal(size=(SAMPLES, 6)).astype(np.float32)
    steps = compare_with_ort(str(path), graph, samples)
    assert np.abs(steps).max() <= 1 and np.mean(steps == 0) >= 0.999


def test_exit_threshold_is_the_first_int8_that_passes(tmp_path):
    """GreaterOrEqual and Greater on the dequantised largest element: the int8
    threshold is exact for values on the grid."""
    from fusetile.kernels.graph import Select
    rng = np.random.default_rng(5)
    path = quantise(_exit_model(rng), tmp_path / "m.onnx")
    graph = load_model(path)
    (sel,) = [op for op in graph.ops if isinstance(op, Select)]
    e = graph.tensors[sel.key]
    on_grid = np.float32((sel.threshold - e.zero_point) * np.float32(e.scale))
    for compare, expected in (("GreaterOrEqual", sel.threshold), ("Greater", sel.threshold + 1)):
        model = onnx.load(path)
        for init in model.graph.initializer:
            if init.name == "t":
                init.CopyFrom(_init("t", on_grid))
        for node in model.graph.node:
            if node.name == "test":
                node.op_type = compare
        (sel2,) = [op for op in load_model(model).ops if isinstance(op, Select)]
        assert sel2.threshold == expected


@pytest.mark.parametrize("make,match", [
    (lambda rng: _route_model(rng, last_index=1), r"'route' \(ArgMax\): select_last_index=1"),
    (lambda rng: _exit_model(rng, compare="Less"), r"'test' \(Less\): unsupported operator"),
])
def test_refuses_choices_the_tile_cannot_make(tmp_path, make, match):
    path = quantise(make(np.random.default_rng(5)), tmp_path / "m.onnx")
    with pytest.raises(GraphError, match=match):
        load_model(path)
