"""What every user command shares: a gateway client from the flags, the environment, ``login``'s file
or the dev stack's ``dev.env``; printing an answer, for a person or with ``--json`` as the API's own
JSON (:mod:`ops.specs` reads the spec files that ``submit`` and ``deploy`` send).

Every user command takes ``--url`` and ``--key`` (:func:`add_user_command`); without them
``RESONTECH_GATEWAY_URL`` / ``RESONTECH_API_KEY``, then what ``login`` stored, then ``dev.env``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from core.settings import read_env_file
from gateway.client import CREDENTIALS, Client

Command = Callable[[argparse.Namespace], int]
"""A user command's handler: the parsed arguments in, the exit status out."""
UserCommand = Callable[[str, Command, str], argparse.ArgumentParser]
"""Adds one user command (``name``, ``handler``, ``help``) with ``--url`` and ``--key``; returns its
parser for the command's own arguments."""
T = TypeVar("T")


def add_user_command(command: Callable[..., argparse.ArgumentParser]) -> UserCommand:
    """A :data:`UserCommand` over the ``resontech`` parser's ``command(name, handler, help)``."""

    def user(name: str, handler: Command, help_text: str) -> argparse.ArgumentParser:
        p = command(name, lambda args, _settings: handler(args), help_text)
        p.add_argument(
            "--url",
            help="gateway URL, or several comma-separated, tried in turn when one is down "
            "(default: RESONTECH_GATEWAY_URL, login, dev.env)",
        )
        p.add_argument("--key", help="API key (default: RESONTECH_API_KEY, login, dev.env)")
        return p

    return user


def _defaults(args: argparse.Namespace) -> dict[str, str]:
    data_dir = Path(getattr(args, "data_dir", None) or os.environ.get("RESONTECH_DATA_DIR") or ".resontech")
    env_file = data_dir / "dev.env"
    return read_env_file(env_file) if env_file.exists() else {}


def client(args: argparse.Namespace) -> Client:
    """A client configured from flags, environment, the login file, then dev.env."""
    fallback = _defaults(args)
    url = args.url or os.environ.get("RESONTECH_GATEWAY_URL")
    key = args.key or os.environ.get("RESONTECH_API_KEY")
    if not CREDENTIALS.exists():
        url = url or fallback.get("RESONTECH_GATEWAY_URL")
        key = key or fallback.get("RESONTECH_API_KEY")
    return Client(url, key)


def show(args: argparse.Namespace, value: T, human: Callable[[T], str]) -> None:
    """``value`` as ``human`` says, or with ``--json`` as the API's JSON (Structs as their fields)."""
    if args.json:
        print(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True))
    else:
        print(human(value))


def job_ref(ref: str) -> tuple[str, str | None]:
    """``JOB`` or (for the operator) ``TENANT/JOB`` -> ``(job_id, tenant)``."""
    tenant, sep, job_id = ref.partition("/")
    return (job_id, tenant) if sep else (ref, None)
