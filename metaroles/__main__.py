"""``python -m metaroles`` runs the command line."""

from metaroles.cli import main

raise SystemExit(main())
