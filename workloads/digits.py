"""Digits workloads: int8 networks for scikit-learn's 8 x 8 digits.

All five networks take one image, ``input`` float32 ``[1, 1, 8, 8]`` with pixels in
[0, 1], and return ``logits`` float32 ``[1, 10]`` (no Softmax/ArgMax: the class is the
index of the largest logit). The graphs are written by hand with :mod:`onnx.helper`
(opset 17) so that they hold exactly the operators below:

* MLP: ``Flatten -> Gemm(64 -> 32) -> Relu -> Gemm(32 -> 10)``, trained with
  :class:`sklearn.neural_network.MLPClassifier`.
* CNN: ``Conv 3x3 (1 -> 8) -> Relu -> MaxPool 2x2 -> Conv 3x3 (8 -> 16) -> Relu ->
  MaxPool 2x2 -> Flatten -> Gemm(64 -> 10)``, trained by the small NumPy trainer in
  this module (im2col convolutions, Adam, softmax cross-entropy).
* Residual CNN: ``Conv 3x3 (1 -> 8) -> Relu -> [Conv 3x3 (8 -> 8) -> Relu -> Conv 3x3
  (8 -> 8) -> Relu] + skip (Add) -> MaxPool 2x2 -> Conv 3x3 (8 -> 16) -> Relu -> MaxPool
  2x2 -> Flatten -> Gemm(64 -> 10)``, trained by the same NumPy trainer.
* Early exit (data-dependent): ``Flatten -> Gemm(64 -> 32) -> Relu``, then an exit head
  ``Gemm(32 -> 10)`` and a final head ``Gemm(32 -> 64) -> Relu -> Gemm(64 -> 10)``;
  ``ReduceMax -> GreaterOrEqual`` compares the exit head's largest logit with a
  threshold and ``Where`` returns the exit head's logits if it is reached, else the
  final head's. Trained by the NumPy trainer on both heads' losses.
* Mixture of experts (data-dependent): ``Flatten -> Gemm(64 -> 32) -> Relu``, a gate
  ``Gemm(32 -> 4) -> ArgMax`` and four experts ``Gemm(32 -> 32) -> Relu -> Gemm(32 ->
  10)``, whose logits ``Concat`` stacks and ``Gather`` picks from (top-1 routing).
  The gate learns k-means clusters of the images; trained by the NumPy trainer.

:func:`quantize` turns a float model into an int8 QDQ model with onnxruntime's
``quantize_static`` (per-tensor int8 weights and activations, MinMax calibration).
:func:`build` does everything and writes the ten ``.onnx`` files.

Everything is seeded: the split, scikit-learn's trainer, the NumPy trainer, the k-means
clustering and the calibration set are fixed, so two builds give byte-identical ONNX
files.
"""

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


__all__ = ["load_split", "train_mlp", "train_cnn", "train_rescnn", "train_exit",
           "exit_threshold", "train_moe", "expert_clusters", "quantize", "predict",
           "accuracy", "early_exits", "routes", "build", "OPSET", "INPUT", "OUTPUT",
           "EXIT_RATE", "N_EXPERTS"]

OPSET = 17
INPUT = "input"
OUTPUT = "logits"
SEED = 0
N_CALIB = 200


# --- data -------------------------------------------------------------------------

