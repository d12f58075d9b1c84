"""A small causal transformer language model trained with FSDP2 (``torch.distributed.fsdp.fully_shard``)
or DeepSpeed ZeRO on the synthetic corpus of ``make_data.py``: the resontech ``strategy: fsdp`` and
``strategy: deepspeed`` contracts, by example.

Every shard of a ``kind: ddp`` job runs this script under ``torchrun`` (one node per shard; the job's
``strategy`` says how the script shards the model, ``$RESONTECH_STRATEGY``). FSDP2 shards every
parameter, gradient and optimizer state across all ranks (ZeRO-3's memory: each rank holds
1/world of them), gathering a block's parameters only while it computes. What the script does for the
platform, as the DDP example does:

* ``init_process_group`` with ``$RESONTECH_DDP_BACKEND`` (``gloo`` on CPU, ``nccl`` on GPUs) and a
  one-dimensional device mesh over every rank (``cpu`` or ``cuda``: FSDP2 runs on CPU given a CPU
  mesh).
* Rank 0 prints ``RESONTECH_PROGRESS`` after every epoch.
* A checkpoint every ``--checkpoint-every`` epochs, in one of two formats:

  - ``--checkpoint-format sharded`` (the default): every rank saves its own shards with
    ``torch.distributed.checkpoint.async_save`` into ``$RESONTECH_CHECKPOINT_DIR/step-<step>/`` on its
    node (training goes on while the files are written, over a gloo group of their own); when the
    save has finished on every rank, each node's local rank 0 reports the folder
    (``RESONTECH_CHECKPOINT {"dir": ..., "step": ...}``), and its agent uploads the node's part. The
    checkpoint counts once every node's part is stored.
  - ``--checkpoint-format full``: the full state, gathered from the shards (``get_state_dict`` with
    ``full_state_dict``), written by rank 0 as one file and reported with ``{"path": ...}``.

  Either loads on any number of ranks (DCP reshards on load), so a restart may run on another
  world size.
* With ``$RESONTECH_RESUME_PATH`` (every node fetched the checkpoint: a folder holding every node's
  part, or one file), every rank loads its own shard of it; training continues from the epoch after
  it, and the step counter comes from the checkpoint: no step is skipped or done twice.

With ``$RESONTECH_STRATEGY`` ``deepspeed``, the same model trains under a DeepSpeed engine instead,
ZeRO stage ``--zero-stage`` (2: optimizer state and gradients sharded; 3: parameters too), with a torch
AdamW (DeepSpeed's own CPU Adam would compile an extension). Each checkpoint is DeepSpeed's
(``save_checkpoint``: every rank writes its own files into ``step-<step>/`` on its node, reported as
above); it loads on the same number of ranks.

Everything is seeded (weights, data order per epoch), so two runs of the same arguments on the same
world size end with the same parameters, a run interrupted and resumed included.

Locally, without the platform: ``torchrun --nproc-per-node 2 train.py --data tokens.npz``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def report(keyword: str, **fields: Any) -> None:
    """One line of the workload protocol, in one write (the node's ranks share the agent's pipe)."""
    sys.stdout.write(f"RESONTECH_{keyword} {json.dumps(fields)}\n")
    sys.stdout.flush()


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="tokens.npz", help="the corpus (.npz with tokens)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=2, help="epochs between checkpoints")
    parser.add_argument("--checkpoint-format", choices=("sharded", "full"), default="sharded")
    parser.add_argument("--zero-stage", type=int, choices=(2, 3), default=3, help="strategy deepspeed")
    parser.add_argument("--min-epoch-seconds", type=float, default=0.0)
    return parser.parse_args()


class Block(nn.Module):
    """Pre-norm self-attention and MLP, causal."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, length: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(length, width))
        self.blocks = nn.ModuleList(Block(width, heads=4) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device), diagonal=1)
        x = self.embed(tokens) + self.position[:n]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def sharded(model: LanguageModel, mesh: Any) -> LanguageModel:
    """FSDP2: each block is a unit of its own (gathered only while it runs), then the root (the
    embeddings and the head)."""
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class Checkpoints:
    """The checkpoints of one run: sharded with DCP's ``async_save`` (the default) or one full file."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, form: str) -> None:
        self.model, self.optimizer, self.form = model, optimizer, form
        self.folder = Path(os.environ.get("RESONTECH_CHECKPOINT_DIR", "checkpoints"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.group = dist.new_group(backend="gloo") if form == "sharded" else None  # async_save's own
        self.pending: Any = None
        self.stalls: list[float] = []

    def save(self, epoch: int, step: int) -> None:
        """Save after ``epoch``; only the staging blocks training (timed in :attr:`stalls`)."""
        self.wait()
        started = time.monotonic()
        if self.form == "full":
            self._save_full(epoch, step)
        else:
            name = f"step-{step:08d}"
            state = self._sharded_state()
            state["progress"] = torch.tensor([epoch, step])
            future = dcp.async_save(state, checkpoint_id=self.folder / name, process_group=self.group)
            future.add_done_callback(lambda done: self._saved(done, name, step))
            self.pending = future
        self.stalls.append(time.monotonic() - started)

    def _saved(self, future: Any, name: str, step: int) -> None:
        """The save is done on every rank (a rank's future completes once every rank's files and the
        metadata are written): this node's local rank 0 reports its folder, at once."""
        if future.exception() is None and self.local_rank == 0:
            report("CHECKPOINT", dir=name, step=step)

    def wait(self) -> None:
        """Wait for the save in flight (a failed save raises here)."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def _sharded_state(self) -> dict[str, Any]:
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def _save_full(self, epoch: int, step: int) -> None:
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer, options=full)  # all ranks
        if dist.get_rank() != 0:
            return
        state = {"model": model_state, "optimizer": optimizer_state, "epoch": epoch, "step": step}
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"epoch-{epoch:04d}.pt"
        partial = self.folder / f".{name}.partial"
        torch.save(state, partial)
        partial.replace(self.folder / name)  # the agent never sees a half-written file
        report("CHECKPOINT", path=name, step=step)

    def resume(self) -> tuple[int, int]:
        """The first epoch to train and the step counter: from ``$RESONTECH_RESUME_PATH`` when set
        (a folder: a sharded checkpoint; a file: a full one), else ``(1, 0)``."""
        resume = os.environ.get("RESONTECH_RESUME_PATH")
        if not resume:
            return 1, 0
        if Path(resume).is_dir():
            state = self._sharded_state()
            state["progress"] = torch.zeros(2, dtype=torch.int64)
            dcp.load(state, checkpoint_id=resume)  # each rank reads the shards it now holds
            epoch, step = (int(v) for v in state["progress"])
            options = StateDictOptions()
        else:
            state = torch.load(resume, map_location="cpu", weights_only=True)
            epoch, step = state["epoch"], state["step"]
            options = StateDictOptions(full_state_dict=True)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=options,
        )
        if dist.get_rank() == 0:
            source = os.environ.get("RESONTECH_RESUME_FROM", resume)
            print(f"resumed from {source}: epoch {epoch}, step {step}, world size {dist.get_world_size()}")
        return epoch + 1, step


class Run:
    """How one strategy trains: ``forward`` (the sharded model, or the DeepSpeed engine), ``update``
    (backward and optimizer step), and its checkpoints (``save``, ``wait``, ``resume``, ``stalls``)."""

    def __init__(self, forward: Any, update: Any, checkpoints: Any, device: torch.device) -> None:
        self.forward, self.update, self.checkpoints, self.device = forward, update, checkpoints, device


def fsdp_run(model: LanguageModel, args: argparse.Namespace, mesh: Any, device: torch.device) -> Run:
    model = sharded(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def update(loss: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return Run(model, update, Checkpoints(model, optimizer, args.checkpoint_format), device)


def deepspeed_run(model: LanguageModel, args: argparse.Namespace, device: torch.device) -> Run:
    import deepspeed  # only this strategy needs it

    # On CPU, DeepSpeed compiles a shared-memory all-reduce (C++, with the host's compiler) when its
    # communication starts, for inference only: training never calls it. Skip the build.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.zero_stage},
        "zero_allow_untested_optimizer": True,  # a torch optimizer: DeepSpeed's CPU Adam compiles
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def update(loss: torch.Tensor) -> None:
        engine.backward(loss)
        engine.step()

    return Run(engine, update, DeepSpeedCheckpoints(engine), device)


class DeepSpeedCheckpoints:
    """DeepSpeed's own checkpoints: every rank writes its files into ``step-<step>/`` on its node."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.folder = Path(os.environ.get("RESONTECH_CHECKPOINT_DIR", "checkpoints"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.stalls: list[float] = []

    def save(self, epoch: int, step: int) -> None:
        started = time.monotonic()
        name = f"step-{step:08d}"
        self.engine.save_checkpoint(str(self.folder), tag=name, client_state={"epoch": epoch, "step": step})
        dist.barrier()  # every rank's files are written
        self.stalls.append(time.monotonic() - started)
        if self.local_rank == 0:
            report("CHECKPOINT", dir=name, step=step)

    def wait(self) -> None:
        """Saves are synchronous: nothing in flight."""

    def resume(self) -> tuple[int, int]:
        resume = os.environ.get("RESONTECH_RESUME_PATH")
        if not resume:
            return 1, 0
        path = Path(resume)
        _, state = self.engine.load_checkpoint(str(path.parent), tag=path.name)
        epoch, step = int(state["epoch"]), int(state["step"])
        if dist.get_rank() == 0:
            source = os.environ.get("RESONTECH_RESUME_FROM", resume)
            print(f"resumed from {source}: epoch {epoch}, step {step}, world size {dist.get_world_size()}")
        return epoch + 1, step


