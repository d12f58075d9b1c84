"""``python -m ops.cli``: the ``resontech`` command."""

import sys

from ops.cli.main import main

sys.exit(main())
