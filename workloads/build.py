"""Rebuild the shipped digits workloads: ``python -m fusetile.workloads.build``.

Trains the MLP, the CNN, the residual CNN, the early-exit network and the mixture of
experts, quantises them to int8 QDQ and writes the ten ``.onnx`` files (by default next
to this module, i.e. the ``workloads/`` folder), then prints their onnxruntime accuracy
on the test split, the early-exit network's early-exit rate (overall and per class) and
the mixture of experts' share of images per expert (both of the int8 models).
"""

import argparse
import time
from pathlib import Path

from .digits import build


def main(argv=None):
    """Parse ``--out DIR``, build, print the accuracy table and the routing numbers."""
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
    exit_ = results["exit"]
    print(f"exit: early-exit rate (int8, test split) {exit_['exit_rate']:.2%}; "
          "per class " + " ".join(f"{k}:{rate:.0%}"
                                  for k, rate in enumerate(exit_["exit_rate_by_class"])))
    print("moe: share of test images per expert (int8) "
          + " ".join(f"{i}:{share:.2%}"
                     for i, share in enumerate(results["moe"]["expert_share"])))
    print(f"wrote {args.out} in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
