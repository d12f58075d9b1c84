"""Objects a submission names: remembered briefly once seen, forgotten when deleted through the API."""

from __future__ import annotations

import time

from gateway.references import SeenObjects
from tests.support.gateway import Api


def test_seen_objects_expire_and_deletes_forget_their_prefixes() -> None:
    seen = SeenObjects(ttl_s=0.05, max_entries=2)
    seen.add("b", "jobs/x/shards/")
    seen.add("b", "scripts/a.py")
    assert ("b", "scripts/a.py") in seen and ("b", "jobs/x/shards/") in seen
    seen.forget("b", "jobs/x/shards/0.zip")  # the prefix may now be empty
    assert ("b", "jobs/x/shards/") not in seen
    seen.add("b", "one")
    seen.add("b", "two")  # over the bound: the oldest goes
    assert ("b", "scripts/a.py") not in seen and ("b", "two") in seen
    time.sleep(0.06)
    assert ("b", "two") not in seen


async def test_a_deleted_input_is_missing_at_the_next_submission(api: Api) -> None:
    tenant, admin = await api.tenant()
    assert api.kernel is not None
    api.kernel.s3.put_object(Bucket=f"rt-{tenant}", Key="scripts/train.py", Body=b"print(1)")
    spec = {"name": "j", "kind": "process", "command": ["true"], "inputs": ["scripts/train.py"]}
    assert (await api.request("POST", "/v1/jobs", admin, json=spec)).status_code == 201
    deleted = await api.request("DELETE", "/v1/workspace/objects", admin, params={"key": "scripts/train.py"})
    assert deleted.status_code == 204
    again = await api.request("POST", "/v1/jobs", admin, json=spec)
    assert again.status_code == 422 and "scripts/train.py" in again.json()["error"]["message"]
