"""The Python SDK: a typed client for the whole API, sync (:class:`Client`) and asyncio
(:class:`AsyncClient`).

    from gateway import Client

    with Client() as rt:                      # URL and key from the environment or `resontech login`
        rt.upload("data/shard-0.zip", "jobs/mnist/shards/0.zip", progress=print)
        job = rt.submit_job({...})

Every call returns typed values (the API's own msgspec bodies from :mod:`schemas.api`) and raises
:class:`ApiError` with the API's error code and message. Both clients share one description of each
call (:class:`_Calls`): a method builds the request and names the type to decode into; only sending
differs. Uploads pick a single presigned PUT or a multipart upload by size, send up to
:data:`PARALLEL_PARTS` parts at once, report progress, and abort the multipart upload on failure.

One module on purpose: it is the SDK users import (``from gateway import Client``), and the sync
and async clients share every call description and helper here; split, the two halves would drift.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
import msgspec

from schemas.api.billing import Invoice, InvoiceSummary, Payouts, Usage
from schemas.api.common import Me, Page
from schemas.api.endpoints import Endpoint
from schemas.api.jobs import Job, JobEventItem
from schemas.api.tenants import KeyInfo, NewKey, Tenant, TenantCreatedBody
from schemas.api.workers import Worker
from schemas.api.workspace import Download, MultipartUpload, PartUrl, PartUrls, SingleUpload, WorkspaceObject

T = TypeVar("T")
PARALLEL_PARTS = 5
"""Multipart upload parts in flight at once."""
CHUNK = 1 << 20
"""Bytes per read while streaming a PUT body (progress is reported per chunk)."""
CREDENTIALS = (
    Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "resontech" / "credentials.json"
)
"""Where `resontech login` keeps the gateway URL and key (mode 0600)."""
Progress = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)``."""


class ApiError(Exception):
    """The API refused a request: ``status``, the stable ``code``, a ``message`` that says what to fix."""

    def __init__(self, status: int, code: str, message: str, request_id: str = "") -> None:
        super().__init__(f"{message} ({code}, HTTP {status})")
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id


class TransferError(ApiError):
    """The object store refused or dropped an upload or download."""


@dataclass(frozen=True)
class Config:
    url: str
    key: str | None


