"""``python -m ops.devstack [up|down]``: the dev stack without the full CLI."""

import sys

from ops.devstack.stack import main

sys.exit(main())