def load_split():
    """The digits data set, split 75 % train / 25 % test.

    The split is ``train_test_split(test_size=0.25, random_state=0, stratify=y)`` over
    :func:`sklearn.datasets.load_digits` (1797 images: 1347 train, 450 test).

    Returns
    -------
    x_train, y_train, x_test, y_test : numpy.ndarray
        Images as float32 ``(N, 1, 8, 8)`` scaled to [0, 1] (pixel / 16); labels as
        int64 ``(N,)``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=SEED, stratify=y)
    return x_train, y_train, x_test, y_test


# --- ONNX construction ------------------------------------------------------------

def _make_model(name, nodes, params):
    """A single-image ONNX model ``input [1,1,8,8] -> logits [1,10]``.

    Parameters
    ----------
    name : str
        Graph name.
    nodes : list of onnx.NodeProto
        The graph's nodes, in topological order.
    params : dict of str -> numpy.ndarray
        Initialisers (stored as float32, in their own shape: a 0-d value, such as the
        early-exit threshold, stays a scalar).
    """
    # ascontiguousarray makes 0-d values 1-d; the reshape puts the scalar shape back.
    inits = [numpy_helper.from_array(
                 np.ascontiguousarray(v, dtype=np.float32).reshape(np.shape(v)), k)
             for k, v in params.items()]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [1, 10])],
        initializer=inits)
    # IR version 8 is the one that goes with opset 17: any onnxruntime >= 1.13 loads it.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=8, producer_name="fusetile.workloads")
    onnx.checker.check_model(model, full_check=True)
    return model


def _gemm(name, x, out, weight, bias):
    """A ``Gemm`` node ``out = x @ weight.T + bias`` (weight is ``(out, in)``)."""
    return helper.make_node("Gemm", [x, weight, bias], [out], name=name, transB=1)


def _conv(name, x, out, weight, bias):
    """A 3x3, pad 1, stride 1 ``Conv`` node (weight ``(OC, C, 3, 3)``)."""
    return helper.make_node("Conv", [x, weight, bias], [out], name=name,
                            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])


def _maxpool(name, x, out):
    """A 2x2, stride 2 ``MaxPool`` node."""
    return helper.make_node("MaxPool", [x], [out], name=name, kernel_shape=[2, 2],
                            strides=[2, 2])


# --- MLP --------------------------------------------------------------------------

def train_mlp(x_train=None, y_train=None):
    """Train the MLP with scikit-learn and write it as a float ONNX model.

    ``MLPClassifier(hidden_layer_sizes=(32,), activation="relu", random_state=0)``
    with Adam, on the flattened images.

    Parameters
    ----------
    x_train, y_train : numpy.ndarray, optional
        Training data; by default the train half of :func:`load_split`.

    Returns
    -------
    onnx.ModelProto
        ``Flatten -> Gemm -> Relu -> Gemm``, output ``logits``.
    """
    import warnings
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    if x_train is None:
        x_train, y_train = load_split()[:2]
    clf = MLPClassifier(hidden_layer_sizes=(32,), activation="relu", solver="adam",
                        max_iter=500, random_state=SEED)
    with warnings.catch_warnings():
        # The loss plateaus long before 500 epochs; "not converged" is not a failure.
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_train.reshape(len(x_train), -1), y_train)
    # scikit-learn stores weights as (in, out); Gemm(transB=1) wants (out, in).
    (w1, w2), (b1, b2) = clf.coefs_, clf.intercepts_
    nodes = [
        helper.make_node("Flatten", [INPUT], ["flat"], name="flatten", axis=1),
        _gemm("fc1", "flat", "fc1_out", "fc1.weight", "fc1.bias"),
        helper.make_node("Relu", ["fc1_out"], ["relu1"], name="relu1"),
        _gemm("fc2", "relu1", OUTPUT, "fc2.weight", "fc2.bias"),
    ]
    params = {"fc1.weight": w1.T, "fc1.bias": b1, "fc2.weight": w2.T, "fc2.bias": b2}
    return _make_model("digits_mlp", nodes, params)


# --- CNN: a small NumPy trainer ---------------------------------------------------

def _im2col(x):
    """3x3 patches of ``x`` (N, C, H, W), zero padding 1 -> ``(N*H*W, C*9)``.

    Columns are in ``(c, ky, kx)`` order, so a weight ``(OC, C, 3, 3)`` reshaped to
    ``(OC, C*9)`` is the ONNX Conv weight as is.
    """
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * w, c * 9)


def _col2im(dcols, shape):
    """Adjoint of :func:`_im2col`: scatter-add patch gradients back to ``shape``."""
    n, c, h, w = shape
    d = dcols.reshape(n, h, w, c, 3, 3)
    dxp = np.zeros((n, c, h + 2, w + 2), dtype=dcols.dtype)
    for ky in range(3):
        for kx in range(3):
            dxp[:, :, ky:ky + h, kx:kx + w] += d[..., ky, kx].transpose(0, 3, 1, 2)
    return dxp[:, :, 1:-1, 1:-1]


def _conv_forward(x, w, b):
    """3x3, pad 1, stride 1 convolution; returns the output and the im2col cache."""
    n, _, h, wd = x.shape
    cols = _im2col(x)
    out = cols @ w.reshape(len(w), -1).T + b
    return out.reshape(n, h, wd, -1).transpose(0, 3, 1, 2), cols


def _conv_backward(dout, x_shape, cols, w):
    """Gradients of :func:`_conv_forward` w.r.t. input, weight and bias."""
    dflat = dout.transpose(0, 2, 3, 1).reshape(-1, len(w))
    dw = (dflat.T @ cols).reshape(w.shape)
    dx = _col2im(dflat @ w.reshape(len(w), -1), x_shape)
    return dx, dw, dflat.sum(axis=0)


def _pool_forward(x):
    """2x2, stride 2 max pooling; returns the output and the argmax one-hot mask."""
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5)
    win = win.reshape(n, c, h // 2, w // 2, 4)
    # One winner per window (the first, like a hardware compare chain), so tied
    # inputs do not each get the full gradient.
    mask = np.eye(4, dtype=x.dtype)[win.argmax(axis=-1)]
    return win.max(axis=-1), mask


def _pool_backward(dout, mask):
    """Route pooled gradients to each window's winner."""
    n, c, h2, w2, _ = mask.shape
    d = (mask * dout[..., None]).reshape(n, c, h2, w2, 2, 2)
    return d.transpose(0, 1, 2, 4, 3, 5).reshape(n, c, 2 * h2, 2 * w2)


def _cnn_init(rng):
    """He-normal weights, zero biases, in ONNX layouts."""
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return {
        "conv1.weight": he((8, 1, 3, 3), 9), "conv1.bias": np.zeros(8, np.float32),
        "conv2.weight": he((16, 8, 3, 3), 72), "conv2.bias": np.zeros(16, np.float32),
        "fc.weight": he((10, 64), 64), "fc.bias": np.zeros(10, np.float32),
    }


def _cnn_forward(p, x):
    """Logits of the CNN on a batch, and what the backward pass needs."""
    z1, cols1 = _conv_forward(x, p["conv1.weight"], p["conv1.bias"])
    a1, m1 = _pool_forward(np.maximum(z1, 0))
    z2, cols2 = _conv_forward(a1, p["conv2.weight"], p["conv2.bias"])
    a2, m2 = _pool_forward(np.maximum(z2, 0))
    flat = a2.reshape(len(x), -1)
    logits = flat @ p["fc.weight"].T + p["fc.bias"]
    return logits, (x, z1, cols1, m1, a1, z2, cols2, m2, flat)


