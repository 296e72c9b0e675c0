"""Collection, the suggestion tool and the report must start without loading torch."""

import subprocess
import sys

TORCH_FREE = [
    "harness.layout",
    "harness.layout.suggest",
    "harness.cases",
    "harness.compare",
    "harness.results",
    "harness.report",
    "harness.plugin",
    "harness.runner",
    "harness.launch",
    "harness.reference",
    "harness.trainer.llmc",
    "harness.trainer.models.configs",
    "harness.assets",
]


def test_harness_modules_import_without_torch():
    code = (
        "import importlib, sys\n"
        f"for name in {TORCH_FREE!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'torch' not in sys.modules, name + ' imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
