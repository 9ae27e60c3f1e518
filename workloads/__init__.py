"""The shipped workloads: small int8 networks for the tile, with their builder.

:mod:`.digits` trains an MLP, a CNN, a residual CNN and two data-dependent networks (an
early exit and a top-1 mixture of experts) on scikit-learn's bundled digits (8 x 8
images, 10 classes), writes them as ONNX and quantises them to int8 QDQ with
onnxruntime. The built models ship next to this file (``digits_mlp.onnx``,
``digits_cnn.onnx``, ``digits_rescnn.onnx``, ``digits_exit.onnx``, ``digits_moe.onnx``
and their ``*_float.onnx`` originals); :mod:`.build` rebuilds them.
"""
