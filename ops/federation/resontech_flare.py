"""The kernel's components in the server app of every federated run, shipped as the module
``resontech_flare`` (see :mod:`core.flarejob`, which wires them into the server config).

* :class:`StartingPersistor` is the persistor the training workflow sees: it starts the run from the
  model file the kernel chose (the tenant's initial model, or the last round's global model when a
  run restarts), else from the tenant's own persistor, else from an empty model (the clients start
  from their own weights); it hands every save to the tenant's persistor, if there is one.
* :class:`RoundWriter` hears the global model of every round (``AFTER_SHAREABLE_TO_LEARNABLE``) and
  writes it to ``out_dir`` as ``round-NNNNN.npz`` (1-based rounds), with ``round-NNNNN.json``: how
  many client results the round accepted and their metrics, averaged weighted by each result's
  ``NUM_STEPS_CURRENT_ROUND`` (its sample count; 1 when absent) as FedAvg weighs the models. It learns
  them from the contributions themselves (``AFTER_CONTRIBUTION_ACCEPT``), whatever the aggregator. The
  JSON is written last, so its presence means both are complete. The federation service picks them
  up from there; nothing here talks to the kernel.

They run inside NVFlare's server job process, beside the tenant's server components if it has any,
and import nothing of ours.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import FLMetaKey
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.abstract.learnable_persistor import LearnablePersistor
from nvflare.app_common.abstract.model import ModelLearnable, ModelLearnableKey, make_model_learnable
from nvflare.app_common.abstract.model_persistor import ModelPersistor
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType


def read_params(path: str) -> dict[str, np.ndarray]:
    """Named arrays from a ``.npz`` file or a PyTorch state dict (``.pt``/``.pth``)."""
    if path.endswith((".pt", ".pth")):
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        return {name: value.detach().cpu().numpy() for name, value in state.items()}
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def as_array(value: Any) -> np.ndarray:
    """A parameter as a NumPy array (a tensor is detached and moved to the CPU first)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _atomic_write(path: str, write: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as sink:
        write(sink)
    os.replace(tmp, path)


class StartingPersistor(ModelPersistor):
    """The training workflow's persistor (see the module docstring).

    Args:
        start_model: absolute path of the model to start from (``.npz`` or ``.pt``); empty: ask
            ``inner``, else start from an empty model.
        inner: component id of the tenant's persistor; empty: none.
    """

    def __init__(self, start_model: str = "", inner: str = "") -> None:
        super().__init__()
        self.start_model = start_model
        self.inner = inner

    def _tenant(self, fl_ctx: FLContext) -> LearnablePersistor | None:
        if not self.inner:
            return None
        component = fl_ctx.get_engine().get_component(self.inner)
        if not isinstance(component, LearnablePersistor):
            raise TypeError(f"component {self.inner!r} is a {type(component).__name__}, not a persistor")
        return component

    def load_model(self, fl_ctx: FLContext) -> ModelLearnable:
        if self.start_model:
            self.log_info(fl_ctx, f"starting from {self.start_model}")
            return make_model_learnable(read_params(self.start_model), {})
        tenant = self._tenant(fl_ctx)
        if tenant is not None:
            self.log_info(fl_ctx, f"starting from what persistor {self.inner!r} loads")
            learnable: ModelLearnable = tenant.load(fl_ctx)
            return learnable
        return make_model_learnable({}, {})

    def save_model(self, model: ModelLearnable, fl_ctx: FLContext) -> None:
        tenant = self._tenant(fl_ctx)
        if tenant is not None:
            tenant.save(model, fl_ctx)

    def get_model_inventory(self, fl_ctx: FLContext) -> Any:
        tenant = self._tenant(fl_ctx)
        return tenant.get_model_inventory(fl_ctx) if isinstance(tenant, ModelPersistor) else {}

    def get_model(self, model_file: str, fl_ctx: FLContext) -> ModelLearnable:
        tenant = self._tenant(fl_ctx)
        if not isinstance(tenant, ModelPersistor):
            raise NotImplementedError("no tenant persistor to get a model from")
        model: ModelLearnable = tenant.get_model(model_file, fl_ctx)
        return model


class RoundWriter(FLComponent):
    """Writes the global model of every round to ``out_dir`` (see the module docstring).

    Args:
        out_dir: absolute directory for ``round-NNNNN.npz`` / ``.json``.
    """

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.out_dir = out_dir
        self._accepted = 0
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}

    def handle_event(self, event_type: str, fl_ctx: FLContext) -> None:
        if event_type == AppEventType.ROUND_STARTED:
            self._accepted, self._sums, self._weights = 0, {}, {}
        elif event_type == AppEventType.AFTER_CONTRIBUTION_ACCEPT:
            if fl_ctx.get_prop(AppConstants.AGGREGATION_ACCEPTED):
                self._accept(fl_ctx.get_prop(AppConstants.TRAINING_RESULT))
        elif event_type == AppEventType.AFTER_SHAREABLE_TO_LEARNABLE:
            self._write(fl_ctx)

    def _accept(self, result: Any) -> None:
        self._accepted += 1
        try:
            meta = from_shareable(result).meta or {}
        except Exception:  # not a DXO: counted, without metrics
            return
        weight = float(meta.get(FLMetaKey.NUM_STEPS_CURRENT_ROUND) or 1.0)
        for name, value in (meta.get(FLMetaKey.INITIAL_METRICS) or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._sums[name] = self._sums.get(name, 0.0) + weight * float(value)
                self._weights[name] = self._weights.get(name, 0.0) + weight

    def _write(self, fl_ctx: FLContext) -> None:
        model = fl_ctx.get_prop(AppConstants.GLOBAL_MODEL)
        current = fl_ctx.get_prop(AppConstants.CURRENT_ROUND)
        if not isinstance(model, ModelLearnable) or current is None:
            self.log_error(fl_ctx, "no global model or round in the context: round not written")
            return
        os.makedirs(self.out_dir, exist_ok=True)
        number = int(current) + 1
        stem = os.path.join(self.out_dir, f"round-{number:05d}")
        weights = model.get(ModelLearnableKey.WEIGHTS) or {}
        params = {str(name): as_array(value) for name, value in weights.items()}
        arrays: dict[str, Any] = params  # savez takes them as keyword arrays
        _atomic_write(f"{stem}.npz", lambda sink: np.savez(sink, **arrays))
        summary = {
            "round": number,
            "metrics": {name: total / self._weights[name] for name, total in self._sums.items()},
            "clients": self._accepted,
            "run_id": fl_ctx.get_job_id(),
        }
        _atomic_write(f"{stem}.json", lambda sink: sink.write(json.dumps(summary).encode()))
        self.log_info(fl_ctx, f"round {number}: global model written to {stem}.npz")
