"""The shipped digits workloads (workloads/): fast checks, no retraining.

* the int8 QDQ files ship as package data, load, have the tile's I/O shapes and only
  operators the tile's importer knows;
* their onnxruntime accuracy on the test split is at least 90 %;
* :func:`load_split` is deterministic;
* the NumPy CNN trainer's backward pass matches finite differences, and its forward
  pass matches the ONNX graph it is exported as (onnxruntime).
"""

from importlib.resources import files

import numpy as np
import onnx
import pytest

from fusetile.workloads import digits


INT8_MODELS = ["digits_mlp.onnx", "digits_cnn.onnx"]
FLOAT_MODELS = ["digits_mlp_float.onnx", "digits_cnn_float.onnx"]
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


def test_load_split_deterministic(split):
    again = digits.load_split()
    for a, b in zip(split, again):
        np.testing.assert_array_equal(a, b)
    x_train, y_train, x_test, y_test = split
    assert x_train.shape == (1347, 1, 8, 8) and x_test.shape == (450, 1, 8, 8)
    assert x_train.dtype == np.float32 and 0 <= x_train.min() and x_train.max() <= 1
    assert len(y_train) == 1347 and len(y_test) == 450
    assert set(np.unique(y_test)) == set(range(10))


def _xent(params, x, y):
    logits, _ = digits._cnn_forward(params, x)
    logits = logits - logits.max(axis=1, keepdims=True)
    return np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y])


def test_cnn_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    # float64 so that central differences are accurate; random biases so that no
    # pre-activation sits at the ReLU kink.
    params = {k: v.astype(np.float64) for k, v in digits._cnn_init(rng).items()}
    for k in params:
        if k.endswith("bias"):
            params[k] = 0.1 * rng.standard_normal(params[k].shape)
    x, y = rng.random((3, 1, 8, 8)), np.array([1, 4, 7])
    logits, cache = digits._cnn_forward(params, x)
    grads = digits._cnn_backward(params, digits._softmax_xent_grad(logits, y), cache)
    eps = 1e-6
    for k, p in params.items():
        flat = p.reshape(-1)
        for i in rng.choice(flat.size, size=min(8, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + eps
            up = _xent(params, x, y)
            flat[i] = old - eps
            down = _xent(params, x, y)
            flat[i] = old
            assert abs((up - down) / (2 * eps) - grads[k].reshape(-1)[i]) < 1e-6, (k, i)


def test_cnn_forward_matches_onnx_graph():
    # The trainer's layouts (im2col order, flatten order, Gemm transB) are the ONNX ones.
    model = onnx.load(_path("digits_cnn_float.onnx"))
    params = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    x = digits.load_split()[2][:5]
    want, _ = digits._cnn_forward(params, x)
    sess = digits._session(model)
    got = np.concatenate([sess.run(None, {digits.INPUT: img[None]})[0] for img in x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
