"""Names and labels of the Kubernetes objects the dispatcher renders, made from the kernel's ids.

Tenant and work ids are tokens (``[A-Za-z0-9_-]{1,64}``), which are not always valid Kubernetes
names (upper case, ``_``, 64 characters) and may differ only in case. So a namespace is named
``<prefix>-<tenant>-<work>-<hash>``: the ids lowered and cut to what DNS-1123 allows, for people, and a
hash of the exact ids and the kind, for uniqueness (``Acme``'s job and ``acme``'s never meet). A label
value is the id itself when it is a valid label value, else its sanitized form plus a hash; the exact
ids are annotations. Nothing a tenant sends becomes a label key or an object name unhashed.
"""

from __future__ import annotations

import hashlib
import re

from core.errors import ResontechError

MANAGED_BY = "resontech-dispatcher"
"""``app.kubernetes.io/managed-by`` of every object the dispatcher renders (and the one it deletes)."""
DOMAIN = "resontech.io"
TENANT = f"{DOMAIN}/tenant"
WORK = f"{DOMAIN}/work"
WORK_KIND = f"{DOMAIN}/work-kind"
EPOCH = f"{DOMAIN}/epoch"
ROLE = f"{DOMAIN}/role"
SHARD = f"{DOMAIN}/shard"
"""A job shard's slot, on its Job and pod."""
REPLICA = f"{DOMAIN}/replica"
"""An endpoint replica's slot, on its Deployment, Service and pod."""
ASSIGNMENT = f"{DOMAIN}/assignment"
TENANT_ID = f"{DOMAIN}/tenant-id"
"""Annotations with the exact ids (label values may be sanitized)."""
WORK_ID = f"{DOMAIN}/work-id"
ASSIGNMENT_ID = f"{DOMAIN}/assignment-id"
MAX_NAME = 63
HASH_LEN = 8
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ManifestError(ResontechError):
    """Work that cannot be rendered as Kubernetes objects (the message says which field and why)."""

    code = "manifest"


def digest(*parts: str) -> str:
    """A short, stable hash of ``parts`` (joined unambiguously)."""
    joined = "\x00".join(parts).encode()
    return hashlib.blake2b(joined, digest_size=8).hexdigest()[:HASH_LEN]


def _dns_part(text: str) -> str:
    """``text`` lowered, every run of characters DNS-1123 refuses a single ``-``, trimmed of ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def namespace_name(prefix: str, tenant: str, work_id: str, kind: str) -> str:
    """The namespace of one job or endpoint: a DNS-1123 label of at most 63 characters, the same for
    the same ``(tenant, work_id, kind)`` and never the same for two different ones (up to the hash)."""
    tail = digest(kind, tenant, work_id)
    room = MAX_NAME - len(prefix) - len(tail) - 3  # three '-'
    tenant_part = _dns_part(tenant)[: room // 2].strip("-") or "t"
    work_part = _dns_part(work_id)[: room - len(tenant_part)].strip("-") or "w"
    name = f"{prefix}-{tenant_part}-{work_part}-{tail}"
    if not _DNS_LABEL.match(name) or len(name) > MAX_NAME:
        raise ManifestError(f"namespace prefix {prefix!r} makes an invalid name {name!r}")
    return name


def label_value(value: str) -> str:
    """``value`` as a label value: itself when valid, else sanitized and suffixed with its hash."""
    if is_label_value(value):
        return value
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[: MAX_NAME - HASH_LEN - 1]
    clean = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", clean)
    return f"{clean}-{digest(value)}" if clean else digest(value)


def is_label_value(value: str) -> bool:
    """Whether ``value`` is a valid label value as it is."""
    return len(value) <= MAX_NAME and bool(_LABEL_VALUE.match(value))


def is_dns_label(name: str) -> bool:
    """Whether ``name`` is a DNS-1123 label (a valid namespace, Service or Pod name part)."""
    return len(name) <= MAX_NAME and bool(_DNS_LABEL.match(name))


def work_labels(tenant: str, work_id: str, kind: str, epoch: int) -> dict[str, str]:
    """The labels every object of one job or endpoint carries."""
    return {
        "app.kubernetes.io/managed-by": MANAGED_BY,
        TENANT: label_value(tenant),
        WORK: label_value(work_id),
        WORK_KIND: kind,
        EPOCH: str(epoch),
    }


def work_annotations(tenant: str, work_id: str) -> dict[str, str]:
    """The exact ids, which the labels may have had to sanitize."""
    return {TENANT_ID: tenant, WORK_ID: work_id}
