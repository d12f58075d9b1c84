"""Production NATS: the three nodes' configs (``n1.conf`` ... ``n3.conf``, see ``README.md`` here) and
:mod:`ops.nats.accounts`, which renders the accounts file they include."""
