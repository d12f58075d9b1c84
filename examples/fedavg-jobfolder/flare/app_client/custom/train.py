"""Federated linear regression with NumPy, as the client app of an NVFlare job folder.

The same learning as ``examples/fedavg-numpy/train.py``: each site reads its shard (``data.npz`` with
``x`` and ``y``) from ``RESONTECH_DATA_ROOT``, runs ``RESONTECH_LOCAL_EPOCHS`` epochs of full-batch
gradient descent from the global model it receives (zeros when the model is empty), and sends back
its weights with its sample count (``NUM_STEPS_CURRENT_ROUND``), which the job folder's
``InTimeAccumulateWeightedAggregator`` weighs by. ``RESONTECH_PROGRESS`` lines reach the job's feed.
"""

import argparse
import json
import os

import numpy as np
import nvflare.client as flare


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    with np.load(os.path.join(os.environ["RESONTECH_DATA_ROOT"], "data.npz")) as shard:
        x, y = shard["x"], shard["y"]
    epochs = int(os.environ.get("RESONTECH_LOCAL_EPOCHS") or 1)
    flare.init()
    while flare.is_running():
        model = flare.receive()
        params = model.params or {}
        w, b = params.get("w", np.zeros(x.shape[1])), params.get("b", np.zeros(1))
        for epoch in range(1, epochs + 1):
            error = x @ w + b - y
            w = w - args.lr * 2 * x.T @ error / len(y)
            b = b - args.lr * 2 * np.mean(error, keepdims=True)
            loss = float(np.mean((x @ w + b - y) ** 2))
            report = {"round": model.current_round + 1, "train_epoch": epoch, "loss": loss}
            print("RESONTECH_PROGRESS " + json.dumps(report), flush=True)
        flare.send(
            flare.FLModel(
                params={"w": w, "b": b}, metrics={"loss": loss}, meta={"NUM_STEPS_CURRENT_ROUND": len(y)}
            )
        )


if __name__ == "__main__":
    main()
