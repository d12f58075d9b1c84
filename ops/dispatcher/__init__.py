"""The Kubernetes dispatcher: a Kubernetes cluster as one of the kernel's pools.

It is a kernel component with credentials of its own (not an agent): it registers the cluster's nodes
as workers, turns node conditions into liveness, and runs each assignment the kernel places there as
Kubernetes objects in a namespace of the job's (or endpoint's) own, reporting what agents report
(started, progress and checkpoints from the pods' protocol lines, completion or failure with the log
tail) and metering GPU time from pod start and end; it deletes the namespace when the work ends.

The parts:

* :mod:`ops.dispatcher.manifests`: the objects of a job or an endpoint, pure functions of the kernel's
  ``start_work`` commands (with :mod:`~ops.dispatcher.names`, :mod:`~ops.dispatcher.policies`,
  :mod:`~ops.dispatcher.pods`, :mod:`~ops.dispatcher.shards`, :mod:`~ops.dispatcher.endpoints` and the
  operator's :mod:`~ops.dispatcher.context`);
* :mod:`ops.dispatcher.render`: ``resontech dispatcher render``, the manifests of a job or endpoint spec
  for a synthetic placement, as YAML;
* :mod:`ops.dispatcher.podstate` and :mod:`ops.dispatcher.reporting`: a pod's JSON read, and what an
  agent would claim for it (pure, with the agent's own builders of :mod:`core.reports`);
* :mod:`ops.dispatcher.fetch`: the program the fetcher init container runs (presigned GETs into the
  working dir); :mod:`ops.dispatcher.supervise`: the first process of a shard that uploads its
  checkpoints (presigned PUTs of what its workload reports);
* :mod:`ops.dispatcher.verification`: a new node's verification challenge as a Job on the node, and
  its report claimed as the node-worker's;
* the cluster's side (nodes, the API conversation) and the service (``resontech dispatcher run``).
"""