def _cnn_backward(p, dlogits, cache):
    """Gradients of all parameters, given d(loss)/d(logits)."""
    x, z1, cols1, m1, a1, z2, cols2, m2, flat = cache
    g = {"fc.weight": dlogits.T @ flat, "fc.bias": dlogits.sum(axis=0)}
    da2 = (dlogits @ p["fc.weight"]).reshape(len(x), 16, 2, 2)
    dz2 = _pool_backward(da2, m2) * (z2 > 0)
    da1, g["conv2.weight"], g["conv2.bias"] = _conv_backward(
        dz2, a1.shape, cols2, p["conv2.weight"])
    dz1 = _pool_backward(da1, m1) * (z1 > 0)
    _, g["conv1.weight"], g["conv1.bias"] = _conv_backward(
        dz1, x.shape, cols1, p["conv1.weight"])
    return g


def _softmax_xent_grad(logits, y):
    """d(mean cross-entropy)/d(logits) for integer labels ``y``."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob = e / e.sum(axis=1, keepdims=True)
    prob[np.arange(len(y)), y] -= 1.0
    return prob / len(y)


def _adam(params, grads, state, lr, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam step, in place (``state`` holds the step count and moments)."""
    state["t"] += 1
    t = state["t"]
    for k, g in grads.items():
        m = state.setdefault("m" + k, np.zeros_like(g))
        v = state.setdefault("v" + k, np.zeros_like(g))
        m += (1 - b1) * (g - m)
        v += (1 - b2) * (g * g - v)
        step = lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        params[k] -= step.astype(np.float32)


def _fit(x, y, init, forward, backward, *, epochs=30, batch=32, lr=3e-3, seed=SEED,
         loss_grad=_softmax_xent_grad):
    """Train a network's parameters with Adam on shuffled minibatches.

    ``init(rng)`` makes the parameters, ``forward(params, x)`` returns the logits and a
    cache, ``backward(params, dlogits, cache)`` the gradients. One generator seeded
    with ``seed`` draws the initial weights, then each epoch's order.
    ``loss_grad(logits, y)`` is d(loss)/d(logits): by default the softmax
    cross-entropy against integer labels; the multi-head networks below pass their own
    (``y`` may then have more than one column, e.g. a label and a cluster).
    """
    rng = np.random.default_rng(seed)
    params, state = init(rng), {"t": 0}
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x), batch):
            idx = order[i:i + batch]
            logits, cache = forward(params, x[idx])
            grads = backward(params, loss_grad(logits, y[idx]), cache)
            _adam(params, grads, state, lr)
    return params


def _fit_cnn(x, y, *, epochs=30, batch=32, lr=3e-3, seed=SEED):
    """Train the CNN's parameters with Adam on shuffled minibatches."""
    return _fit(x, y, _cnn_init, _cnn_forward, _cnn_backward,
                epochs=epochs, batch=batch, lr=lr, seed=seed)


def train_cnn(x_train=None, y_train=None):
    """Train the CNN in NumPy and write it as a float ONNX model.

    30 epochs of Adam (lr 3e-3, batch 32, seed 0) on softmax cross-entropy; a few
    seconds on one core.

    Parameters
    ----------
    x_train, y_train : numpy.ndarray, optional
        Training data; by default the train half of :func:`load_split`.

    Returns
    -------
    onnx.ModelProto
        ``Conv -> Relu -> MaxPool -> Conv -> Relu -> MaxPool -> Flatten -> Gemm``.
    """
    if x_train is None:
        x_train, y_train = load_split()[:2]
    params = _fit_cnn(x_train.astype(np.float32), y_train)
    nodes = []
    prev = INPUT
    for i in (1, 2):
        nodes += [
            _conv(f"conv{i}", prev, f"conv{i}_out", f"conv{i}.weight", f"conv{i}.bias"),
            helper.make_node("Relu", [f"conv{i}_out"], [f"relu{i}"], name=f"relu{i}"),
            _maxpool(f"pool{i}", f"relu{i}", f"pool{i}"),
        ]
        prev = f"pool{i}"
    nodes += [
        helper.make_node("Flatten", [prev], ["flat"], name="flatten", axis=1),
        _gemm("fc", "flat", OUTPUT, "fc.weight", "fc.bias"),
    ]
    return _make_model("digits_cnn", nodes, params)


# --- residual CNN -----------------------------------------------------------------

def _rescnn_init(rng):
    """He-normal weights, zero biases, in ONNX layouts (residual CNN)."""
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return {
        "conv1.weight": he((8, 1, 3, 3), 9), "conv1.bias": np.zeros(8, np.float32),
        "res1.weight": he((8, 8, 3, 3), 72), "res1.bias": np.zeros(8, np.float32),
        "res2.weight": he((8, 8, 3, 3), 72), "res2.bias": np.zeros(8, np.float32),
        "conv2.weight": he((16, 8, 3, 3), 72), "conv2.bias": np.zeros(16, np.float32),
        "fc.weight": he((10, 64), 64), "fc.bias": np.zeros(10, np.float32),
    }


def _rescnn_forward(p, x):
    """Logits of the residual CNN on a batch, and what the backward pass needs."""
    z1, cols1 = _conv_forward(x, p["conv1.weight"], p["conv1.bias"])
    a1 = np.maximum(z1, 0)
    z2, cols2 = _conv_forward(a1, p["res1.weight"], p["res1.bias"])
    a2 = np.maximum(z2, 0)
    z3, cols3 = _conv_forward(a2, p["res2.weight"], p["res2.bias"])
    # The skip connection adds two Relu outputs: the sum is >= 0 already, so no Relu
    # follows it (see train_rescnn for why the Relu is not after the Add).
    p1, m1 = _pool_forward(np.maximum(z3, 0) + a1)
    z4, cols4 = _conv_forward(p1, p["conv2.weight"], p["conv2.bias"])
    p2, m2 = _pool_forward(np.maximum(z4, 0))
    flat = p2.reshape(len(x), -1)
    logits = flat @ p["fc.weight"].T + p["fc.bias"]
    return logits, (x, z1, cols1, a1, z2, cols2, a2, z3, cols3, m1, p1, z4, cols4, m2,
                    flat)


