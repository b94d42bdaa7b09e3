"""``python -m mpcore.conformance NAME``: the same as ``mpcore conformance NAME``."""

import sys

from mpcore.conformance.cli import main

sys.exit(main())
