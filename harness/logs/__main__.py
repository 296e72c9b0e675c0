"""`python -m harness.logs RUNS [--config FILE] [-o REPORT]`, or `BASELINE SUBJECT [--pairing FILE]`."""

import sys

from .cli import main

sys.exit(main())
