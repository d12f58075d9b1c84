"""Job outputs stay read-only wherever ``output_prefix`` puts them.

A job writes its outputs to ``{output_prefix}model_out/`` and ``{output_prefix}files_out/``
(:func:`ops.federation.workspace.output_root`). Before the fix only ``model_out/``, ``files_out/``
and ``jobs/{name}/{model_out,files_out}/`` were read-only, so a job given ``output_prefix:
scripts/run-1/`` wrote its outputs where any member could upload over them. Now a ``model_out`` or
``files_out`` folder is read-only at any depth, and every prefix, honest or not, is accepted at
submit with its outputs out of members' reach."""

from __future__ import annotations

import pytest

from gateway import workspace as ws
from gateway.errors import ApiError
from ops.federation.workspace import checkpoint_key, metrics_key, output_root
from tests.support.gateway import Api, spec, submit

MEMBER_WRITABLE_PREFIXES = ["scripts/run-1/", "models/mine/", "configs/", "jobs/a/b/", "jobs/mnist/shards/"]


def output_keys(name: str, prefix: str) -> list[str]:
    """Keys a job named ``name`` with ``output_prefix`` writes (the federation's own functions)."""
    root = output_root(name, prefix)
    written = [checkpoint_key(root, 1), metrics_key(root, 1)]
    return [*written, f"{root}model_out/model.npz", f"{root}files_out/metrics.json"]


@pytest.mark.parametrize("prefix", ["", *MEMBER_WRITABLE_PREFIXES, "results/run-1/"])
def test_every_key_a_job_writes_is_read_only_whatever_its_output_prefix(prefix: str) -> None:
    for key in output_keys("mnist", prefix):
        with pytest.raises(ApiError) as refused:
            ws.check_writable(key)
        assert (refused.value.status, refused.value.code) == (403, "read_only_prefix"), key
        folder = ws.output_folder(key)
        assert folder is not None and folder in refused.value.message


def test_files_beside_output_folders_stay_writable() -> None:
    beside = ("scripts/run-1/train.py", "models/mine/config.json", "jobs/a/b/data.csv", "scripts/model_out")
    for key in beside:
        ws.check_writable(key)
        assert ws.output_folder(key) is None


async def upload(api: Api, key: str, member: str, size: int = 10) -> tuple[int, str]:
    response = await api.request("POST", "/v1/workspace/uploads", member, json={"key": key, "size": size})
    return response.status_code, response.json().get("error", {}).get("code", "")


async def test_a_job_with_a_prefix_members_write_to_gets_outputs_they_cannot_write(api: Api) -> None:
    tenant, admin = await api.tenant()
    member = await api.key(tenant, admin, "member")
    for prefix in MEMBER_WRITABLE_PREFIXES:
        name = "run-" + str(MEMBER_WRITABLE_PREFIXES.index(prefix))
        accepted = await submit(api, member, spec(name=name, output_prefix=prefix))
        assert accepted.status_code == 201, accepted.text
        assert accepted.json()["spec"]["output_prefix"] == prefix
        for key in output_keys(name, prefix):
            for size in (10, 20 * ws.MB):  # a single PUT, a multipart upload
                assert await upload(api, key, member, size) == (403, "read_only_prefix"), key
        assert await upload(api, f"{output_root(name, prefix)}notes.txt", member) == (201, "")  # beside them


async def test_honest_prefixes_still_work(api: Api) -> None:
    tenant, admin = await api.tenant()
    member = await api.key(tenant, admin, "member")
    for name, prefix in (("default", ""), ("own-folder", "jobs/own-folder/"), ("results", "results/run-1/")):
        accepted = await submit(api, member, spec(name=name, output_prefix=prefix))
        assert accepted.status_code == 201, accepted.text
        assert accepted.json()["spec"]["output_prefix"] == prefix
    assert await upload(api, "scripts/run-1/train.py", member) == (201, "")
    assert await upload(api, "jobs/own-folder/shards/0.zip", member) == (201, "")
