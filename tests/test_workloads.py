"""The shipped digits workloads (workloads/): fast checks, one retraining.

* the int8 QDQ files ship as package data, load, have the tile's I/O shapes and only
  operators the tile's importer knows;
* their onnxruntime accuracy on the test split is at least 90 % (95 % for the
  residual CNN);
* :func:`load_split` is deterministic;
* the NumPy CNN and residual-CNN trainers' backward passes match finite differences,
  and their forward passes match the ONNX graphs they are exported as (onnxruntime);
* the shipped residual CNN is what the builder produces, byte for byte (the one
  retraining, a few seconds), and the tile (model target) runs it as onnxruntime does.
"""

from importlib.resources import files

import numpy as np
import onnx
import pytest

from fusetile.workloads import digits


INT8_MODELS = ["digits_mlp.onnx", "digits_cnn.onnx", "digits_rescnn.onnx"]
FLOAT_MODELS = ["digits_mlp_float.onnx", "digits_cnn_float.onnx",
                "digits_rescnn_float.onnx"]
# (init, forward, backward) of the NumPy trainers.
TRAINERS = {
    "cnn": (digits._cnn_init, digits._cnn_forward, digits._cnn_backward),
    "rescnn": (digits._rescnn_init, digits._rescnn_forward, digits._rescnn_backward),
}
TILE_OPS = {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm", "MatMul", "Add", "Relu",
            "MaxPool", "Flatten", "Reshape"}


def _path(name):
    return files("fusetile.workloads") / name


