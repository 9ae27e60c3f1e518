"""Rebuild the shipped digits workloads: ``python -m fusetile.workloads.build``.

Trains the MLP, the CNN and the residual CNN, quantises them to int8 QDQ and writes
the six ``.onnx`` files (by default next to this module, i.e. the ``workloads/``
folder), then prints their onnxruntime accuracy on the test split.
"""

import argparse
import time
from pathlib import Path

from .digits import build


def main(argv=None):
    """Parse ``--out DIR``, build, print the accuracy table."""
    parser = argparse.ArgumentParser(
        prog="python -m fusetile.workloads.build",
        description="Train, quantise and save the digits workloads.")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="output folder (default: %(default)s)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = build(args.out)
    elapsed = time.perf_counter() - start
    print(f"{'model':<6} {'float':>7} {'int8':>7}")
    for name, acc in results.items():
        print(f"{name:<6} {acc['float']:>7.2%} {acc['int8']:>7.2%}")
    print(f"wrote {args.out} in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
