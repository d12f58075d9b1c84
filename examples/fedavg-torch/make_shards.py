"""Make the shard ZIPs and the initial model of the PyTorch FedAvg example.

``python make_shards.py OUT_DIR [--shards 2] [--samples 600] [--seed 0]`` writes ``OUT_DIR/shard-N.zip``
(each holding ``data.pt``: ``x`` float32 [n, 8], ``y`` int64 [n]) from a synthetic 3-class dataset
(Gaussian blobs; each site sees a different mix of classes, as federated data often is), and
``OUT_DIR/model.pt``, the MLP's initial state dict (the job's ``initial_model``).
"""

import argparse
import io
import sys
import zipfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import CLASSES, FEATURES, MLP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(args.seed)
    centers = torch.randn(CLASSES, FEATURES, generator=generator) * 2.5
    args.out.mkdir(parents=True, exist_ok=True)
    per_shard = args.samples // args.shards
    for i in range(args.shards):
        # Site i leans towards class i % CLASSES: 60% of its samples, the rest spread evenly.
        weights = torch.full((CLASSES,), 0.4 / (CLASSES - 1))
        weights[i % CLASSES] = 0.6
        y = torch.multinomial(weights, per_shard, replacement=True, generator=generator)
        x = centers[y] + torch.randn(per_shard, FEATURES, generator=generator)
        buffer = io.BytesIO()
        torch.save({"x": x.float(), "y": y.long()}, buffer)
        with zipfile.ZipFile(args.out / f"shard-{i}.zip", "w") as archive:
            archive.writestr("data.pt", buffer.getvalue())
        print(f"shard-{i}.zip: {per_shard} samples")
    torch.manual_seed(args.seed)
    torch.save(MLP().state_dict(), args.out / "model.pt")
    print("model.pt: the initial weights")


if __name__ == "__main__":
    main()
