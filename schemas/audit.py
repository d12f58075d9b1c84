"""Events of the AUDIT stream: ``api.<account>.<principal_kind>``: one per accepted mutating request.

Who (principal and key id), what (method, route, the resource it named, status), when (the stream's
store time). Requests refused with a 4xx are not recorded: they changed nothing.
"""

from __future__ import annotations

from typing import Literal

from schemas._base import Event

PrincipalKind = Literal["operator", "tenant", "provider", "agent"]


class RequestRecorded(Event, tag="api.request", frozen=True, kw_only=True):
    """A mutating API request that succeeded.

    Attributes:
        principal: ``operator``, ``tenant:<id>``, ``provider:<id>`` or ``agent:<worker>``.
        key_id: the API key used (never the key).
        route: the route template (``/v1/jobs/{job_id}``), ``path`` the concrete path.
        resource: the id the request created or changed, when there is one.
        request_id: the ``X-Request-Id`` returned to the caller.
    """

    principal: str
    principal_kind: PrincipalKind
    key_id: str = ""
    role: str = ""
    method: str
    route: str
    path: str
    status: int
    resource: str = ""
    request_id: str = ""
    remote: str = ""


AuditEvent = RequestRecorded
