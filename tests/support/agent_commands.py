"""Commands to an agent as a unit test writes them: :func:`cmd` builds a :class:`StartWork` with defaults
(tenant ``acme``, work ``j1``, assignment ``a1``, slot 0, epoch 1, the ``process`` runtime running
``true``)."""

from __future__ import annotations

from typing import Any

from schemas.commands import StartWork, WorkSpec


def cmd(
    tenant: str = "acme", gpus: int = 0, price: int = 0, options: dict[str, str] | None = None, **kw: Any
) -> StartWork:
    return StartWork(
        tenant=tenant,
        work_id=kw.pop("work_id", "j1"),
        work_kind=kw.pop("work_kind", "job"),
        assignment_id=kw.pop("assignment_id", "a1"),
        slot=kw.pop("slot", 0),
        epoch=kw.pop("epoch", 1),
        spec=WorkSpec(runtime="process", command=["true"], gpus=gpus, options=options or {}, **kw),
        price_micros_per_gpu_hour=price,
    )