def _dims(value_info):
    return [d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def split():
    return digits.load_split()


@pytest.mark.parametrize("name", INT8_MODELS + FLOAT_MODELS)
def test_shipped_model_io(name):
    model = onnx.load(_path(name))
    onnx.checker.check_model(model)
    (inp,), (out,) = model.graph.input, model.graph.output
    assert (inp.name, _dims(inp)) == (digits.INPUT, [1, 1, 8, 8])
    assert (out.name, _dims(out)) == (digits.OUTPUT, [1, 10])


@pytest.mark.parametrize("name", INT8_MODELS)
def test_int8_model_ops(name):
    ops = {node.op_type for node in onnx.load(_path(name)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert ops <= TILE_OPS, ops - TILE_OPS


@pytest.mark.parametrize("name", INT8_MODELS)
def test_int8_weights_are_int8(name):
    # Per-tensor int8 weights (the tile's MAC operands) and int32 biases.
    model = onnx.load(_path(name))
    for init in model.graph.initializer:
        if init.name.endswith(".weight_quantized"):
            assert init.data_type == onnx.TensorProto.INT8, init.name
        if init.name.endswith(".bias_quantized"):
            assert init.data_type == onnx.TensorProto.INT32, init.name
        if init.name.endswith("_scale"):
            assert onnx.numpy_helper.to_array(init).size == 1, init.name


@pytest.mark.parametrize("name", INT8_MODELS + FLOAT_MODELS)
def test_shipped_accuracy(name, split):
    _, _, x_test, y_test = split
    assert digits.accuracy(str(_path(name)), x_test, y_test) >= 0.9


@pytest.mark.parametrize("name", ["digits_rescnn.onnx", "digits_rescnn_float.onnx"])
def test_rescnn_accuracy(name, split):
    # Comparable to the CNN (97.8 % float): 98.4 % float and int8 when built.
    _, _, x_test, y_test = split
    assert digits.accuracy(str(_path(name)), x_test, y_test) >= 0.95


def test_rescnn_has_a_skip_connection():
    # The Add sums the residual branch and the first Relu's output (both int8 in QDQ).
    model = onnx.load(_path("digits_rescnn.onnx"))
    producer = {o: n for n in model.graph.node for o in n.output}
    (add,) = [n for n in model.graph.node if n.op_type == "Add"]
    sources = [producer[producer[i].input[0]] for i in add.input]   # DQ <- Q <- op
    assert [producer[s.input[0]].name for s in sources] == ["res2", "conv1"]


def test_load_split_deterministic(split):
    again = digits.load_split()
    for a, b in zip(split, again):
        np.testing.assert_array_equal(a, b)
    x_train, y_train, x_test, y_test = split
    assert x_train.shape == (1347, 1, 8, 8) and x_test.shape == (450, 1, 8, 8)
    assert x_train.dtype == np.float32 and 0 <= x_train.min() and x_train.max() <= 1
    assert len(y_train) == 1347 and len(y_test) == 450
    assert set(np.unique(y_test)) == set(range(10))


def _xent(forward, params, x, y):
    logits, _ = forward(params, x)
    logits = logits - logits.max(axis=1, keepdims=True)
    return np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])


@pytest.mark.parametrize("net", list(TRAINERS))
def test_cnn_gradients_match_finite_differences(net):
    init, forward, backward = TRAINERS[net]
    rng = np.random.default_rng(1)
    # float64 so that central differences are accurate; random biases so that no
    # pre-activation sits at the ReLU kink.
    params = {k: v.astype(np.float64) for k, v in init(rng).items()}
    for k in params:
        if k.endswith("bias"):
            params[k] = 0.1 * rng.standard_normal(params[k].shape)
    x, y = rng.random((3, 1, 8, 8)), np.array([1, 4, 7])
    logits, cache = forward(params, x)
    grads = backward(params, digits._softmax_xent_grad(logits, y), cache)
    eps = 1e-6
    for k, p in params.items():
        flat = p.reshape(-1)
        for i in rng.choice(flat.size, size=min(8, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + eps
            up = _xent(forward, params, x, y)
            flat[i] = old - eps
            down = _xent(forward, params, x, y)
            flat[i] = old
            assert abs((up - down) / (2 * eps) - grads[k].reshape(-1)[i]) < 1e-6, (k, i)


@pytest.mark.parametrize("net", list(TRAINERS))
def test_cnn_forward_matches_onnx_graph(net):
    # The trainer's layouts (im2col order, flatten order, Gemm transB) are the ONNX ones.
    model = onnx.load(_path(f"digits_{net}_float.onnx"))
    params = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    x = digits.load_split()[2][:5]
    want, _ = TRAINERS[net][1](params, x)
    sess = digits._session(model)
    got = np.concatenate([sess.run(None, {digits.INPUT: img[None]})[0] for img in x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_shipped_rescnn_is_what_build_writes(split):
    # What build() saves for the residual CNN (onnx.save writes SerializeToString()).
    x_train, y_train, _, _ = split
    fmodel = digits.train_rescnn(x_train, y_train)
    qmodel = digits.quantize(fmodel, x_train[:digits.N_CALIB])
    assert fmodel.SerializeToString() == _path("digits_rescnn_float.onnx").read_bytes()
    assert qmodel.SerializeToString() == _path("digits_rescnn.onnx").read_bytes()


def test_rescnn_runs_on_the_tile_as_onnxruntime(tmp_path, capsys, split):
    """The importer keeps the skip Add; the tile (model target, 64 test images) is
    within one quantisation step of onnxruntime, >= 99.9 % identical."""
    import json

    from fusetile.host.cli import main
    from fusetile.host.onnx_import import load_model
    from fusetile.kernels.graph import Add

    path = str(_path("digits_rescnn.onnx"))
    assert sum(isinstance(op, Add) for op in load_model(path).ops) == 1
    xs = split[2][:64]
    np.save(tmp_path / "x.npy", xs)
    capsys.readouterr()
    status = main(["run", path, "--input", str(tmp_path / "x.npy"),
                   "--output", str(tmp_path / "y.npy"), "--target", "model", "--json"])
    assert status in (0, None)
    assert json.loads(capsys.readouterr().out)["samples"] == len(xs)
    sess = digits._session(_path("digits_rescnn.onnx"))
    want = np.concatenate([sess.run(None, {digits.INPUT: img[None]})[0] for img in xs])
    got = np.load(tmp_path / "y.npy").reshape(want.shape)
    model = onnx.load(path)
    step = {i.name: onnx.numpy_helper.to_array(i)
            for i in model.graph.initializer}["logits_scale"]
    steps = np.abs(got - want) / step
    assert steps.max() <= 1 + 1e-4 and (steps < 0.5).mean() >= 0.999
