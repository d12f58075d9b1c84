"""The kernel's core: the event log and the domain rules every edge shares.

``core`` sits between ``schemas`` (shapes) and ``projections`` (reducers); it imports only
``schemas``. Its modules are of two kinds, and a new one should say which it is.

Pure decisions and values: no I/O, no clock (the instant is a parameter), no randomness unless
named below; a test calls them with plain values.

* :mod:`core.placement`: placement, the plain scan and the coordinator's
  :class:`~core.placement.candidate_index.CandidateIndex`;
* :mod:`core.autoscale`: replica counts from an endpoint's load;
* :mod:`core.federation_claims`: who runs each federated job's FL server;
* :mod:`core.pricing`: price tables and the pricing of a usage tick;
* :mod:`core.tiers`: a provider's availability tier;
* :mod:`core.verification`: the verification job's computation and the judgement of a report;
* :mod:`core.reports`: a worker's reports on an assignment, as the events to append;
* :mod:`core.rendezvous`, :mod:`core.workenv`: a distributed job's rendezvous and a workload's
  environment;
* :mod:`core.flare`, :mod:`core.flarejob`: a federated job's NVFlare project and job folder (they
  take file contents, never paths);
* :mod:`core.streams`, :mod:`core.protocol`, :mod:`core.hub`, :mod:`core.errors`: subjects and
  streams, the workload's stdout protocol, model references, the one error root;
* :mod:`core.wire`: the log's header names, positions and records; its event ids draw random bytes;
* :mod:`core.natsauth`: agents' NATS permissions and the server's configuration text
  (:func:`~core.natsauth.new_password` draws a random password);
* :mod:`core.clock`: time units and heartbeat deadlines (:func:`~core.clock.now_ms` alone reads
  the clock);
* :mod:`core.addresses`: parsing and judging replica addresses (:func:`~core.addresses.resolve`
  alone asks DNS).

I/O, kept behind small functions and classes so that the decisions above stay pure:

* :mod:`core.log`: the one package that talks to NATS JetStream (appends, reads, snapshots);
* :mod:`core.objects`: the S3 client of the object store;
* :mod:`core.files`: private files written whole, and a tenant's tree opened without following links;
* :mod:`core.sandbox`: running tenant code under bubblewrap;
* :mod:`core.cgroups`, :mod:`core.proctags`: a workload's cgroup and finding its processes (signals);
* :mod:`core.settings`: the typed settings, read once from the environment and a file.
"""
