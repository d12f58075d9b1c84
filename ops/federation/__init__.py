"""Federated jobs on NVFlare: the kernel side (the ``resontech federation`` service).

* :mod:`ops.federation.service`: one federation per live federated job, and why the FL servers run here;
* :mod:`ops.federation.federation`: one job's federation from provisioning to teardown, and recovery;
* :mod:`ops.federation.runs`: one FL run: when the next may start, which sites a run lost, why one failed;
* :mod:`ops.federation.reports`: what a federation appends about its job: each round, the job's end;
* :mod:`ops.federation.server`: provisioning, the FL server process, the admin session;
* :mod:`ops.federation.workspace`: shards, code, kits and outputs in object storage;
* :mod:`ops.federation.jobfolder`: the job's FL job folder on disk, and each run's copy of it;
* :mod:`ops.federation.resontech_flare`: the kernel's server components shipped into every run;
* :mod:`ops.federation.claims`: this instance's claims on jobs (several instances, one FL server each);
* :mod:`ops.federation.fence`: the watchdog that kills an instance's FL servers once its claims lapse;
* :mod:`ops.federation.handover`: a job's federation stored by its first holder, adopted by the next.

The pure parts are :mod:`core.flare` (the project, what a status means), :mod:`core.flarejob`
(each run's job folder, generated or the tenant's) and :mod:`core.federation_claims` (who holds
which job, when a claim lapses); the client side is the agent's ``nvflare-client``
runtime (:mod:`agent.runtimes.nvflare`).
"""

from ops.federation.service import FederationService, serve

__all__ = ["FederationService", "serve"]
