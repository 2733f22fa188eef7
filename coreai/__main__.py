"""`python -m coreai ...`: the `coreai` command."""

import sys

from coreai.cli import main

sys.exit(main())
