"""The synchronous client, :class:`Client`: every call of :class:`~gateway.client.calls._Calls` sent
with ``httpx.Client`` (to the next gateway when one cannot answer), uploads with parts in a thread
pool, downloads streamed to a file, and the live feed followed by an event loop in a background
thread."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import httpx

from gateway.client.calls import _Calls
from gateway.client.config import resolve
from gateway.client.feed import _feed_in_thread, follow_feed
from gateway.client.gateways import Gateways
from gateway.client.request import _Req, _unreachable
from gateway.client.transfer import (
    CHUNK,
    PARALLEL_PARTS,
    Progress,
    _chunks,
    _Meter,
    _sha256,
    _stored,
    _target,
    _verify,
)
from schemas.api.feed import FeedMessage
from schemas.api.workspace import MultipartUpload, PartUrl, SingleUpload, WorkspaceObject

T = TypeVar("T")


class Client(_Calls):
    """The synchronous client. ``Client(url, key)``; both default as :func:`resolve` says.

    Args:
        url: the gateway's URL, or several (comma-separated, or a sequence): a call that one cannot
            answer goes to the next (see :mod:`gateway.client.gateways`).
        key: the API key.
        timeout: seconds for each attempt's connection, sending and waiting for the answer.
        retry_s: how long a call keeps trying the gateways; default ``RESONTECH_GATEWAY_RETRY_S``,
            else 30 s with several URLs and one attempt with one.

    Raises:
        ConfigError: a malformed URL or retry deadline.
    """

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        key: str | None = None,
        *,
        timeout: float = 30.0,
        retry_s: float | None = None,
    ) -> None:
        self.config = resolve(url, key, retry_s=retry_s)
        self.gateways = Gateways(self.config.urls)
        headers = {"Authorization": f"Bearer {self.config.key}"} if self.config.key else {}
        self.http = httpx.Client(base_url=self.config.urls[0], headers=headers, timeout=timeout)
        self._store = httpx.Client(timeout=httpx.Timeout(timeout, read=300.0))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()
        self._store.close()

    def _send(self, req: _Req[T]) -> T:
        attempts = self.gateways.attempts(self.config.retry_s)
        while True:
            try:
                response = self.http.send(req.request(self.http, attempts.url))
            except httpx.TransportError as exc:
                wait = attempts.after_error(exc, req.may_replay)
                if wait is None:
                    raise _unreachable(attempts, req, exc) from None
            else:
                wait = attempts.after_answer(response.status_code, req.may_replay)
                if wait is None:
                    return req.answer(response)
            time.sleep(wait)

    def upload(
        self,
        path: str | os.PathLike[str],
        key: str,
        *,
        content_type: str | None = None,
        progress: Progress | None = None,
        checksum: bool = True,
    ) -> WorkspaceObject:
        """Upload a local file to ``key`` in the workspace (multipart from 10 MB, 5 parts at once;
        a failed multipart upload is aborted). Returns the stored object."""
        source = Path(path)
        size = source.stat().st_size
        sha = _sha256(source) if checksum else None
        plan = self._plan_upload(key, size, content_type, sha)
        meter = _Meter(size, progress)
        if isinstance(plan, SingleUpload):
            headers = {**plan.headers, "Content-Length": str(size)}
            response = self._store.put(plan.url, content=_chunks(source, 0, size, meter), headers=headers)
            etag = _stored(response, f"upload of {key}")
            return WorkspaceObject(key=key, size=size, etag=etag, last_modified="")
        try:
            etags = self._upload_parts(source, plan, meter)
            return self._complete(plan.upload_id, key, etags)
        except BaseException:
            with contextlib.suppress(Exception):
                self._abort(plan.upload_id, key)
            raise

    def _upload_parts(self, source: Path, plan: MultipartUpload, meter: _Meter) -> dict[int, str]:
        etags: dict[int, str] = {}
        batch: list[PartUrl] = list(plan.parts)
        next_part = plan.next_part
        with concurrent.futures.ThreadPoolExecutor(PARALLEL_PARTS) as pool:
            while batch:
                futures = {
                    part.part_number: pool.submit(self._put_part, source, plan, part, meter) for part in batch
                }
                for number, future in futures.items():
                    etags[number] = future.result()
                batch = []
                if next_part is not None:
                    more = self._part_urls(plan.upload_id, plan.key, plan.size, next_part, 20)
                    batch, next_part = list(more.parts), more.next_part
        return etags

    def feed(
        self,
        *,
        job: str | None = None,
        endpoint: str | None = None,
        kind: str | None = None,
        after: str | None = None,
        tenant: str | None = None,
    ) -> Iterator[FeedMessage]:
        """``for event in client.feed(job=...)``: the live feed as :class:`FeedMessage` events,
        resuming by itself (the WebSocket runs on an event loop in a background thread; closing the
        generator stops it). The arguments are :func:`follow_feed`'s."""
        return _feed_in_thread(
            lambda: follow_feed(
                self.gateways.rotated(),
                self.config.key,
                job=job,
                endpoint=endpoint,
                kind=kind,
                after=after,
                tenant=tenant,
            )
        )

    def _put_part(self, source: Path, plan: MultipartUpload, part: PartUrl, meter: _Meter) -> str:
        offset = (part.part_number - 1) * plan.part_size
        body = _chunks(source, offset, part.size, meter)
        response = self._store.put(part.url, content=body, headers={"Content-Length": str(part.size)})
        return _stored(response, f"part {part.part_number} of {plan.key}")

    def download(self, key: str, dest: str | os.PathLike[str], *, progress: Progress | None = None) -> Path:
        """Download ``key`` to ``dest`` (a file path, or a directory to put it in); checks the size
        and, when the object has one, its SHA-256."""
        info = self.download_url(key)
        target = _target(Path(dest), key)
        partial = target.with_name(target.name + ".part")
        meter = _Meter(info.size, progress)
        digest = hashlib.sha256()
        with self._store.stream("GET", info.url) as response:
            if response.status_code >= 300:
                response.read()
                _stored(response, f"download of {key}")
            with partial.open("wb") as out:
                for block in response.iter_bytes(CHUNK):
                    out.write(block)
                    digest.update(block)
                    meter.add(len(block))
        _verify(partial, info, digest.hexdigest())
        partial.replace(target)
        return target
