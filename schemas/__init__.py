"""Shapes: every event, command and API body, as frozen msgspec Structs. Imports nothing of ours.

Each name is imported from its one home: the events of a stream family from their module
(``schemas.jobs``, ``schemas.endpoints``, ``schemas.workers``, ``schemas.tenants``,
``schemas.providers``, ``schemas.metering``, ``schemas.audit``, ``schemas.federation``), the agents'
commands from ``schemas.commands``, the values several events carry from ``schemas.values``, the
envelope of a stored event from ``schemas.envelope``, the catalog of every type (decode, encode, JSON
Schema export) from ``schemas.catalog``, the bases and upcasters from ``schemas._base``, and the
API's bodies from ``schemas.api``.
"""
