"""`python -m harness.bisect --good REV --bad REV TAG/MODEL/ID [options] -- PYTEST ARGS`."""

import sys

from .cli import main

sys.exit(main())
