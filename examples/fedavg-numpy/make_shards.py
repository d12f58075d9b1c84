"""Make the shard ZIPs of the NumPy FedAvg example: synthetic linear data, unevenly split.

``python make_shards.py OUT_DIR [--shards 2] [--samples 300] [--seed 0]`` writes
``OUT_DIR/shard-0.zip`` .. (each holding ``data.npz`` with ``x`` and ``y``) and ``OUT_DIR/truth.json``
(the weights the federation should find). Shard ``i`` has ``i + 1`` parts of the samples, so FedAvg's
weighting by sample count matters.
"""

import argparse
import json
import zipfile
from io import BytesIO
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--features", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    w, b = rng.normal(size=args.features), rng.normal(size=1)
    x = rng.normal(size=(args.samples, args.features))
    y = x @ w + b + rng.normal(scale=0.05, size=args.samples)
    parts = np.arange(1, args.shards + 1)
    bounds = np.concatenate([[0], np.cumsum(parts) * args.samples // parts.sum()])
    args.out.mkdir(parents=True, exist_ok=True)
    for i in range(args.shards):
        lo, hi = bounds[i], bounds[i + 1]
        buffer = BytesIO()
        np.savez(buffer, x=x[lo:hi], y=y[lo:hi])
        with zipfile.ZipFile(args.out / f"shard-{i}.zip", "w") as archive:
            archive.writestr("data.npz", buffer.getvalue())
        print(f"shard-{i}.zip: {hi - lo} samples")
    (args.out / "truth.json").write_text(json.dumps({"w": w.tolist(), "b": b.tolist()}))


if __name__ == "__main__":
    main()
