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
description of each call (a :class:`_Call` in :class:`_Calls`): a method builds the request and
names the decoder of its answer; only sending differs, and the descriptor types each method for the
client it is read from (``T`` on :class:`Client`, an awaitable of ``T`` on :class:`AsyncClient`).
Uploads pick a single presigned PUT or a multipart upload by size, send up to
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
from typing import Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

import httpx
import msgspec

from core.errors import ResontechError
from schemas.api.billing import Invoice, InvoiceSummary, Payouts, Usage
from schemas.api.common import ErrorBody, Me, Page
from schemas.api.endpoints import DeployEndpoint, Endpoint, EndpointStateName
from schemas.api.feed import FeedError, FeedMessage
from schemas.api.jobs import Job, JobEventItem, JobStateName, Kind, SubmitJob
from schemas.api.tenants import (
    CreateTenant,
    IssueKey,
    KeyInfo,
    NewKey,
    Role,
    SetQuota,
    Tenant,
    TenantCreatedBody,
)
from schemas.api.workers import Worker, WorkerStateName
from schemas.api.workspace import (
    CompletedPart,
    CompleteUpload,
    CreateUpload,
    Download,
    MultipartUpload,
    PartsRequest,
    PartUrl,
    PartUrls,
    SingleUpload,
    WorkspaceObject,
)

T = TypeVar("T")
P = ParamSpec("P")
Plan = Literal["payg", "managed", "private"]
"""A tenant's plan (the values :class:`schemas.api.tenants.CreateTenant` accepts)."""
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


class ApiError(ResontechError):
    """The API refused a request: ``status``, the stable ``code``, a ``message`` that says what to fix.

    Besides the API's own codes: ``unreachable`` (status 0: no connection to the gateway),
    ``http_error`` (an error answer without the API's error body, e.g. from a proxy),
    ``invalid_response`` (an answer that does not decode into the type the API promises) and
    ``accepted`` (status 202: the change is stored but the gateway could not show it yet; read it
    back shortly instead of repeating the request).
    """

    def __init__(self, status: int, code: str, message: str, request_id: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.message} ({self.code}, HTTP {self.status})"


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


# -- how a call is described, sent and decoded ------------------------------------------------------

_ENCODE = msgspec.json.Encoder().encode
_ERROR_BODY = msgspec.json.Decoder(ErrorBody).decode
_FEED_MESSAGE = msgspec.json.Decoder(FeedMessage).decode
# One typed decoder per answer type (msgspec.json.Decoder(T).decode is a ``bytes -> T``).
_ME = msgspec.json.Decoder(Me).decode
_TENANT = msgspec.json.Decoder(Tenant).decode
_TENANTS = msgspec.json.Decoder(list[Tenant]).decode
_TENANT_CREATED = msgspec.json.Decoder(TenantCreatedBody).decode
_KEYS = msgspec.json.Decoder(list[KeyInfo]).decode
_NEW_KEY = msgspec.json.Decoder(NewKey).decode
_OBJECT = msgspec.json.Decoder(WorkspaceObject).decode
_OBJECTS = msgspec.json.Decoder(Page[WorkspaceObject]).decode
_DOWNLOAD = msgspec.json.Decoder(Download).decode
_UPLOAD_PLAN: Callable[[bytes], SingleUpload | MultipartUpload] = msgspec.json.Decoder(
    SingleUpload | MultipartUpload  # a union: mypy needs the annotation to know the decoded type
).decode
_PART_URLS = msgspec.json.Decoder(PartUrls).decode
_JOB = msgspec.json.Decoder(Job).decode
_JOBS = msgspec.json.Decoder(Page[Job]).decode
_JOB_EVENTS = msgspec.json.Decoder(Page[JobEventItem]).decode
_ENDPOINT = msgspec.json.Decoder(Endpoint).decode
_ENDPOINTS = msgspec.json.Decoder(Page[Endpoint]).decode
_WORKER = msgspec.json.Decoder(Worker).decode
_WORKERS = msgspec.json.Decoder(Page[Worker]).decode
_USAGE = msgspec.json.Decoder(Usage).decode
_INVOICE = msgspec.json.Decoder(Invoice).decode
_INVOICES = msgspec.json.Decoder(list[InvoiceSummary]).decode
_PAYOUTS = msgspec.json.Decoder(Payouts).decode


