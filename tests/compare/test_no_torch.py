"""harness.compare and the cache pruner stay torch-free (quick to import, usable anywhere)."""

import subprocess
import sys


def test_compare_and_prune_do_not_import_torch():
    code = ("import sys, harness.compare, harness.compare.dumps, harness.reference.prune; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
