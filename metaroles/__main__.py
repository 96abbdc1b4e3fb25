"""``python -m metaroles``: the ``metaroles`` command."""

import sys

from metaroles.cli import main

sys.exit(main())