class _Accepted(msgspec.Struct, frozen=True):
    """The body of a 202 that has no resource to show (``gateway.errors.accepted_response``)."""

    message: str


_ACCEPTED = msgspec.json.Decoder(_Accepted).decode


def _no_body(content: bytes) -> None:
    """The decoder of calls answered without a body (204)."""
    return None


@dataclass(frozen=True)
class _Req(Generic[T]):
    """One HTTP call to the API: what to send, and ``decode``, how its answer becomes a ``T``.

    ``body`` is a request Struct or a mapping of its fields (a spec file's content), sent as JSON.
    """

    method: str
    path: str
    decode: Callable[[bytes], T]
    body: msgspec.Struct | Mapping[str, object] | None = None
    params: Mapping[str, str | int] | None = None
    headers: Mapping[str, str] | None = None

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        headers = dict(self.headers or {})
        content = None
        if self.body is not None:
            content = _ENCODE(self.body)
            headers["Content-Type"] = "application/json"
        return http.build_request(
            self.method, self.path, content=content, params=self.params, headers=headers
        )

    def answer(self, response: httpx.Response) -> T:
        """The answer decoded into ``T``, or the API's refusal raised as :class:`ApiError`."""
        if response.status_code >= 400:
            raise _error(response)
        try:
            return self.decode(response.content)
        except msgspec.DecodeError as exc:  # msgspec.ValidationError too: the right JSON, wrong shape
            raise _undecodable(f"{self.method} {self.path}", response, exc) from None


def _undecodable(call: str, response: httpx.Response, exc: msgspec.DecodeError) -> ApiError:
    request_id = response.headers.get("x-request-id", "")
    if response.status_code == 202:  # stored, not yet visible, and no resource to show for it
        with contextlib.suppress(msgspec.DecodeError):
            return ApiError(202, "accepted", _ACCEPTED(response.content).message, request_id)
    message = f"the gateway's answer to {call} is not what the API promises: {exc}"
    return ApiError(response.status_code, "invalid_response", message, request_id)


def _error(response: httpx.Response) -> ApiError:
    request_id = response.headers.get("x-request-id", "")
    try:
        detail = _ERROR_BODY(response.content).error
    except msgspec.DecodeError:
        text = (
            response.text.strip().splitlines()[0][:200] if response.text.strip() else response.reason_phrase
        )
        return ApiError(response.status_code, "http_error", text, request_id)
    return ApiError(response.status_code, detail.code, detail.message, request_id)


def _unreachable(config: Config, exc: httpx.TransportError) -> ApiError:
    return ApiError(0, "unreachable", f"cannot reach the gateway at {config.url}: {exc}")


def _params(**values: str | int | None) -> dict[str, str | int]:
    return {k: v for k, v in values.items() if v is not None}


def _spec(spec: Mapping[str, object] | msgspec.Struct) -> Mapping[str, object] | msgspec.Struct:
    """A spec as given: a request Struct, or a mapping of its fields (copied: msgspec encodes dicts)."""
    return spec if isinstance(spec, msgspec.Struct) else dict(spec)


class _Call(Generic[P, T]):
    """One API call, described once: ``describe(self, *args) -> _Req[T]``.

    Read from a :class:`Client` it is a method ``(*args) -> T``; from an :class:`AsyncClient`, a
    method ``(*args) -> Awaitable[T]``: each sends the described request with its own ``_send``.
    """

    def __init__(self, describe: Callable[Concatenate[_Calls, P], _Req[T]]) -> None:
        self.describe = describe
        self.__doc__ = describe.__doc__

    @overload
    def __get__(self, client: None, owner: type[_Calls] | None = None) -> _Call[P, T]: ...
    @overload
    def __get__(
        self, client: AsyncClient, owner: type[_Calls] | None = None
    ) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, client: Client, owner: type[_Calls] | None = None) -> Callable[P, T]: ...
    def __get__(
        self, client: _Calls | None, owner: type[_Calls] | None = None
    ) -> _Call[P, T] | Callable[P, object]:
        if client is None:
            return self
        describe, send = self.describe, client._send

        def call(*args: P.args, **kwargs: P.kwargs) -> object:
            return send(describe(client, *args, **kwargs))

        call.__name__ = call.__qualname__ = describe.__name__
        call.__doc__ = describe.__doc__
        return call