def _rescnn_backward(p, dlogits, cache):
    """Gradients of all parameters of the residual CNN, given d(loss)/d(logits)."""
    x, z1, cols1, a1, z2, cols2, a2, z3, cols3, m1, p1, z4, cols4, m2, flat = cache
    g = {"fc.weight": dlogits.T @ flat, "fc.bias": dlogits.sum(axis=0)}
    dp2 = (dlogits @ p["fc.weight"]).reshape(len(x), 16, 2, 2)
    dz4 = _pool_backward(dp2, m2) * (z4 > 0)
    dp1, g["conv2.weight"], g["conv2.bias"] = _conv_backward(
        dz4, p1.shape, cols4, p["conv2.weight"])
    # The Add passes its gradient to both inputs: the residual branch and the skip.
    ds = _pool_backward(dp1, m1)
    da2, g["res2.weight"], g["res2.bias"] = _conv_backward(
        ds * (z3 > 0), a2.shape, cols3, p["res2.weight"])
    dz2 = da2 * (z2 > 0)
    da1, g["res1.weight"], g["res1.bias"] = _conv_backward(
        dz2, a1.shape, cols2, p["res1.weight"])
    dz1 = (da1 + ds) * (z1 > 0)
    _, g["conv1.weight"], g["conv1.bias"] = _conv_backward(
        dz1, x.shape, cols1, p["conv1.weight"])
    return g


def _fit_rescnn(x, y, *, epochs=30, batch=32, lr=3e-3, seed=SEED):
    """Train the residual CNN's parameters with Adam on shuffled minibatches."""
    return _fit(x, y, _rescnn_init, _rescnn_forward, _rescnn_backward,
                epochs=epochs, batch=batch, lr=lr, seed=seed)


def train_rescnn(x_train=None, y_train=None):
    """Train the residual CNN in NumPy and write it as a float ONNX model.

    The CNN's recipe (30 epochs of Adam, lr 3e-3, batch 32, seed 0, softmax
    cross-entropy) with one residual block after the first convolution.

    The block is ``relu1 + Relu(Conv(Relu(Conv(relu1))))``: its last Relu sits before
    the Add, not after it. Both addends are then >= 0, so the int8 sum's calibrated
    range covers each addend's and the input/output scale ratios of the quantised Add
    are at most 1, as the tile's VADD requires. (With ``Relu(Conv(...) + relu1)``, the
    signed Conv output gets a larger scale than the Relu-clamped sum and the importer
    refuses the Add.) A Relu after the Add would be the identity, so there is none.

    Parameters
    ----------
    x_train, y_train : numpy.ndarray, optional
        Training data; by default the train half of :func:`load_split`.

    Returns
    -------
    onnx.ModelProto
        ``Conv -> Relu -> [Conv -> Relu -> Conv -> Relu] + skip -> MaxPool -> Conv ->
        Relu -> MaxPool -> Flatten -> Gemm``.
    """
    if x_train is None:
        x_train, y_train = load_split()[:2]
    params = _fit_rescnn(x_train.astype(np.float32), y_train)
    nodes = [
        _conv("conv1", INPUT, "conv1_out", "conv1.weight", "conv1.bias"),
        helper.make_node("Relu", ["conv1_out"], ["relu1"], name="relu1"),
        _conv("res1", "relu1", "res1_out", "res1.weight", "res1.bias"),
        helper.make_node("Relu", ["res1_out"], ["res_relu1"], name="res_relu1"),
        _conv("res2", "res_relu1", "res2_out", "res2.weight", "res2.bias"),
        helper.make_node("Relu", ["res2_out"], ["res_relu2"], name="res_relu2"),
        helper.make_node("Add", ["res_relu2", "relu1"], ["res_sum"], name="res_add"),
        _maxpool("pool1", "res_sum", "pool1"),
        _conv("conv2", "pool1", "conv2_out", "conv2.weight", "conv2.bias"),
        helper.make_node("Relu", ["conv2_out"], ["relu2"], name="relu2"),
        _maxpool("pool2", "relu2", "pool2"),
        helper.make_node("Flatten", ["pool2"], ["flat"], name="flatten", axis=1),
        _gemm("fc", "flat", OUTPUT, "fc.weight", "fc.bias"),
    ]
    return _make_model("digits_rescnn", nodes, params)


# --- dense layers (the early-exit and mixture-of-experts networks) ----------------

def _he(rng, shape, fan_in):
    """He-normal float32 weights of ``shape``."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def _dense_init(rng, params, name, n_in, n_out):
    """Add a He-normal ``(n_out, n_in)`` weight and a zero bias named ``name.*``."""
    params[f"{name}.weight"] = _he(rng, (n_out, n_in), n_in)
    params[f"{name}.bias"] = np.zeros(n_out, np.float32)


def _dense_forward(p, name, x):
    """``x @ weight.T + bias``: the Gemm(transB=1) ``name``."""
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def _dense_backward(p, name, dout, x, grads):
    """Store the Gemm ``name``'s weight and bias gradients in ``grads``; return dx."""
    grads[f"{name}.weight"] = dout.T @ x
    grads[f"{name}.bias"] = dout.sum(axis=0)
    return dout @ p[f"{name}.weight"]


