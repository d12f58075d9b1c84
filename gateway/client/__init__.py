"""The Python SDK: a typed client for the whole API, sync (:class:`Client`) and asyncio
(:class:`AsyncClient`).

    from gateway import Client

    with Client() as rt:                      # URL and key from the environment or `resontech login`
        rt.upload("data/shard-0.zip", "jobs/mnist/shards/0.zip", progress=print)
        job = rt.submit_job({...})            # a Job: job.job_id, job.state, job.assignments...

Every call returns typed values (the API's own msgspec bodies from :mod:`schemas.api`: ``rt.job(id)``
is a :class:`~schemas.api.jobs.Job`, ``rt.jobs()`` a ``Page[Job]``) and raises :class:`ApiError`
with the API's error code and message; an answer that does not decode into its type is an
:class:`ApiError` too (``invalid_response``), never a decoding traceback. Both clients share one
description of each call, so the two cannot drift: only sending differs. Given several gateway URLs
(``Client("http://gw-1:8080,http://gw-2:8080")``), a call that one gateway cannot answer goes to the
next, with the same ``Idempotency-Key`` (:mod:`~gateway.client.gateways`). Uploads pick a single
presigned PUT or a multipart upload by size, send up to :data:`PARALLEL_PARTS` parts at once, report
progress, and abort the multipart upload on failure. :func:`follow_feed` (``client.feed()``) follows
the live feed and resumes by itself after a drop.

The modules, by role:

- :mod:`~gateway.client.errors`: :class:`ApiError` and :class:`TransferError`.
- :mod:`~gateway.client.config`: :func:`resolve`, where to connect and with which key.
- :mod:`~gateway.client.gateways`: several gateway URLs, and when a call moves on to the next.
- :mod:`~gateway.client.request`: one HTTP call as data, its answer decoded or its refusal raised.
- :mod:`~gateway.client.calls`: every API call, described once for both clients.
- :mod:`~gateway.client.transfer`: bytes between files and the object store (progress, checksums).
- :mod:`~gateway.client.sync` and :mod:`~gateway.client.aio`: :class:`Client` and :class:`AsyncClient`.
- :mod:`~gateway.client.feed`: the live feed follower.
"""

from gateway.client.aio import AsyncClient
from gateway.client.calls import Plan
from gateway.client.config import CREDENTIALS, Config, resolve
from gateway.client.errors import ApiError, TransferError
from gateway.client.feed import CURSOR_STREAMS, FATAL_CLOSES, follow_feed
from gateway.client.sync import Client
from gateway.client.transfer import CHUNK, PARALLEL_PARTS, Progress

__all__ = [
    "CHUNK",
    "CREDENTIALS",
    "CURSOR_STREAMS",
    "FATAL_CLOSES",
    "PARALLEL_PARTS",
    "ApiError",
    "AsyncClient",
    "Client",
    "Config",
    "Plan",
    "Progress",
    "TransferError",
    "follow_feed",
    "resolve",
]
