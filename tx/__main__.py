"""`python -m tx` = the `tx` console script."""

import sys

from tx.cli import main

sys.exit(main())