def train_epoch(run: Run, loader: DataLoader[Any], step: int, *, resumed: bool) -> tuple[float, int]:
    """One pass over this rank's part of the data; the mean loss over every rank, and the step
    counter. ``resumed``: the first epoch after a resume, whose first step rank 0 reports at once
    (a ``RESONTECH_PROGRESS`` with the step alone: when training went on)."""
    device = run.device
    totals = torch.zeros(2, device=device)  # loss sum, predicted tokens
    for (batch,) in loader:
        batch = batch.to(device)
        logits = run.forward(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        run.update(loss)
        step += 1
        totals += torch.tensor([loss.item() * batch[:, 1:].numel(), batch[:, 1:].numel()], device=device)
        if resumed:
            report("PROGRESS", step=step, metrics={"resumed": 1.0})
            resumed = False
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item(), step


def main() -> None:
    args = arguments()
    backend = os.environ.get("RESONTECH_DDP_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    kind = "cuda" if backend == "nccl" else "cpu"
    if kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device("cpu")

    tokens = torch.from_numpy(np.load(args.data)["tokens"])
    vocab, length = int(tokens.max()) + 1, tokens.shape[1] - 1
    dataset = TensorDataset(tokens)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(0)  # every rank builds the same weights before they are sharded
    model = LanguageModel(vocab, length, args.width, args.layers).to(device)
    if os.environ.get("RESONTECH_STRATEGY") == "deepspeed":
        run = deepspeed_run(model, args, device)
    else:
        run = fsdp_run(model, args, init_device_mesh(kind, (world,)), device)
    checkpoints = run.checkpoints

    first_epoch, step = checkpoints.resume()
    for epoch in range(first_epoch, args.epochs + 1):
        started = time.monotonic()
        sampler.set_epoch(epoch)
        resumed = rank == 0 and epoch == first_epoch > 1
        loss_mean, step = train_epoch(run, loader, step, resumed=resumed)
        if rank == 0:
            metrics = {"perplexity": round(math.exp(loss_mean), 3), "world_size": world}
            if checkpoints.stalls:
                metrics["checkpoint_stall_s"] = round(checkpoints.stalls[-1], 4)
            report("PROGRESS", train_epoch=epoch, step=step, loss=round(loss_mean, 5), metrics=metrics)
        if epoch % args.checkpoint_every == 0 or epoch == args.epochs:
            checkpoints.save(epoch, step)
        time.sleep(max(0.0, args.min_epoch_seconds - (time.monotonic() - started)))
    checkpoints.wait()
    if rank == 0 and checkpoints.stalls:
        print(f"checkpoint stall per save: {max(checkpoints.stalls):.3f} s at most", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
