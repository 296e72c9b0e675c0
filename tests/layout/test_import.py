import subprocess
import sys


def test_importing_harness_layout_does_not_import_torch():
    code = ("import sys, harness.layout, harness.layout.suggest; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"
