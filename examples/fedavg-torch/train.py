"""Federated training of a small PyTorch MLP on CPU: an NVFlare Client API script (framework pytorch).

Each site loads its shard (``data.pt``: tensors ``x`` and ``y``) from ``RESONTECH_DATA_ROOT``, loads the
global weights it receives into the MLP of ``model.py``, trains ``RESONTECH_LOCAL_EPOCHS`` epochs of
mini-batch SGD, and sends the new state dict with its sample count (FedAvg weighs by it). It reports
round, epoch and loss as ``RESONTECH_PROGRESS`` lines, and loss and accuracy as the round's metrics.

Usage (as the job's script): ``train.py [--lr 0.05] [--batch 32] [--delay 0]``.
"""

import argparse
import json
import os
import time

import nvflare.client as flare
import torch
from model import MLP
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    shard = torch.load(os.path.join(os.environ["RESONTECH_DATA_ROOT"], "data.pt"), weights_only=True)
    x, y = shard["x"], shard["y"]
    epochs = int(os.environ.get("RESONTECH_LOCAL_EPOCHS") or 1)
    model, loss_fn = MLP(), nn.CrossEntropyLoss()
    flare.init()
    while flare.is_running():
        received = flare.receive()
        if received.params:
            model.load_state_dict(received.params)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
        round_number = received.current_round + 1
        for epoch in range(1, epochs + 1):
            order = torch.randperm(len(y))
            for start in range(0, len(y), args.batch):
                batch = order[start : start + args.batch]
                optimizer.zero_grad()
                loss = loss_fn(model(x[batch]), y[batch])
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                logits = model(x)
                loss_value = float(loss_fn(logits, y))
                accuracy = float((logits.argmax(dim=1) == y).float().mean())
            report = {
                "round": round_number,
                "train_epoch": epoch,
                "loss": loss_value,
                "metrics": {"accuracy": accuracy},
            }
            print("RESONTECH_PROGRESS " + json.dumps(report), flush=True)
            time.sleep(args.delay)
        flare.send(
            flare.FLModel(
                params=model.state_dict(),
                metrics={"loss": loss_value, "accuracy": accuracy},
                meta={"NUM_STEPS_CURRENT_ROUND": len(y)},
            )
        )


if __name__ == "__main__":
    main()
