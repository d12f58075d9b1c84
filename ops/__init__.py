"""Everything that runs: the command, the kernel's services, the dev stack, the benchmarks.

=================  ==========================================================================
package            what it is
=================  ==========================================================================
``ops.cli``        the ``resontech`` command: every process and every user command
``ops.coordinator``  the coordinator: placement, loss detection, recovery (decisions are pure,
                   in ``core`` and ``projections``; this is the loop that appends them)
``ops.federation`` the federation service: one NVFlare FL server per federated job
``ops.services``   the projector, the intake (and its verifier), the NATS agent-user sync
``ops.devstack``   the local stack ``make up`` starts
``ops.bench``      the benchmarks (``make bench``)
``ops.process``,   child processes and free ports, shared by every role
``ops.ports``
``ops.enrollment`` the enrollment of agents run with the kernel's credentials (a cluster's nodes,
                   load tests), as the operator
``ops.specs``      job and endpoint spec files (YAML, TOML, JSON), for the CLI and the dispatcher
=================  ==========================================================================
"""