class _Calls:
    """Every API call, described once; :meth:`_send` (sync or async) runs it."""

    def _send(self, req: _Req[T]) -> object:
        raise NotImplementedError

    # -- identity and tenancy --------------------------------------------------------------------

    @_Call
    def me(self) -> _Req[Me]:
        """Who the key is."""
        return _Req("GET", "/v1/me", _ME)

    @_Call
    def create_tenant(self, tenant: str, display_name: str, plan: Plan = "payg") -> _Req[TenantCreatedBody]:
        """Operator: create a tenant; the result carries its first admin key (shown once)."""
        body = CreateTenant(tenant=tenant, display_name=display_name, plan=plan)
        return _Req("POST", "/v1/tenants", _TENANT_CREATED, body)

    @_Call
    def tenants(self) -> _Req[list[Tenant]]:
        """Operator: every tenant."""
        return _Req("GET", "/v1/tenants", _TENANTS)

    @_Call
    def tenant(self, tenant: str) -> _Req[Tenant]:
        return _Req("GET", f"/v1/tenants/{tenant}", _TENANT)

    @_Call
    def keys(self, tenant: str) -> _Req[list[KeyInfo]]:
        """The tenant's API keys (never their secrets)."""
        return _Req("GET", f"/v1/tenants/{tenant}/keys", _KEYS)

    @_Call
    def issue_key(self, tenant: str, role: Role = "member", label: str = "") -> _Req[NewKey]:
        """A new API key; its ``key`` is shown this once."""
        return _Req("POST", f"/v1/tenants/{tenant}/keys", _NEW_KEY, IssueKey(role=role, label=label))

    @_Call
    def revoke_key(self, tenant: str, key_id: str) -> _Req[None]:
        return _Req("DELETE", f"/v1/tenants/{tenant}/keys/{key_id}", _no_body)

    @_Call
    def set_quota(self, tenant: str, pool: str, gpus: int | None) -> _Req[Tenant]:
        """Operator: at most ``gpus`` GPUs at once in ``pool`` (``None``: no limit)."""
        return _Req("PUT", f"/v1/tenants/{tenant}/quotas/{pool}", _TENANT, SetQuota(gpus=gpus))

    # -- workspace -------------------------------------------------------------------------------

    @_Call
    def objects(
        self, prefix: str = "", *, limit: int = 100, after: str | None = None
    ) -> _Req[Page[WorkspaceObject]]:
        """One page of the workspace listing (``.items``, ``.next``)."""
        params = _params(prefix=prefix, limit=limit, after=after)
        return _Req("GET", "/v1/workspace/objects", _OBJECTS, params=params)

    @_Call
    def download_url(self, key: str) -> _Req[Download]:
        """A presigned GET of ``key``, valid one hour."""
        return _Req("GET", "/v1/workspace/download", _DOWNLOAD, params={"key": key})

    @_Call
    def delete_object(self, key: str) -> _Req[None]:
        return _Req("DELETE", "/v1/workspace/objects", _no_body, params={"key": key})

    # -- jobs ------------------------------------------------------------------------------------

    @_Call
    def submit_job(
        self, spec: Mapping[str, object] | SubmitJob, *, idempotency_key: str | None = None
    ) -> _Req[Job]:
        """Submit a job spec (a :class:`SubmitJob`, or a mapping of its fields, e.g. a spec file's);
        returns the :class:`Job`. With an ``idempotency_key``, a retried submission is stored once
        and returns the same job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return _Req("POST", "/v1/jobs", _JOB, _spec(spec), headers=headers)

    @_Call
    def jobs(
        self,
        *,
        state: JobStateName | None = None,
        kind: Kind | None = None,
        name_prefix: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> _Req[Page[Job]]:
        """One page of jobs, newest first (``.items``, ``.next``)."""
        params = _params(state=state, kind=kind, name_prefix=name_prefix, limit=limit, after=after)
        return _Req("GET", "/v1/jobs", _JOBS, params=params)

    @_Call
    def job(self, job_id: str, *, tenant: str | None = None) -> _Req[Job]:
        """One job, with its assignments, progress and ``why`` (the operator names the tenant)."""
        return _Req("GET", f"/v1/jobs/{job_id}", _JOB, params=_params(tenant=tenant))

    @_Call
    def cancel_job(self, job_id: str, *, tenant: str | None = None) -> _Req[Job]:
        """Cancel a job (running shards checkpoint and stop); returns it as it now reads."""
        return _Req("POST", f"/v1/jobs/{job_id}/cancel", _JOB, params=_params(tenant=tenant))

    @_Call
    def job_events(
        self, job_id: str, *, after: str | None = None, limit: int = 100
    ) -> _Req[Page[JobEventItem]]:
        """One page of the job's stored events, in log order."""
        params = _params(after=after, limit=limit)
        return _Req("GET", f"/v1/jobs/{job_id}/events", _JOB_EVENTS, params=params)

    # -- endpoints -------------------------------------------------------------------------------

    @_Call
    def deploy(self, spec: Mapping[str, object] | DeployEndpoint) -> _Req[Endpoint]:
        """Deploy an endpoint (a :class:`DeployEndpoint`, or a mapping of its fields)."""
        return _Req("POST", "/v1/endpoints", _ENDPOINT, _spec(spec))

    @_Call
    def endpoints(
        self, *, state: EndpointStateName | None = None, limit: int = 50, after: str | None = None
    ) -> _Req[Page[Endpoint]]:
        """One page of endpoints, newest first (``.items``, ``.next``)."""
        params = _params(state=state, limit=limit, after=after)
        return _Req("GET", "/v1/endpoints", _ENDPOINTS, params=params)

    @_Call
    def endpoint(self, endpoint_id: str, *, tenant: str | None = None) -> _Req[Endpoint]:
        """One endpoint, with its replicas and its traffic (the operator names the tenant)."""
        return _Req("GET", f"/v1/endpoints/{endpoint_id}", _ENDPOINT, params=_params(tenant=tenant))

    @_Call
    def scale(
        self, endpoint_id: str, *, min_replicas: int | None = None, max_replicas: int | None = None
    ) -> _Req[Endpoint]:
        """New replica bounds (the API needs both: a bound left ``None`` is not sent, and refused)."""
        body = _params(min_replicas=min_replicas, max_replicas=max_replicas)
        return _Req("PUT", f"/v1/endpoints/{endpoint_id}/scale", _ENDPOINT, body)

    @_Call
    def delete_endpoint(self, endpoint_id: str) -> _Req[None]:
        return _Req("DELETE", f"/v1/endpoints/{endpoint_id}", _no_body)

    # -- workers and billing ---------------------------------------------------------------------

    @_Call
    def workers(
        self, *, state: WorkerStateName | None = None, limit: int = 50, after: str | None = None
    ) -> _Req[Page[Worker]]:
        """Provider: one page of its own nodes (operator: all)."""
        params = _params(state=state, limit=limit, after=after)
        return _Req("GET", "/v1/workers", _WORKERS, params=params)

    @_Call
    def worker(self, worker_id: str) -> _Req[Worker]:
        return _Req("GET", f"/v1/workers/{worker_id}", _WORKER)

    @_Call
    def usage(self, period: str | None = None) -> _Req[Usage]:
        """The tenant's usage by period (``YYYY-MM``; default every period with usage)."""
        return _Req("GET", "/v1/billing/usage", _USAGE, params=_params(period=period))

    @_Call
    def invoices(self) -> _Req[list[InvoiceSummary]]:
        return _Req("GET", "/v1/billing/invoices", _INVOICES)

    @_Call
    def invoice(self, period: str) -> _Req[Invoice]:
        return _Req("GET", f"/v1/billing/invoices/{period}", _INVOICE)

    @_Call
    def payouts(self, period: str | None = None) -> _Req[Payouts]:
        """Provider: what it earned, by period and uptime tier."""
        return _Req("GET", "/v1/billing/payouts", _PAYOUTS, params=_params(period=period))

    @_Call
    def _plan_upload(
        self, key: str, size: int, content_type: str | None, sha256: str | None
    ) -> _Req[SingleUpload | MultipartUpload]:
        body = CreateUpload(key=key, size=size, content_type=content_type, sha256=sha256)
        return _Req("POST", "/v1/workspace/uploads", _UPLOAD_PLAN, body)

    @_Call
    def _part_urls(self, upload_id: str, key: str, size: int, first: int, count: int) -> _Req[PartUrls]:
        body = PartsRequest(key=key, size=size, first=first, count=count)
        return _Req("POST", f"/v1/workspace/uploads/{upload_id}/parts", _PART_URLS, body)

    @_Call
    def _complete(self, upload_id: str, key: str, etags: dict[int, str]) -> _Req[WorkspaceObject]:
        parts = [CompletedPart(part_number=n, etag=etags[n]) for n in sorted(etags)]
        body = CompleteUpload(key=key, parts=parts)
        return _Req("POST", f"/v1/workspace/uploads/{upload_id}/complete", _OBJECT, body)

    @_Call
    def _abort(self, upload_id: str, key: str) -> _Req[None]:
        return _Req("DELETE", f"/v1/workspace/uploads/{upload_id}", _no_body, params={"key": key})


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
    return str(response.headers.get("etag", "")).strip('"')


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

    def _send(self, req: _Req[T]) -> T:
        try:
            response = self.http.send(req.request(self.http))
        except httpx.TransportError as exc:
            raise _unreachable(self.config, exc) from None
        return req.answer(response)

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
        import queue

        items: queue.Queue[FeedMessage | Exception] = queue.Queue(maxsize=1000)
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
                            items.put(message, timeout=0.2)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
            except Exception as exc:
                items.put(exc)

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
                item = items.get()
                if isinstance(item, Exception):
                    raise item
                yield item
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

    async def _send(self, req: _Req[T]) -> T:
        try:
            response = await self.http.send(req.request(self.http))
        except httpx.TransportError as exc:
            raise _unreachable(self.config, exc) from None
        return req.answer(response)

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
            self.config.url,
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

    def see(self, message: FeedMessage) -> None:
        name = CURSOR_STREAMS.get(message.stream or "")
        if name and message.seq is not None:
            self.positions[name] = max(self.positions.get(name, 0), message.seq)
        if message.cursor is not None:
            self.take(message.cursor)

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
) -> AsyncIterator[FeedMessage]:
    """The caller's events from ``/v1/feed``, forever: after a drop (a restart, a slow consumer
    closed with 4008) it reconnects with its cursor, so nothing is missed or repeated. Control
    messages (``feed.ready``, ``feed.ping``, ``feed.error``) only move the cursor.

    Args:
        job / endpoint: only events of these jobs / endpoints (comma-separated ids).
        kind: only these kinds (comma-separated): an event tag, a family (``job``) or ``telemetry``.
        after: resume after this cursor (``jobs:<seq>,endpoints:<seq>``); default: start live.
        tenant: the tenant to watch (the operator only).
        max_backoff_s: the longest wait between two reconnection attempts, in seconds.

    Yields:
        Each event as a :class:`FeedMessage` (``kind``, ``seq``, ``time``, ``event``...; ``event``
        is the stored event as JSON builtins).

    Raises:
        ApiError: the gateway refused the key, the filters or the tenant (4400/4401/4403/4404), or
            sent a message that is not a :class:`FeedMessage` (``invalid_response``).
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
        error: FeedError | None = None
        try:
            async for raw in ws:
                message = _feed_message(raw)
                cursor.see(message)
                backoff = 0.2
                if message.kind == "feed.error":
                    error = message.error
                elif not message.kind.startswith("feed."):
                    yield message
        except ConnectionClosed as closed:
            if closed.code in FATAL_CLOSES:
                code = (error.code if error else "") or FATAL_CLOSES[closed.code]
                reason = (error.message if error else "") or closed.reason
                raise ApiError(closed.code - 4000, code, reason) from None
        except OSError:
            pass
        finally:
            with contextlib.suppress(Exception):
                await ws.close()
        await asyncio.sleep(backoff)
        backoff = min(max_backoff_s, backoff * 2)


def _feed_message(raw: str | bytes) -> FeedMessage:
    try:
        return _FEED_MESSAGE(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(0, "invalid_response", f"a feed message is not what the API promises: {exc}") from None


def _read(path: Path, offset: int, size: int, meter: _Meter) -> bytes:
    """``size`` bytes of ``path`` from ``offset`` (a part is at most 50 MB: fine to hold)."""
    return b"".join(_chunks(path, offset, size, meter))
