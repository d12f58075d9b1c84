"""Hugging Face repository references, checked by the strict grammar both the gateway and the agent
apply: ``[org/]name[@revision]``. (A tenant writes one in an endpoint's ``model``: the gateway refuses
a bad one with a 422, the agent refuses it again before it looks in a cache.)"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import InvalidInput

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_ID = re.compile(rf"(?:{_PART}/)?{_PART}")
"""Hugging Face's repo id grammar, ASCII only: an optional namespace, a name of at most 96 letters,
digits, ``-``, ``_`` or ``.``, neither starting nor ending with ``-`` or ``.`` (plus, below, no ``--``
nor ``..``: the hub forbids both, and ``--`` is the cache's own separator)."""
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}"
REVISION = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT}){{0,3}}")
"""A branch or tag (``main``, ``v1.0``, ``refs/pr/3``) or a commit: at most four segments."""
PREFIX = "models--"
MAX_REFERENCE = 200


class InvalidRepoReference(InvalidInput, ValueError):
    """A string that is not ``org/name[@revision]`` by the strict grammar."""


@dataclass(frozen=True, slots=True)
class HubReference:
    """A validated repo id and revision (default ``main``)."""

    repo_id: str
    revision: str = "main"

    @property
    def folder(self) -> str:
        """The repo's folder in the cache: ``models--org--name``."""
        return PREFIX + self.repo_id.replace("/", "--")

    def __str__(self) -> str:
        return self.repo_id if self.revision == "main" else f"{self.repo_id}@{self.revision}"


def parse(reference: str) -> HubReference:
    """``org/name[@revision]`` as a :class:`HubReference`.

    Raises:
        InvalidRepoReference: the string breaks the grammar (the message says how).
    """
    if len(reference) > MAX_REFERENCE:
        raise InvalidRepoReference(f"longer than {MAX_REFERENCE} characters")
    repo_id, at, revision = reference.partition("@")
    if not REPO_ID.fullmatch(repo_id) or ".." in repo_id or "--" in repo_id:
        raise InvalidRepoReference(
            "a repo id is [org/]name: ASCII letters, digits, '-', '_', '.', no '..' or '--', "
            "not starting or ending with '-' or '.'"
        )
    if not at:
        return HubReference(repo_id)
    bad = not REVISION.fullmatch(revision) or ".." in revision or revision.endswith(".lock")
    if bad:
        raise InvalidRepoReference(
            "a revision is a branch, tag or commit: up to 4 '/'-separated segments of letters, digits, "
            "'.', '_', '-', no '..'"
        )
    return HubReference(repo_id, revision)
