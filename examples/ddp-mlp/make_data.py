"""Write the synthetic dataset of the DDP example: ``data.npz`` with ``x`` (float32, n x 16) and ``y``
(int64 class labels, 4 classes) drawn from a fixed random teacher network, so that an MLP can learn it.

Usage: ``python make_data.py [--samples 4096] [--out data.npz]`` (needs only numpy).
"""

from __future__ import annotations

import argparse

import numpy as np

FEATURES = 16
CLASSES = 4


def synthetic(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``samples`` points labelled by a random two-layer teacher (the same for every seed's data)."""
    teacher = np.random.default_rng(1234)
    w1 = teacher.normal(size=(FEATURES, 32))
    w2 = teacher.normal(size=(32, CLASSES))
    x = np.random.default_rng(seed).normal(size=(samples, FEATURES)).astype(np.float32)
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int64)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="data.npz")
    args = parser.parse_args()
    x, y = synthetic(args.samples, args.seed)
    np.savez(args.out, x=x, y=y)
    print(f"wrote {args.out}: {len(x)} samples, {FEATURES} features, {CLASSES} classes")


if __name__ == "__main__":
    main()