def _softmax(z):
    """Row-wise softmax."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# --- early-exit network -----------------------------------------------------------

#: Share of the training images whose exit-head maximum logit reaches the threshold.
EXIT_RATE = 0.70


def _exit_init(rng):
    """He-normal weights, zero biases, in ONNX layouts (early-exit network)."""
    params = {}
    for name, n_in, n_out in (("fc1", 64, 32), ("exit_fc", 32, 10), ("fc2", 32, 64),
                              ("fc3", 64, 10)):
        _dense_init(rng, params, name, n_in, n_out)
    return params


def _exit_forward(p, x):
    """Both heads' logits, side by side ``(N, 20)`` (exit head first), and a cache."""
    flat = x.reshape(len(x), -1)
    z1 = _dense_forward(p, "fc1", flat)
    h = np.maximum(z1, 0)
    z2 = _dense_forward(p, "fc2", h)
    a2 = np.maximum(z2, 0)
    logits = np.concatenate([_dense_forward(p, "exit_fc", h),
                             _dense_forward(p, "fc3", a2)], axis=1)
    return logits, (flat, z1, h, z2, a2)


def _exit_backward(p, dlogits, cache):
    """Gradients of all parameters, given d(loss)/d(both heads' logits)."""
    flat, z1, h, z2, a2 = cache
    g = {}
    da2 = _dense_backward(p, "fc3", dlogits[:, 10:], a2, g)
    # h feeds both heads: its gradient is the sum of the two.
    dh = (_dense_backward(p, "exit_fc", dlogits[:, :10], h, g)
          + _dense_backward(p, "fc2", da2 * (z2 > 0), h, g))
    _dense_backward(p, "fc1", dh * (z1 > 0), flat, g)
    return g


