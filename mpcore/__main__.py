"""``python -m mpcore info`` runs the ``mpcore`` command."""

import sys

from mpcore.cli.app import main

sys.exit(main())
