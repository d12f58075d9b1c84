"""A small MLP trained with PyTorch DDP on the synthetic dataset of ``make_data.py``: the resontech DDP
contract, by example.

Every shard of a ``kind: ddp`` job runs this script under ``torchrun`` (one node per shard); the agent
has already downloaded the job's inputs into the working directory at their workspace keys. What
the script does for the platform:

* ``torch.distributed.init_process_group`` with ``$RESONTECH_DDP_BACKEND`` (``gloo`` on CPU, ``nccl``
  on GPUs); torchrun set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``.
* Rank 0 prints ``RESONTECH_PROGRESS {"train_epoch": e, "step": s, "loss": l}`` after every epoch
  (the feed and ``resontech watch`` show it).
* Every ``--checkpoint-every`` epochs, and after the last one, rank 0 writes a checkpoint into
  ``$RESONTECH_CHECKPOINT_DIR`` under a new file name (written to a temporary name, then renamed) and
  prints ``RESONTECH_CHECKPOINT {"path": "<file name>", "step": s}``. The agent uploads the file to
  the job's workspace (``jobs/{name}/checkpoints/``) through a presigned URL: the script never holds
  object-store credentials.
* When ``$RESONTECH_RESUME_PATH`` is set (a worker was lost and the kernel restarted every rank), it
  loads that checkpoint and continues from the epoch after it, not from step 0.

``--min-epoch-seconds`` paces the epochs so that a demo can be watched (and an agent killed midway).
Run it locally with ``torchrun --nproc-per-node 2 train.py --data data.npz``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def report(keyword: str, **fields: Any) -> None:
    """One line of the workload protocol, in one write: every rank of the node shares the agent's
    pipe, and ``print`` writes the newline separately, so another rank's output could split it."""
    sys.stdout.write(f"RESONTECH_{keyword} {json.dumps(fields)}\n")
    sys.stdout.flush()


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="data.npz", help="the dataset (.npz with x and y)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--checkpoint-every", type=int, default=2, help="epochs between checkpoints")
    parser.add_argument("--min-epoch-seconds", type=float, default=0.0)
    return parser.parse_args()


def mlp(features: int, classes: int) -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights (DDP also broadcasts rank 0's)
    w = 64
    return nn.Sequential(nn.Linear(features, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, classes))


def save_checkpoint(state: dict[str, Any], epoch: int, step: int) -> None:
    folder = Path(os.environ.get("RESONTECH_CHECKPOINT_DIR", "checkpoints"))
    folder.mkdir(parents=True, exist_ok=True)
    name = f"epoch-{epoch:04d}.pt"
    partial = folder / f".{name}.partial"
    torch.save(state, partial)
    partial.replace(folder / name)  # the agent never sees a half-written file
    report("CHECKPOINT", path=name, step=step)


def main() -> None:
    args = arguments()
    backend = os.environ.get("RESONTECH_DDP_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if backend == "nccl" else "cpu")

    data = np.load(args.data)
    dataset = TensorDataset(torch.from_numpy(data["x"]), torch.from_numpy(data["y"]))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = mlp(dataset.tensors[0].shape[1], int(data["y"].max()) + 1).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    first_epoch, step = 1, 0
    resume = os.environ.get("RESONTECH_RESUME_PATH")
    if resume:
        state = torch.load(resume, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch, step = state["epoch"] + 1, state["step"]
        if rank == 0:
            source = os.environ.get("RESONTECH_RESUME_FROM", resume)
            print(f"resumed from {source}: epoch {state['epoch']}, step {step}", flush=True)
    ddp = DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(first_epoch, args.epochs + 1):
        started = time.monotonic()
        sampler.set_epoch(epoch)
        totals = torch.zeros(3, device=device)  # loss sum, correct, samples
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = ddp(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            correct = (logits.argmax(1) == y).sum().item()
            totals += torch.tensor([loss.item() * len(y), correct, len(y)], device=device)
        dist.all_reduce(totals)
        if rank == 0:
            loss_mean, accuracy = (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()
            report(
                "PROGRESS",
                train_epoch=epoch,
                step=step,
                loss=round(loss_mean, 5),
                metrics={"accuracy": round(accuracy, 4), "world_size": world},
            )
            if epoch % args.checkpoint_every == 0 or epoch == args.epochs:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                save_checkpoint({**state, "epoch": epoch, "step": step}, epoch, step)
        time.sleep(max(0.0, args.min_epoch_seconds - (time.monotonic() - started)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