def resolve(url: str | None = None, key: str | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Where to connect and with which key: arguments, then ``RESONTECH_GATEWAY_URL`` /
    ``RESONTECH_API_KEY``, then the file `resontech login` wrote."""
    env = os.environ if env is None else env
    stored: dict[str, str] = {}
    if CREDENTIALS.exists():
        with contextlib.suppress(ValueError, OSError):
            stored = json.loads(CREDENTIALS.read_text())
    url = url or env.get("RESONTECH_GATEWAY_URL") or stored.get("url") or "http://127.0.0.1:8080"
    key = key or env.get("RESONTECH_API_KEY") or stored.get("key")
    return Config(url=url.rstrip("/"), key=key)


@dataclass(frozen=True)
class _Req(Generic[T]):
    method: str
    path: str
    into: Any = None
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] | None = None


def _error(response: httpx.Response) -> ApiError:
    request_id = response.headers.get("x-request-id", "")
    try:
        detail = response.json()["error"]
        return ApiError(response.status_code, detail["code"], detail["message"], request_id)
    except (ValueError, KeyError, TypeError):
        text = (
            response.text.strip().splitlines()[0][:200] if response.text.strip() else response.reason_phrase
        )
        return ApiError(response.status_code, "http_error", text, request_id)


def _decode(response: httpx.Response, into: Any) -> Any:
    if response.status_code >= 400:
        raise _error(response)
    if into is None or response.status_code == 204:
        return None
    return msgspec.json.decode(response.content, type=into)


def _body(value: Any) -> Any:
    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else value


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class _Calls:
    """Every API call, described once; :meth:`_send` (sync or async) runs it."""

    def _send(self, req: _Req[Any]) -> Any:
        raise NotImplementedError

    # -- identity and tenancy --------------------------------------------------------------------

    def me(self) -> Any:
        """Who the key is (:class:`schemas.api.common.Me`)."""
        return self._send(_Req("GET", "/v1/me", Me))

    def create_tenant(self, tenant: str, display_name: str, plan: str = "payg") -> Any:
        """Operator: create a tenant; the result carries its first admin key (shown once)."""
        body = {"tenant": tenant, "display_name": display_name, "plan": plan}
        return self._send(_Req("POST", "/v1/tenants", TenantCreatedBody, json=body))

    def tenants(self) -> Any:
        return self._send(_Req("GET", "/v1/tenants", list[Tenant]))

    def tenant(self, tenant: str) -> Any:
        return self._send(_Req("GET", f"/v1/tenants/{tenant}", Tenant))

    def keys(self, tenant: str) -> Any:
        return self._send(_Req("GET", f"/v1/tenants/{tenant}/keys", list[KeyInfo]))

    def issue_key(self, tenant: str, role: str = "member", label: str = "") -> Any:
        return self._send(
            _Req("POST", f"/v1/tenants/{tenant}/keys", NewKey, json={"role": role, "label": label})
        )

    def revoke_key(self, tenant: str, key_id: str) -> Any:
        return self._send(_Req("DELETE", f"/v1/tenants/{tenant}/keys/{key_id}"))

    def set_quota(self, tenant: str, pool: str, gpus: int | None) -> Any:
        return self._send(_Req("PUT", f"/v1/tenants/{tenant}/quotas/{pool}", Tenant, json={"gpus": gpus}))

    # -- workspace -------------------------------------------------------------------------------

    def objects(self, prefix: str = "", *, limit: int = 100, after: str | None = None) -> Any:
        """One page of the workspace listing (``.items``, ``.next``)."""
        params = _params(prefix=prefix, limit=limit, after=after)
        return self._send(_Req("GET", "/v1/workspace/objects", Page[WorkspaceObject], params=params))

    def download_url(self, key: str) -> Any:
        """A presigned GET of ``key``, valid one hour (:class:`schemas.api.workspace.Download`)."""
        return self._send(_Req("GET", "/v1/workspace/download", Download, params={"key": key}))

    def delete_object(self, key: str) -> Any:
        return self._send(_Req("DELETE", "/v1/workspace/objects", params={"key": key}))

    # -- jobs ------------------------------------------------------------------------------------

    def submit_job(self, spec: Mapping[str, Any], *, idempotency_key: str | None = None) -> Any:
        """Submit a job spec (the fields of ``POST /v1/jobs``); returns the :class:`Job`. With an
        ``idempotency_key``, a retried submission is stored once and returns the same job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self._send(_Req("POST", "/v1/jobs", Job, json=dict(spec), headers=headers))

    def jobs(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        name_prefix: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Any:
        """One page of jobs, newest first (``.items``, ``.next``)."""
        params = _params(state=state, kind=kind, name_prefix=name_prefix, limit=limit, after=after)
        return self._send(_Req("GET", "/v1/jobs", Page[Job], params=params))

    def job(self, job_id: str, *, tenant: str | None = None) -> Any:
        """One job, with its assignments, progress and ``why`` (the operator names the tenant)."""
        return self._send(_Req("GET", f"/v1/jobs/{job_id}", Job, params=_params(tenant=tenant)))

    def cancel_job(self, job_id: str, *, tenant: str | None = None) -> Any:
        return self._send(_Req("POST", f"/v1/jobs/{job_id}/cancel", Job, params=_params(tenant=tenant)))

    def job_events(self, job_id: str, *, after: str | None = None, limit: int = 100) -> Any:
        params = _params(after=after, limit=limit)
        return self._send(_Req("GET", f"/v1/jobs/{job_id}/events", Page[JobEventItem], params=params))

    # -- endpoints -------------------------------------------------------------------------------

    def deploy(self, spec: Mapping[str, Any]) -> Any:
        """Deploy an endpoint (the fields of ``POST /v1/endpoints``)."""
        return self._send(_Req("POST", "/v1/endpoints", Endpoint, json=dict(spec)))

    def endpoints(self, *, state: str | None = None, limit: int = 50, after: str | None = None) -> Any:
        params = _params(state=state, limit=limit, after=after)
        return self._send(_Req("GET", "/v1/endpoints", Page[Endpoint], params=params))

    def endpoint(self, endpoint_id: str, *, tenant: str | None = None) -> Any:
        """One endpoint, with its replicas and its traffic (the operator names the tenant)."""
        return self._send(
            _Req("GET", f"/v1/endpoints/{endpoint_id}", Endpoint, params=_params(tenant=tenant))
        )

    def scale(
        self, endpoint_id: str, *, min_replicas: int | None = None, max_replicas: int | None = None
    ) -> Any:
        body = _params(min_replicas=min_replicas, max_replicas=max_replicas)
        return self._send(_Req("PUT", f"/v1/endpoints/{endpoint_id}/scale", Endpoint, json=body))

    def delete_endpoint(self, endpoint_id: str) -> Any:
        return self._send(_Req("DELETE", f"/v1/endpoints/{endpoint_id}"))

    # -- workers and billing ---------------------------------------------------------------------

    def workers(self, *, state: str | None = None, limit: int = 50, after: str | None = None) -> Any:
        """Provider: its own nodes (operator: all)."""
        params = _params(state=state, limit=limit, after=after)
        return self._send(_Req("GET", "/v1/workers", Page[Worker], params=params))

    def worker(self, worker_id: str) -> Any:
        return self._send(_Req("GET", f"/v1/workers/{worker_id}", Worker))

    def usage(self, period: str | None = None) -> Any:
        return self._send(_Req("GET", "/v1/billing/usage", Usage, params=_params(period=period)))

    def invoices(self) -> Any:
        return self._send(_Req("GET", "/v1/billing/invoices", list[InvoiceSummary]))

    def invoice(self, period: str) -> Any:
        return self._send(_Req("GET", f"/v1/billing/invoices/{period}", Invoice))

    def payouts(self, period: str | None = None) -> Any:
        return self._send(_Req("GET", "/v1/billing/payouts", Payouts, params=_params(period=period)))

    def _plan_upload(self, key: str, size: int, content_type: str | None, sha256: str | None) -> Any:
        body = _params(key=key, size=size, content_type=content_type, sha256=sha256)
        return self._send(_Req("POST", "/v1/workspace/uploads", SingleUpload | MultipartUpload, json=body))

    def _part_urls(self, upload_id: str, key: str, size: int, first: int, count: int) -> Any:
        body = {"key": key, "size": size, "first": first, "count": count}
        return self._send(_Req("POST", f"/v1/workspace/uploads/{upload_id}/parts", PartUrls, json=body))

    def _complete(self, upload_id: str, key: str, etags: dict[int, str]) -> Any:
        parts = [{"part_number": n, "etag": etags[n]} for n in sorted(etags)]
        body = {"key": key, "parts": parts}
        return self._send(
            _Req("POST", f"/v1/workspace/uploads/{upload_id}/complete", WorkspaceObject, json=body)
        )

    def _abort(self, upload_id: str, key: str) -> Any:
        return self._send(_Req("DELETE", f"/v1/workspace/uploads/{upload_id}", params={"key": key}))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


class _Meter:
    """Thread-safe byte counter that calls the progress callback."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total = total
        self.done = 0
        self.progress = progress
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            done = self.done
        if self.progress is not None:
            self.progress(done, self.total)


def _chunks(path: Path, offset: int, size: int, meter: _Meter) -> Iterator[bytes]:
    with path.open("rb") as f:
        f.seek(offset)
        left = size
        while left > 0:
            block = f.read(min(CHUNK, left))
            if not block:
                raise TransferError(0, "file_changed", f"{path} shrank while it was being uploaded")
            left -= len(block)
            meter.add(len(block))
            yield block


def _stored(response: httpx.Response, what: str) -> str:
    if response.status_code >= 300:
        text = response.text.strip()[:300]
        raise TransferError(
            response.status_code, "object_store_refused", f"{what}: {text or response.reason_phrase}"
        )
    return response.headers.get("etag", "").strip('"')


class Client(_Calls):
    """The synchronous client. ``Client(url, key)``; both default as :func:`resolve` says."""

    def __init__(self, url: str | None = None, key: str | None = None, *, timeout: float = 30.0) -> None:
        self.config = resolve(url, key)
        headers = {"Authorization": f"Bearer {self.config.key}"} if self.config.key else {}
        self.http = httpx.Client(base_url=self.config.url, headers=headers, timeout=timeout)
        self._store = httpx.Client(timeout=httpx.Timeout(timeout, read=300.0))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()
        self._store.close()

    def _send(self, req: _Req[Any]) -> Any:
        try:
            response = self.http.request(
                req.method, req.path, json=_body(req.json), params=req.params, headers=req.headers
            )
        except httpx.TransportError as exc:
            raise ApiError(
                0, "unreachable", f"cannot reach the gateway at {self.config.url}: {exc}"
            ) from None
        return _decode(response, req.into)

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
            result: WorkspaceObject = self._complete(plan.upload_id, key, etags)
            return result
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
                    more: PartUrls = self._part_urls(plan.upload_id, plan.key, plan.size, next_part, 20)
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
    ) -> Iterator[dict[str, Any]]:
        """``for event in client.feed(job=...)``: the live feed, resuming by itself (the WebSocket
        runs on an event loop in a background thread; closing the generator stops it)."""
        import queue

        items: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1000)
        stop = threading.Event()

        async def pump() -> None:
            try:
                async for message in follow_feed(
                    self.config.url,
                    self.config.key,
                    job=job,
                    endpoint=endpoint,
                    kind=kind,
                    after=after,
                    tenant=tenant,
                ):
                    while not stop.is_set():
                        try:
                            items.put(("event", message), timeout=0.2)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
            except Exception as exc:
                items.put(("error", exc))

        def run() -> None:
            loop = asyncio.new_event_loop()
            task = loop.create_task(pump())

            def watch_stop() -> None:
                if stop.is_set():
                    task.cancel()
                else:
                    loop.call_later(0.2, watch_stop)

            loop.call_soon(watch_stop)
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(task)
            loop.close()

        thread = threading.Thread(target=run, name="resontech-feed", daemon=True)
        thread.start()
        try:
            while True:
                kind_, value = items.get()
                if kind_ == "error":
                    raise value
                yield value
        finally:
            stop.set()
            thread.join(5)

    def _put_part(self, source: Path, plan: MultipartUpload, part: PartUrl, meter: _Meter) -> str:
        offset = (part.part_number - 1) * plan.part_size
        body = _chunks(source, offset, part.size, meter)
        response = self._store.put(part.url, content=body, headers={"Content-Length": str(part.size)})
        return _stored(response, f"part {part.part_number} of {plan.key}")

    def download(self, key: str, dest: str | os.PathLike[str], *, progress: Progress | None = None) -> Path:
        """Download ``key`` to ``dest`` (a file path, or a directory to put it in); checks the size
        and, when the object has one, its SHA-256."""
        info: Download = self.download_url(key)
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


def _target(dest: Path, key: str) -> Path:
    """The file a download of ``key`` writes: ``dest``, or the key's name inside ``dest`` if a dir."""
    return dest / Path(key).name if dest.is_dir() else dest


def _verify(partial: Path, info: Download, sha256: str) -> None:
    got = partial.stat().st_size
    if got != info.size:
        partial.unlink(missing_ok=True)
        raise TransferError(0, "incomplete_download", f"{info.key}: got {got} of {info.size} bytes")
    if info.sha256 and info.sha256 != sha256:
        partial.unlink(missing_ok=True)
        raise TransferError(0, "checksum_mismatch", f"{info.key}: SHA-256 differs from the uploaded file's")


class AsyncClient(_Calls):
    """The asyncio client: the same calls as :class:`Client`, each awaitable."""

    def __init__(self, url: str | None = None, key: str | None = None, *, timeout: float = 30.0) -> None:
        self.config = resolve(url, key)
        headers = {"Authorization": f"Bearer {self.config.key}"} if self.config.key else {}
        self.http = httpx.AsyncClient(base_url=self.config.url, headers=headers, timeout=timeout)
        self._store = httpx.AsyncClient(timeout=httpx.Timeout(timeout, read=300.0))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()
        await self._store.aclose()

    def _send(self, req: _Req[Any]) -> Awaitable[Any]:
        async def send() -> Any:
            try:
                response = await self.http.request(
                    req.method, req.path, json=_body(req.json), params=req.params
                )
            except httpx.TransportError as exc:
                raise ApiError(
                    0, "unreachable", f"cannot reach the gateway at {self.config.url}: {exc}"
                ) from None
            return _decode(response, req.into)

        return send()

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
                    more: PartUrls = await self._part_urls(plan.upload_id, plan.key, plan.size, next_part, 20)
                    batch, next_part = list(more.parts), more.next_part
            result: WorkspaceObject = await self._complete(plan.upload_id, key, etags)
            return result
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
    ) -> AsyncIterator[dict[str, Any]]:
        """``async for event in client.feed(job=...)``: the live feed, resuming by itself."""
        return follow_feed(
            self.config.url, self.config.key, job=job, endpoint=endpoint, kind=kind, after=after
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
        info: Download = await self.download_url(key)
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


# -- the live feed ---------------------------------------------------------------------------------

FATAL_CLOSES = {4400: "bad_request", 4401: "unauthenticated", 4403: "forbidden", 4404: "not_found"}
"""Close codes after which reconnecting cannot help (4000 + the HTTP status)."""
CURSOR_STREAMS = {"JOBS": "jobs", "ENDPOINTS": "endpoints"}


class _Cursor:
    """The feed position per stream, advanced by every event and every ready/ping message."""

    def __init__(self, after: str | None) -> None:
        self.positions: dict[str, int] = {}
        if after:
            self.take(after)

    def take(self, cursor: str) -> None:
        for part in cursor.split(","):
            name, _, seq = part.partition(":")
            if seq.isdigit():
                self.positions[name] = max(self.positions.get(name, 0), int(seq))

    def see(self, message: Mapping[str, Any]) -> None:
        name = CURSOR_STREAMS.get(str(message.get("stream")))
        if name and isinstance(message.get("seq"), int):
            self.positions[name] = max(self.positions.get(name, 0), message["seq"])
        if isinstance(message.get("cursor"), str):
            self.take(message["cursor"])

    def __str__(self) -> str:
        return ",".join(f"{name}:{seq}" for name, seq in sorted(self.positions.items()))


async def follow_feed(
    url: str,
    key: str | None,
    *,
    job: str | None = None,
    endpoint: str | None = None,
    kind: str | None = None,
    after: str | None = None,
    tenant: str | None = None,
    max_backoff_s: float = 10.0,
) -> AsyncIterator[dict[str, Any]]:
    """The caller's events from ``/v1/feed`` as dicts, forever: after a drop (a restart, a slow
    consumer closed with 4008) it reconnects with its cursor, so nothing is missed or repeated.
    Control messages (``feed.ready``, ``feed.ping``, ``feed.error``) only move the cursor.

    Raises:
        ApiError: the gateway refused the key, the filters or the tenant (4400/4401/4403/4404).
    """
    from urllib.parse import urlencode

    from gateway.wsclient import ConnectionClosed, HandshakeError, connect

    cursor = _Cursor(after)
    backoff = 0.2
    ws_base = "ws" + url.removeprefix("http")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    while True:
        query = urlencode(
            _params(job=job, endpoint=endpoint, kind=kind, tenant=tenant, after=str(cursor) or None)
        )
        try:
            ws = await connect(f"{ws_base}/v1/feed" + (f"?{query}" if query else ""), headers)
        except HandshakeError as exc:
            if 400 <= exc.status < 500:
                raise ApiError(exc.status, "feed_refused", str(exc)) from None
            await asyncio.sleep(backoff)
            backoff = min(max_backoff_s, backoff * 2)
            continue
        except OSError:
            await asyncio.sleep(backoff)
            backoff = min(max_backoff_s, backoff * 2)
            continue
        error: dict[str, Any] = {}
        try:
            async for raw in ws:
                message = json.loads(raw)
                cursor.see(message)
                backoff = 0.2
                if message.get("kind") == "feed.error":
                    error = message.get("error") or {}
                elif not str(message.get("kind", "")).startswith("feed."):
                    yield message
        except ConnectionClosed as closed:
            if closed.code in FATAL_CLOSES:
                code = error.get("code") or FATAL_CLOSES[closed.code]
                raise ApiError(closed.code - 4000, code, error.get("message") or closed.reason) from None
        except OSError:
            pass
        finally:
            with contextlib.suppress(Exception):
                await ws.close()
        await asyncio.sleep(backoff)
        backoff = min(max_backoff_s, backoff * 2)


def _read(path: Path, offset: int, size: int, meter: _Meter) -> bytes:
    """``size`` bytes of ``path`` from ``offset`` (a part is at most 50 MB: fine to hold)."""
    return b"".join(_chunks(path, offset, size, meter))
