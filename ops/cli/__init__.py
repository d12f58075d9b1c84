"""The ``resontech`` command: one entry point for every process (services, agents, the dev stack) and
every user command.

* :mod:`ops.cli.main`: the argument parser and dispatch (``resontech`` and ``python -m ops.cli``);
* :mod:`ops.cli.user`: the tenant's and provider's commands, through the SDK, one module per thing
  they are about: :mod:`ops.cli.account` (``login``, ``whoami``, ``workers``, ``billing``,
  ``usage``...), :mod:`ops.cli.workspace` (``upload``, ``download``, ``ls``), :mod:`ops.cli.jobs`
  (``submit``, ``status``...) with :mod:`ops.cli.watch` (``watch``), :mod:`ops.cli.endpoints`
  (``deploy``, ``scale``, ``infer``...), and what they share, :mod:`ops.cli.session` (the client,
  ``--json``);
* :mod:`ops.cli.workers` (``cordon``, ``uncordon``), :mod:`ops.cli.tail` (the log as
  it grows), :mod:`ops.cli.quarantine` (refused claims), :mod:`ops.cli.demo` (the scripted tour).
"""

from ops.cli.main import main

__all__ = ["main"]
