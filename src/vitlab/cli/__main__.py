"""`python -m vitlab.cli ...` (what `torchrun ... -m vitlab.cli train ...` runs): the `vitlab` command."""

import sys

from . import main

sys.exit(main())
