"""The ``resontech`` command: one entry point for every process (services, agents, the dev stack) and
every user command.

* :mod:`ops.cli.main`: the argument parser and dispatch (``resontech`` and ``python -m ops.cli``);
* :mod:`ops.cli.user`: the tenant's and provider's commands, through the SDK (``login``, ``submit``,
  ``status``, ``watch``, ``deploy``, ``infer``, ``billing``...);
* :mod:`ops.cli.workers` (enrolling a state dir, worker listings), :mod:`ops.cli.tail` (the log as
  it grows), :mod:`ops.cli.quarantine` (refused claims), :mod:`ops.cli.demo` (the scripted tour).
"""

from ops.cli.main import main

__all__ = ["main"]
