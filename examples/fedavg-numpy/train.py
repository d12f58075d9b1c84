"""Federated linear regression with NumPy: an NVFlare Client API script, run by every site.

Each site reads its shard (``data.npz`` with ``x`` and ``y``) from ``RESONTECH_DATA_ROOT``, runs
``RESONTECH_LOCAL_EPOCHS`` epochs of full-batch gradient descent from the global model it receives,
and sends back its weights with its sample count (``NUM_STEPS_CURRENT_ROUND``), which FedAvg weighs by.
``RESONTECH_PROGRESS`` lines reach the job's feed (round, epoch, loss).

Usage (as the job's script): ``train.py [--lr 0.1] [--delay 0]``; ``--delay`` sleeps that many seconds
per local epoch, to make a demo (or a recovery test) slow enough to watch.
"""

import argparse
import json
import os
import time

import numpy as np
import nvflare.client as flare


def mse(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean((x @ w + b - y) ** 2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    with np.load(os.path.join(os.environ["RESONTECH_DATA_ROOT"], "data.npz")) as shard:
        x, y = shard["x"], shard["y"]
    epochs = int(os.environ.get("RESONTECH_LOCAL_EPOCHS") or 1)
    flare.init()
    while flare.is_running():
        model = flare.receive()
        params = model.params or {}
        w = params.get("w", np.zeros(x.shape[1]))  # an empty model: every site starts from zeros
        b = params.get("b", np.zeros(1))
        round_number = model.current_round + 1
        for epoch in range(1, epochs + 1):
            error = x @ w + b - y
            w = w - args.lr * 2 * x.T @ error / len(y)
            b = b - args.lr * 2 * np.mean(error, keepdims=True)
            loss = mse(w, b, x, y)
            time.sleep(args.delay)
            report = {"round": round_number, "train_epoch": epoch, "loss": loss}
            print("RESONTECH_PROGRESS " + json.dumps(report), flush=True)
        flare.send(
            flare.FLModel(
                params={"w": w, "b": b},
                metrics={"loss": loss},
                meta={"NUM_STEPS_CURRENT_ROUND": len(y)},
            )
        )


if __name__ == "__main__":
    main()
