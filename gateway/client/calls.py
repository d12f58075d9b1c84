"""Every API call, described once (a :class:`_Call` in :class:`_Calls`): a method builds the request
and names the decoder of its answer; only sending differs between :class:`~gateway.client.Client`
and :class:`~gateway.client.AsyncClient`, and the descriptor types each method for the client it is
read from (``T`` on ``Client``, an awaitable of ``T`` on ``AsyncClient``).

Every create that the API makes idempotent (submit, deploy) carries an ``Idempotency-Key``, the
caller's or a new one per call: the client may then send it again, to another gateway, after an
answer was lost (:mod:`gateway.client.gateways`), and it is stored once."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

import msgspec

from gateway.client.request import _no_body, _params, _Req, _spec
from schemas.api.billing import Invoice, InvoiceSummary, Payouts, Usage
from schemas.api.common import Me, Page
from schemas.api.endpoints import DeployEndpoint, Endpoint, EndpointStateName
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
    PartUrls,
    SingleUpload,
    WorkspaceObject,
)

if TYPE_CHECKING:
    from gateway.client.aio import AsyncClient
    from gateway.client.sync import Client

T = TypeVar("T")
P = ParamSpec("P")
Plan = Literal["payg", "managed", "private"]
"""A tenant's plan (the values :class:`schemas.api.tenants.CreateTenant` accepts)."""

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


def _idempotency(key: str | None) -> dict[str, str]:
    """The ``Idempotency-Key`` header of one logical create: the caller's key, else a new one (the same
    for every attempt of this call, since a call is described once and sent as often as needed)."""
    return {"Idempotency-Key": key or f"sdk-{secrets.token_urlsafe(24)}"}


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
    def health(self) -> _Req[None]:
        """Whether a gateway answers (any key, or none); the client then prefers the one that did."""
        return _Req("GET", "/v1/health", _no_body)

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
        returns the :class:`Job`. Submitting again with the same ``idempotency_key`` stores nothing
        more and returns the same job; without one, the call makes its own, so that the client's
        retries (another gateway, a lost answer) are stored once."""
        return _Req("POST", "/v1/jobs", _JOB, _spec(spec), headers=_idempotency(idempotency_key))

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
        # Replayable: a second cancel stores nothing (a cancelled job is a 409 job_ended).
        path = f"/v1/jobs/{job_id}/cancel"
        return _Req("POST", path, _JOB, params=_params(tenant=tenant), replayable=True)

    @_Call
    def job_events(
        self, job_id: str, *, after: str | None = None, limit: int = 100
    ) -> _Req[Page[JobEventItem]]:
        """One page of the job's stored events, in log order."""
        params = _params(after=after, limit=limit)
        return _Req("GET", f"/v1/jobs/{job_id}/events", _JOB_EVENTS, params=params)

    # -- endpoints -------------------------------------------------------------------------------

    @_Call
    def deploy(
        self, spec: Mapping[str, object] | DeployEndpoint, *, idempotency_key: str | None = None
    ) -> _Req[Endpoint]:
        """Deploy an endpoint (a :class:`DeployEndpoint`, or a mapping of its fields); the
        ``idempotency_key`` works as :meth:`submit_job`'s."""
        headers = _idempotency(idempotency_key)
        return _Req("POST", "/v1/endpoints", _ENDPOINT, _spec(spec), headers=headers)

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
        path = f"/v1/workspace/uploads/{upload_id}/parts"
        return _Req("POST", path, _PART_URLS, body, replayable=True)  # presigning stores nothing

    @_Call
    def _complete(self, upload_id: str, key: str, etags: dict[int, str]) -> _Req[WorkspaceObject]:
        parts = [CompletedPart(part_number=n, etag=etags[n]) for n in sorted(etags)]
        body = CompleteUpload(key=key, parts=parts)
        return _Req("POST", f"/v1/workspace/uploads/{upload_id}/complete", _OBJECT, body)

    @_Call
    def _abort(self, upload_id: str, key: str) -> _Req[None]:
        return _Req("DELETE", f"/v1/workspace/uploads/{upload_id}", _no_body, params={"key": key})
