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
    "harness.spec.llmc",
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


def test_device_settings_without_a_gpu_driver_do_not_load_torch(tmp_path):
    # The controller and every xdist worker resolve `--harness-device auto`; importing torch
    # just to count zero CUDA devices cost ~1.5 s per session (benchmarks/harness_overhead.py).
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from harness.runner.settings import gpu_device_nodes_present, runner_settings\n"
        f"s = runner_settings(Path({str(tmp_path)!r}), Path({str(tmp_path)!r}), 'main', 'auto', "
        "2, 60.0)\n"
        "print(gpu_device_nodes_present(), s.device, 'torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    present, device, torch_loaded = result.stdout.split()
    if present == "False":
        assert (device, torch_loaded) == ("cpu", "False")
