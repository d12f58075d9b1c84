"""The kernel's services besides the coordinator and the federation, each run by ``resontech <name>``:

* :mod:`ops.services.projector`: keeps every projection's snapshot current;
* :mod:`ops.services.intake`: judges agents' claims and writes the kernel's own events (or quarantines);
* :mod:`ops.services.verifier`: the verification challenges of new hosts (run by the intake);
* :mod:`ops.services.natsauth`: keeps the NATS server's agent users in step with enrollments.
"""
