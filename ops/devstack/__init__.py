"""The local dev stack: everything ``make up`` starts on one machine.

* :mod:`ops.devstack.stack`: ``up`` and ``down`` (``resontech up``, ``python -m ops.devstack``): the
  embedded nats-server and object store, every kernel service, two enrolled local agents;
* :mod:`ops.devstack.stackfile`: ``stack.json``, what a stack runs (pids and their start times), and
  stopping what it records;
* :mod:`ops.devstack.enrollment`: the provider ``local`` and its agents' enrollment tokens, through the
  gateway; :mod:`ops.devstack.errors`: the stack's one error;
* :mod:`ops.devstack.natsserver`: a ``nats-server`` from the wheel on a free loopback port, with its
  accounts (and, as one node of a cluster, its routes); :mod:`ops.devstack.objectstore`:
  ``rclone serve s3`` on loopback;
* :mod:`ops.devstack.natscluster`: a JetStream cluster of such servers (``up --cluster 3``, tests);
  :mod:`ops.devstack.stacknats`: the stack's NATS, one server or a cluster;
  :mod:`ops.devstack.services`: the stack's processes, one of each or two of each on a cluster.

Child processes and ports (:mod:`ops.process`, :mod:`ops.ports`) are shared with the other roles.
"""

from ops.devstack.errors import DevStackError
from ops.devstack.stack import ServiceSpec, down, up

__all__ = ["DevStackError", "ServiceSpec", "down", "up"]
