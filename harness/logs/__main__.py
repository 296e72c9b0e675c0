"""`python -m harness.logs RUNS [--config FILE] [-o REPORT]`, or
`python -m harness.logs BASELINE SUBJECT [--pairing FILE] [-o REPORT]`."""

import sys

from .cli import main

sys.exit(main())
