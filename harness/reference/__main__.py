"""`python -m harness.reference prune [--root DIR] [--max-gb N] [--list]`: see prune.py."""

import sys

from .prune import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "prune":
        print("usage: python -m harness.reference prune [--root DIR] [--max-gb N] [--list] "
              "[--min-idle-s S]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args[1:]))
