"""The asyncio client, :class:`AsyncClient`: the same calls as :class:`~gateway.client.Client`, each
awaitable, sent with ``httpx.AsyncClient`` (to the next gateway when one cannot answer); file reads
run in threads so that the event loop never blocks on the disk."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TypeVar

import httpx

from gateway.client.calls import _Calls
from gateway.client.config import resolve
from gateway.client.feed import follow_feed
from gateway.client.gateways import Gateways
from gateway.client.request import _Req, _unreachable
from gateway.client.transfer import (
    CHUNK,
    PARALLEL_PARTS,
    Progress,
    _Meter,
    _read,
    _sha256,
    _stored,
    _target,
    _verify,
)
from schemas.api.feed import FeedMessage
from schemas.api.workspace import MultipartUpload, PartUrl, SingleUpload, WorkspaceObject

T = TypeVar("T")


class AsyncClient(_Calls):
    """The asyncio client: the same calls as :class:`Client`, each awaitable; the same arguments."""

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
        self.http = httpx.AsyncClient(base_url=self.config.urls[0], headers=headers, timeout=timeout)
        self._store = httpx.AsyncClient(timeout=httpx.Timeout(timeout, read=300.0))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()
        await self._store.aclose()

    async def _send(self, req: _Req[T]) -> T:
        attempts = self.gateways.attempts(self.config.retry_s)
        while True:
            try:
                response = await self.http.send(req.request(self.http, attempts.url))
            except httpx.TransportError as exc:
                wait = attempts.after_error(exc, req.may_replay)
                if wait is None:
                    raise _unreachable(attempts, req, exc) from None
            else:
                wait = attempts.after_answer(response.status_code, req.may_replay)
                if wait is None:
                    return req.answer(response)
            await asyncio.sleep(wait)

    async def upload(
        self,
        path: str | os.PathLike[str],
        key: str,
        *,
        content_type: str | None = None,
        progress: Progress | None = None,
        checksum: bool = True,
    ) -> WorkspaceObject:
        """As :meth:`Client.upload`, without blocking the event loop (file reads run in threads)."""
        source = Path(path)
        size = (await asyncio.to_thread(source.stat)).st_size
        sha = await asyncio.to_thread(_sha256, source) if checksum else None
        plan = await self._plan_upload(key, size, content_type, sha)
        meter = _Meter(size, progress)
        if isinstance(plan, SingleUpload):
            data = await asyncio.to_thread(_read, source, 0, size, meter)
            response = await self._store.put(plan.url, content=data, headers=plan.headers)
            return WorkspaceObject(
                key=key, size=size, etag=_stored(response, f"upload of {key}"), last_modified=""
            )
        try:
            etags: dict[int, str] = {}
            gate = asyncio.Semaphore(PARALLEL_PARTS)
            batch, next_part = list(plan.parts), plan.next_part
            while batch:
                tags = await asyncio.gather(
                    *(self._put_part(source, plan, part, meter, gate) for part in batch)
                )
                etags.update(zip((p.part_number for p in batch), tags, strict=True))
                batch = []
                if next_part is not None:
                    more = await self._part_urls(plan.upload_id, plan.key, plan.size, next_part, 20)
                    batch, next_part = list(more.parts), more.next_part
            return await self._complete(plan.upload_id, key, etags)
        except BaseException:
            with contextlib.suppress(Exception):
                await self._abort(plan.upload_id, key)
            raise

    def feed(
        self,
        *,
        job: str | None = None,
        endpoint: str | None = None,
        kind: str | None = None,
        after: str | None = None,
        tenant: str | None = None,
    ) -> AsyncIterator[FeedMessage]:
        """``async for event in client.feed(job=...)``: the live feed as :class:`FeedMessage` events,
        resuming by itself. The arguments are :func:`follow_feed`'s."""
        return follow_feed(
            self.gateways.rotated(),
            self.config.key,
            job=job,
            endpoint=endpoint,
            kind=kind,
            after=after,
            tenant=tenant,
        )

    async def _put_part(
        self, source: Path, plan: MultipartUpload, part: PartUrl, meter: _Meter, gate: asyncio.Semaphore
    ) -> str:
        async with gate:
            offset = (part.part_number - 1) * plan.part_size
            data = await asyncio.to_thread(_read, source, offset, part.size, meter)
            response = await self._store.put(part.url, content=data)
            return _stored(response, f"part {part.part_number} of {plan.key}")

    async def download(
        self, key: str, dest: str | os.PathLike[str], *, progress: Progress | None = None
    ) -> Path:
        """As :meth:`Client.download`."""
        info = await self.download_url(key)
        target = await asyncio.to_thread(_target, Path(dest), key)
        partial = target.with_name(target.name + ".part")
        meter = _Meter(info.size, progress)
        digest = hashlib.sha256()
        async with self._store.stream("GET", info.url) as response:
            if response.status_code >= 300:
                await response.aread()
                _stored(response, f"download of {key}")
            with partial.open("wb") as out:
                async for block in response.aiter_bytes(CHUNK):
                    out.write(block)
                    digest.update(block)
                    meter.add(len(block))
        _verify(partial, info, digest.hexdigest())
        partial.replace(target)
        return target
