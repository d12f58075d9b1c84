"""The user-facing commands of ``resontech``: they talk to the gateway through the SDK
(:mod:`gateway.client`), never to NATS. ``login`` remembers the gateway URL and key; every command
takes ``--url`` and ``--key`` to override, then ``RESONTECH_GATEWAY_URL`` / ``RESONTECH_API_KEY``, then
what ``login`` stored, then the dev stack's ``dev.env``.

Output is a short human summary, or with ``--json`` the API's own JSON. Errors are one line.

One module per thing the commands are about, each with the handlers and the ``register`` that adds
them; this one adds them all, in the order ``resontech --help`` lists them:

* :mod:`ops.cli.session`: what they share (the client, printing an answer, reading a spec file);
* :mod:`ops.cli.account`: the key (``login``, ``logout``, ``whoami``) and the money (``workers``,
  ``billing``, ``usage``);
* :mod:`ops.cli.workspace`: ``upload``, ``download``, ``ls``;
* :mod:`ops.cli.jobs`: ``submit``, ``jobs``, ``status``, ``why``, ``cancel``, ``watch``;
* :mod:`ops.cli.endpoints`: ``endpoints``, ``deploy``, ``scale``, ``undeploy``, ``infer``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ops.cli import account, endpoints, jobs, workspace
from ops.cli.session import add_user_command

__all__ = ["register"]


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add the user commands to the ``resontech`` parser (``command(name, handler, help)``)."""
    user = add_user_command(command)
    account.register_keys(user)
    workspace.register(user)
    jobs.register(user)
    endpoints.register(user)
    account.register_billing(user)
