"""Placement: a pure decision from one request and the candidate workers to a gang of assignments.

``place`` filters, ranks and picks; it has no I/O, no clock (``now_ns`` is a parameter), no
randomness, and ranks equal scores by base score then worker id, so the same input (in any order)
always gives the same output.

Filters, in order; a rejected worker is counted under the first reason it fails:

* ``pool``: the worker is not in the request's *lane*. Shared work runs on shared workers, and on a
  managed worker whose policy lists ``shared`` in ``allowed_pools`` (the owner lends idle reserved
  capacity; managed work of the owner preempts it, see :mod:`projections.admission`). Managed work runs only
  on managed workers whose ``owner_tenant`` is the tenant; private work only on the tenant's own
  private workers. A managed or private worker without an owner takes no managed or private work.
  A worker whose host cannot sandbox workloads takes no work at all, and one started unsandboxed
  (local development) only its owner's own managed or private work, never shared work it would
  borrow (:mod:`core.sandbox`).
* ``image``: work that names its own container image runs only on workers that run images (sandbox
  ``kubernetes``: the nodes of the kernel's own clusters, :mod:`ops.dispatcher`); an agent's host
  runs workloads in its own environment and takes none of it. A lane is a pool, an owner and
  whether the work names an image: an image-running worker serves both lanes of its pool and owner.
* ``gpu_type``: GPU work with a ``gpu_type`` needs a worker of that family
  (:func:`core.pricing.gpu_family`); CPU work (``gpus == 0``) ignores ``gpu_type`` and fits any host.
* ``state`` (cordoned, lost, deregistered, unverified), ``silent`` (no heartbeat, or the latest is older than
  3 of its intervals), ``excluded`` (the request's ``exclude_workers``).
* ``policy_tenant``, ``policy_pool``, ``policy_price`` (GPU work only: the tenant's price per
  GPU-hour, by default the list price of the worker's GPU family in the request's pool, is below the
  provider's minimum), ``maintenance`` (``now_ns`` inside a weekly window, UTC).
* capacity: ``policy_concurrency`` (``max_concurrent`` assignments reached), ``gpus`` (fewer free
  GPUs than a slot needs), ``vram`` (fewer free GPUs with ``vram_mb`` usable: min(free now,
  ``max_vram_fraction`` x total)), ``cpus`` / ``memory`` (only where the host reported them).

Ranking: ``score = uptime_term x tier_term x load_term x geo_term``, each in [0, 1] (the product of
the first three is the *base score*, independent of the request):
``uptime ** uptime_exp`` (30-day uptime, :mod:`core.tiers`); the tier's factor (platinum 1.0, gold
0.9, silver 0.75, unverified 0.5); geo 1.0 when the request names no region or the same one,
``geo_near`` (0.85) for the same area (the region's first ``-`` token: ``eu-west-1`` ~ ``eu-central-1``),
else ``geo_far`` (0.7); ``1 - load_penalty x busy`` (penalty 0.5) where busy is the larger of the
share of GPUs assigned (of CPUs, on a CPU host) and the live utilisation.

Gang: all requested slots or none. Spread first: each slot goes to a different worker, best first;
only when fewer workers fit than there are slots does a worker take a second slot (round-robin
over the ranked workers with room, best first). Fewer total slots than requested: unplaceable,
``permanent`` when even the idle fleet (cordoned and lost workers included, deregistered excluded)
could never hold the gang or the tenant has no worker in a managed or private pool.

The coordinator decides with :meth:`core.placement.candidate_index.CandidateIndex.place`, which gives
:func:`place`'s decisions while inspecting a few workers; the plain scan is the reference it is tested
against.

Its parts, by role (import each name from its module; this package re-exports none):

* :mod:`core.placement.values`: what it is given and answers (:class:`PlacementRequest`,
  :class:`Candidate`, :class:`RankWeights`, :class:`Placed`, :class:`Unplaceable`);
* :mod:`core.placement.rules`: the filters and the ranking (:class:`Decision`, :func:`lanes`);
* :mod:`core.placement.placing`: the decision itself (:func:`place`, the gang) and assignment ids;
* :mod:`core.placement.explaining`: why nothing fits (now, or ever) and ``resontech why``'s lines;
  they name exactly the filters and score terms of the rules, so the two change together.
* :mod:`core.placement.candidate_index`: the candidates kept on sorted shelves
  (:class:`CandidateIndex`), the decision the coordinator makes.
"""
