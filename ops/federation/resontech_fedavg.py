"""The kernel's FedAvg workflow, shipped into the server app of every federated run as the module
``resontech_fedavg`` (see :func:`core.flare.fl_job`).

It is NVFlare's own ``FedAvg`` (weighted by each client's ``NUM_STEPS_CURRENT_ROUND``, its sample
count) with two changes: the first global model comes from a file the kernel chose (the tenant's
initial model, or the last round's when a run restarts), and every round's global model is written to
``out_dir`` as ``round-NNNNN.npz`` with its aggregated metrics in ``round-NNNNN.json`` (the JSON is
written last, so its presence means both are complete). The federation service picks them up from
there; nothing here talks to the kernel.

It runs inside NVFlare's server job process, next to no tenant code, and imports nothing of ours.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.workflows.fedavg import FedAvg


def read_params(path: str) -> dict[str, np.ndarray]:
    """Named arrays from a ``.npz`` file or a PyTorch state dict (``.pt``/``.pth``)."""
    if path.endswith((".pt", ".pth")):
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        return {name: value.detach().cpu().numpy() for name, value in state.items()}
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _atomic_write(path: str, write: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as sink:
        write(sink)
    os.replace(tmp, path)


class ResontechFedAvg(FedAvg):
    """FedAvg that starts from ``initial_model`` and writes every round's global model to ``out_dir``.

    Args:
        out_dir: absolute directory for ``round-NNNNN.npz`` / ``.json`` (1-based round numbers).
        initial_model: absolute path of the model to start from; empty: an empty model (the
            clients start from their own initial weights).
        **kwargs: :class:`FedAvg`'s (``num_clients``, ``num_rounds``, ``start_round``...).
    """

    def __init__(self, *, out_dir: str, initial_model: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.out_dir = out_dir
        self.initial_model = initial_model

    def load_model(self) -> FLModel:
        if not self.initial_model:
            return FLModel(params={})
        self.info(f"starting from {self.initial_model}")
        return FLModel(params=read_params(self.initial_model))

    def save_model(self, model: FLModel) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        number = self.current_round + 1
        stem = os.path.join(self.out_dir, f"round-{number:05d}")
        params = {name: np.asarray(value) for name, value in (model.params or {}).items()}
        _atomic_write(f"{stem}.npz", lambda sink: np.savez(sink, **params))
        metrics = {
            name: float(value)
            for name, value in (model.metrics or {}).items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
        meta = model.meta or {}
        summary = {
            "round": number,
            "metrics": metrics,
            "clients": int(meta.get("nr_aggregated", 0)),
            "run_id": self.fl_ctx.get_job_id() if self.fl_ctx else "",
        }
        _atomic_write(f"{stem}.json", lambda sink: sink.write(json.dumps(summary).encode()))
        self.info(f"round {number}: global model written to {stem}.npz")