def _heads_xent_grad(logits, y):
    """d/d(logits) of the summed cross-entropies of 10-class heads side by side."""
    heads = np.split(logits, logits.shape[1] // 10, axis=1)
    return np.concatenate([_softmax_xent_grad(l, y) for l in heads], axis=1)


def _fit_exit(x, y, *, epochs=60, batch=32, lr=1e-3, seed=SEED):
    """Train both heads of the early-exit network jointly (sum of the two losses)."""
    return _fit(x, y, _exit_init, _exit_forward, _exit_backward, epochs=epochs,
                batch=batch, lr=lr, seed=seed, loss_grad=_heads_xent_grad)


def exit_threshold(exit_logits, rate=EXIT_RATE):
    """The exit threshold: the ``1 - rate`` quantile of the exit head's largest logit.

    Parameters
    ----------
    exit_logits : numpy.ndarray
        The exit head's logits ``(N, 10)`` on the training images.
    rate : float
        The share of those images that should take the early exit.

    Returns
    -------
    numpy.float32
        ``T`` such that ``exit_logits.max(axis=1) >= T`` for ``rate`` of the images.
    """
    return np.float32(np.quantile(exit_logits.max(axis=1), 1.0 - rate))


def train_exit(x_train=None, y_train=None):
    """Train the early-exit network in NumPy and write it as a float ONNX model.

    A BranchyNet-style network: a shared ``Gemm(64 -> 32) -> Relu`` trunk, an exit head
    ``Gemm(32 -> 10)`` and a final head ``Gemm(32 -> 64) -> Relu -> Gemm(64 -> 10)``.
    Both heads are trained jointly on the sum of their softmax cross-entropies (60
    epochs of Adam, lr 1e-3, batch 32, seed 0). The graph returns the exit head's
    logits when their maximum reaches ``exit_threshold`` (:func:`exit_threshold` of the
    training images' exit logits), else the final head's.

    Parameters
    ----------
    x_train, y_train : numpy.ndarray, optional
        Training data; by default the train half of :func:`load_split`.

    Returns
    -------
    onnx.ModelProto
        ``Flatten -> Gemm -> Relu`` then the two heads, ``ReduceMax -> GreaterOrEqual``
        on the exit head and a ``Where`` choosing ``logits``.
    """
    if x_train is None:
        x_train, y_train = load_split()[:2]
    params = _fit_exit(x_train.astype(np.float32), y_train)
    train_logits, _ = _exit_forward(params, x_train.astype(np.float32))
    params["exit_threshold"] = exit_threshold(train_logits[:, :10])
    nodes = [
        helper.make_node("Flatten", [INPUT], ["flat"], name="flatten", axis=1),
        _gemm("fc1", "flat", "fc1_out", "fc1.weight", "fc1.bias"),
        helper.make_node("Relu", ["fc1_out"], ["relu1"], name="relu1"),
        _gemm("exit_fc", "relu1", "exit_logits", "exit_fc.weight", "exit_fc.bias"),
        _gemm("fc2", "relu1", "fc2_out", "fc2.weight", "fc2.bias"),
        helper.make_node("Relu", ["fc2_out"], ["relu2"], name="relu2"),
        _gemm("fc3", "relu2", "final_logits", "fc3.weight", "fc3.bias"),
        helper.make_node("ReduceMax", ["exit_logits"], ["exit_max"], name="exit_max",
                         axes=[1], keepdims=1),
        helper.make_node("GreaterOrEqual", ["exit_max", "exit_threshold"], ["exit_test"],
                         name="exit_test"),
        helper.make_node("Where", ["exit_test", "exit_logits", "final_logits"], [OUTPUT],
                         name="exit_where"),
    ]
    return _make_model("digits_exit", nodes, params)


# --- mixture of experts -----------------------------------------------------------

#: Number of experts (and of k-means clusters the gate learns to predict).
N_EXPERTS = 4
#: Temperature of the (gradient-free) gate weights that share out the experts' losses.
MOE_TAU = 2.0


def _kmeans(x, k, rng, *, restarts=10, iters=100):
    """Lloyd's k-means: the lowest-inertia run of ``restarts``; returns the labels.

    Each run starts from ``k`` distinct rows of ``x`` drawn by ``rng`` and stops when
    the centres stop moving (or after ``iters`` steps).
    """
    def nearest(centres):
        return ((x[:, None, :] - centres[None]) ** 2).sum(axis=-1).argmin(axis=1)

    best = None
    for _ in range(restarts):
        centres = x[rng.choice(len(x), k, replace=False)]
        for _ in range(iters):
            labels = nearest(centres)
            new = np.stack([x[labels == j].mean(axis=0) if np.any(labels == j)
                            else centres[j] for j in range(k)])
            if np.array_equal(new, centres):
                break
            centres = new
        labels = nearest(centres)
        inertia = ((x - centres[labels]) ** 2).sum()
        if best is None or inertia < best[0]:
            best = (inertia, labels)
    return best[1]


def expert_clusters(x_train, seed=SEED):
    """The expert each training image is meant for: k-means clusters of its pixels.

    :func:`_kmeans` with ``k = N_EXPERTS``, 10 restarts, on the flattened images (in
    float64), seeded with ``seed``.

    Parameters
    ----------
    x_train : numpy.ndarray
        Images ``(N, 1, 8, 8)``.

    Returns
    -------
    numpy.ndarray
        int64 cluster indices ``(N,)`` in ``[0, N_EXPERTS)``.
    """
    flat = x_train.reshape(len(x_train), -1).astype(np.float64)
    return _kmeans(flat, N_EXPERTS, np.random.default_rng(seed)).astype(np.int64)


def _moe_init(rng):
    """He-normal weights, zero biases, in ONNX layouts (mixture of experts)."""
    params = {}
    _dense_init(rng, params, "fc1", 64, 32)
    _dense_init(rng, params, "gate", 32, N_EXPERTS)
    for i in range(N_EXPERTS):
        _dense_init(rng, params, f"expert{i}_fc1", 32, 32)
        _dense_init(rng, params, f"expert{i}_fc2", 32, 10)
    return params


def _moe_forward(p, x):
    """Gate and all experts' logits side by side ``(N, E + 10 E)``, and a cache.

    Every expert runs on every image (training needs them all: see
    :func:`_moe_xent_grad`); the ONNX graph picks one with ArgMax and Gather.
    """
    flat = x.reshape(len(x), -1)
    z1 = _dense_forward(p, "fc1", flat)
    h = np.maximum(z1, 0)
    outputs, hidden = [_dense_forward(p, "gate", h)], []
    for i in range(N_EXPERTS):
        z = _dense_forward(p, f"expert{i}_fc1", h)
        a = np.maximum(z, 0)
        outputs.append(_dense_forward(p, f"expert{i}_fc2", a))
        hidden.append((z, a))
    return np.concatenate(outputs, axis=1), (flat, z1, h, hidden)


def _moe_backward(p, doutputs, cache):
    """Gradients of all parameters, given d(loss)/d(gate and expert logits)."""
    flat, z1, h, hidden = cache
    g = {}
    dgate, *dexperts = np.split(
        doutputs, [N_EXPERTS + 10 * i for i in range(N_EXPERTS)], axis=1)
    dh = _dense_backward(p, "gate", dgate, h, g)
    for i, ((z, a), dlogits) in enumerate(zip(hidden, dexperts)):
        da = _dense_backward(p, f"expert{i}_fc2", dlogits, a, g)
        dh = dh + _dense_backward(p, f"expert{i}_fc1", da * (z > 0), h, g)
    _dense_backward(p, "fc1", dh * (z1 > 0), flat, g)
    return g


def _moe_xent_grad(outputs, targets, tau=MOE_TAU):
    """d(loss)/d(outputs) of the mixture of experts.

    ``targets`` is ``(N, 2)``: the label and the image's cluster
    (:func:`expert_clusters`). The loss is the gate's cross-entropy against the cluster
    plus each expert's cross-entropy against the label weighted by ``softmax(gate /
    tau)``, with the weights held constant (no gradient reaches the gate through
    them). An expert thus learns mostly its own cluster but also the images the gate
    is unsure about, the ones a hard top-1 choice may send it at inference.
    """
    labels, clusters = targets[:, 0], targets[:, 1]
    gate, *experts = np.split(
        outputs, [N_EXPERTS + 10 * i for i in range(N_EXPERTS)], axis=1)
    weights = _softmax(gate / tau)
    grads = [_softmax_xent_grad(gate, clusters)]
    grads += [weights[:, i:i + 1] * _softmax_xent_grad(logits, labels)
              for i, logits in enumerate(experts)]
    return np.concatenate(grads, axis=1)


def _fit_moe(x, y, clusters, *, epochs=30, batch=32, lr=3e-3, seed=SEED):
    """Train the gate (towards ``clusters``) and the experts jointly."""
    return _fit(x, np.stack([y, clusters], axis=1), _moe_init, _moe_forward,
                _moe_backward, epochs=epochs, batch=batch, lr=lr, seed=seed,
                loss_grad=_moe_xent_grad)


def train_moe(x_train=None, y_train=None):
    """Train the mixture of experts in NumPy and write it as a float ONNX model.

    A shared ``Gemm(64 -> 32) -> Relu`` trunk feeds a gate ``Gemm(32 -> 4)`` and four
    experts ``Gemm(32 -> 32) -> Relu -> Gemm(32 -> 10)``; ``ArgMax`` of the gate picks
    one expert (top-1), whose logits ``Gather`` takes from their ``Concat``. The gate
    learns to predict the k-means cluster of the image (:func:`expert_clusters`), the
    experts learn the labels with their losses shared out by the gate
    (:func:`_moe_xent_grad`); 30 epochs of Adam, lr 3e-3, batch 32, seed 0.

    Parameters
    ----------
    x_train, y_train : numpy.ndarray, optional
        Training data; by default the train half of :func:`load_split`.

    Returns
    -------
    onnx.ModelProto
        ``Flatten -> Gemm -> Relu`` then the gate (``Gemm -> ArgMax``), the experts,
        ``Concat`` and ``Gather``.
    """
    if x_train is None:
        x_train, y_train = load_split()[:2]
    params = _fit_moe(x_train.astype(np.float32), y_train, expert_clusters(x_train))
    nodes = [
        helper.make_node("Flatten", [INPUT], ["flat"], name="flatten", axis=1),
        _gemm("fc1", "flat", "fc1_out", "fc1.weight", "fc1.bias"),
        helper.make_node("Relu", ["fc1_out"], ["relu1"], name="relu1"),
        _gemm("gate", "relu1", "gate_logits", "gate.weight", "gate.bias"),
        helper.make_node("ArgMax", ["gate_logits"], ["route"], name="route", axis=1,
                         keepdims=0, select_last_index=0),
    ]
    for i in range(N_EXPERTS):
        e = f"expert{i}"
        nodes += [
            _gemm(f"{e}_fc1", "relu1", f"{e}_fc1_out", f"{e}_fc1.weight",
                  f"{e}_fc1.bias"),
            helper.make_node("Relu", [f"{e}_fc1_out"], [f"{e}_relu"], name=f"{e}_relu"),
            _gemm(f"{e}_fc2", f"{e}_relu", f"{e}_logits", f"{e}_fc2.weight",
                  f"{e}_fc2.bias"),
        ]
    nodes += [
        helper.make_node("Concat", [f"expert{i}_logits" for i in range(N_EXPERTS)],
                         ["experts"], name="experts", axis=0),
        helper.make_node("Gather", ["experts", "route"], [OUTPUT], name="select", axis=0),
    ]
    return _make_model("digits_moe", nodes, params)


# --- quantisation and evaluation --------------------------------------------------

def _calib_reader(x_calib):
    """A CalibrationDataReader feeding ``x_calib`` one image at a time."""
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(x_calib)

        def get_next(self):
            img = next(self._it, None)
            return None if img is None else {INPUT: img[None].astype(np.float32)}

    return _Reader()


def quantize(model, x_calib):
    """Quantise a float model to int8 QDQ with onnxruntime's ``quantize_static``.

    Per-tensor (``per_channel=False``) int8 weights and activations, MinMax
    calibration over ``x_calib``. ``quant_pre_process`` is not run: by default it
    needs sympy (not a dependency), and with ``skip_symbolic_shape=True`` it only adds
    ``value_info`` to these hand-written graphs (nothing to fold; shapes are static).

    onnxruntime folds each Relu into the quantisation of the preceding Conv/Gemm output
    (zero point -128 over ``[0, max]``), so the QDQ model has no Relu nodes.

    The default operator list (``op_types_to_quantize=None``) already holds what the
    data-dependent models need: ``Where`` gets a Q/DQ on its output when both data
    inputs are quantised, ``Concat`` (in onnxruntime's QOperator registry, so in the
    default list, with the generic QDQ handling) gets a Q/DQ on its output, and
    ``Gather`` re-quantises with its data input's parameters. ``ReduceMax`` and
    ``GreaterOrEqual`` are not in the list and run in float; ``ArgMax`` is, but its
    input is quantised already and its int64 output cannot be.

    Parameters
    ----------
    model : onnx.ModelProto
        A float model with input ``input [1,1,8,8]``.
    x_calib : numpy.ndarray
        Calibration images ``(N, 1, 8, 8)`` float32 (fed with batch 1).

    Returns
    -------
    onnx.ModelProto
        The QDQ model (QuantizeLinear/DequantizeLinear around the float operators).
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    # quantize_static reads and writes files; its calibration scratch files go there too.
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "float.onnx"), Path(tmp, "int8.onnx")
        onnx.save(model, src)
        quantize_static(str(src), str(dst), _calib_reader(x_calib),
                        quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        per_channel=False)
        return onnx.load(dst)


def session(model_or_path):
    """A single-threaded CPU InferenceSession whose integer kernels do not saturate:
    the reference the tile's results are held to.

    On an x86-64 CPU without VNNI, onnxruntime's uint8 x int8 matrix kernels add pairs
    of products in 16 bits with saturation, so an int8 model's results depend on the
    machine (seen: 26 of this project's comparisons off by up to 123 steps on an AVX2
    EPYC that pass on a VNNI Xeon). The session option ``session.x64quantprecision``
    has it widen to 16 bits first (microsoft/onnxruntime#14642, #12088). That mode
    has no int8 x int8 QLinear kernels: a model that needs them (QOperator with int8
    activations) runs with the default ones, which agree with the tile there.
    Single thread: repeatable results.
    """
    import onnxruntime as ort

    src = model_or_path
    if isinstance(model_or_path, onnx.ModelProto):
        src = model_or_path.SerializeToString()
    elif isinstance(model_or_path, Path):
        src = str(model_or_path)

    def options(precise):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        if precise:
            opts.add_session_config_entry("session.x64quantprecision", "1")
        return opts

    # In order: the precise mode; the same without the transformer that turns int8
    # QDQ pairs into uint8 ones, which fails to initialise some models in that mode
    # ("Attempt to replace the existing tensor"); the default kernels.
    errors = (ort.capi.onnxruntime_pybind11_state.Fail,
              ort.capi.onnxruntime_pybind11_state.NotImplemented)
    for precise, disabled in ((True, []), (True, ["QDQS8ToU8Transformer"]), (False, [])):
        try:
            return ort.InferenceSession(src, options(precise),
                                        providers=["CPUExecutionProvider"],
                                        disabled_optimizers=disabled)
        except errors as e:
            error = e
    raise error


def predict(model_or_path, x):
    """Class predictions of a model on images ``x`` (N, 1, 8, 8), one at a time."""
    sess = session(model_or_path)
    return np.array([sess.run([OUTPUT], {INPUT: img[None]})[0].argmax()
                     for img in x.astype(np.float32)])


def accuracy(model_or_path, x, y):
    """Top-1 accuracy of a model under onnxruntime.

    Parameters
    ----------
    model_or_path : onnx.ModelProto or str or pathlib.Path
        The model, in memory or on disk.
    x : numpy.ndarray
        Images ``(N, 1, 8, 8)`` (run with batch 1, as the graph input is fixed).
    y : numpy.ndarray
        Labels ``(N,)``.

    Returns
    -------
    float
        The fraction of correct predictions, in [0, 1].
    """
    return float(np.mean(predict(model_or_path, x) == np.asarray(y)))


def _probe(model_or_path, x, name):
    """Values of the tensor ``name`` of a model on images ``x`` (one at a time), stacked.

    A copy of the model gets ``name`` as an extra graph output (onnxruntime infers its
    type), so any intermediate tensor can be read, e.g. ``exit_test`` or ``route``.
    """
    if isinstance(model_or_path, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(model_or_path)
    else:
        model = onnx.load(str(model_or_path))
    model.graph.output.append(onnx.ValueInfoProto(name=name))
    sess = session(model)
    return np.stack([sess.run([name], {INPUT: img[None]})[0]
                     for img in x.astype(np.float32)])


def early_exits(model_or_path, x):
    """Which images take the early exit in an early-exit model (its ``exit_test``).

    Parameters
    ----------
    model_or_path : onnx.ModelProto or str or pathlib.Path
        ``digits_exit.onnx`` or ``digits_exit_float.onnx`` (or the model in memory).
    x : numpy.ndarray
        Images ``(N, 1, 8, 8)``.

    Returns
    -------
    numpy.ndarray
        bool ``(N,)``: True where the exit head's largest logit reaches the threshold.
    """
    return _probe(model_or_path, x, "exit_test").reshape(len(x))


def routes(model_or_path, x):
    """The expert the gate picks for each image in a mixture-of-experts model.

    Parameters
    ----------
    model_or_path : onnx.ModelProto or str or pathlib.Path
        ``digits_moe.onnx`` or ``digits_moe_float.onnx`` (or the model in memory).
    x : numpy.ndarray
        Images ``(N, 1, 8, 8)``.

    Returns
    -------
    numpy.ndarray
        int64 ``(N,)`` in ``[0, N_EXPERTS)``: the graph's ``route`` (ArgMax of the gate).
    """
    return _probe(model_or_path, x, "route").reshape(len(x))


def build(out_dir):
    """Train, quantise and save the five workloads; return their test accuracies.

    Writes ``digits_{mlp,cnn,rescnn,exit,moe}.onnx`` (int8 QDQ) and
    ``digits_{mlp,cnn,rescnn,exit,moe}_float.onnx`` into ``out_dir``.
    Calibration uses the first 200 training images. All seeds are fixed: rebuilding
    gives byte-identical files.

    Parameters
    ----------
    out_dir : str or pathlib.Path
        Where the models go (created if missing).

    Returns
    -------
    dict
        ``{"mlp": {"float": acc, "int8": acc}, "cnn": {...}, "rescnn": {...},
        "exit": {...}, "moe": {...}}`` on the test split. ``"exit"`` also holds the int8
        model's early-exit rate (``"exit_rate"``) and its rate per class
        (``"exit_rate_by_class"``, ten values); ``"moe"`` the int8 model's share of
        images per expert (``"expert_share"``, ``N_EXPERTS`` values).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    x_train, y_train, x_test, y_test = load_split()
    results, int8 = {}, {}
    for name, train in (("mlp", train_mlp), ("cnn", train_cnn),
                        ("rescnn", train_rescnn), ("exit", train_exit),
                        ("moe", train_moe)):
        fmodel = train(x_train, y_train)
        qmodel = quantize(fmodel, x_train[:N_CALIB])
        onnx.save(fmodel, out / f"digits_{name}_float.onnx")
        onnx.save(qmodel, out / f"digits_{name}.onnx")
        results[name] = {"float": accuracy(fmodel, x_test, y_test),
                         "int8": accuracy(qmodel, x_test, y_test)}
        int8[name] = qmodel
    exits = early_exits(int8["exit"], x_test)
    results["exit"]["exit_rate"] = float(exits.mean())
    results["exit"]["exit_rate_by_class"] = [float(exits[y_test == k].mean())
                                             for k in range(10)]
    share = np.bincount(routes(int8["moe"], x_test), minlength=N_EXPERTS) / len(x_test)
    results["moe"]["expert_share"] = [float(v) for v in share]
    return results
