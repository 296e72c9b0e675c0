"""The pytest plugin (entry point `pytest11: harness = "harness.plugin"`): options, markers,
collection of the test config's cases, and one item per (tag, case, model). Hooks only; the
logic lives in harness.cases, harness.runner, harness.launch, harness.reference,
harness.compare and harness.results.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness.cases import ConfigError, load_config, read_tags

_SETTINGS = pytest.StashKey[dict]()
_RUNNER = pytest.StashKey[object]()
_SESSION_KEY = "harness_session_dir"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "precision-regression harness")
    group.addoption("--gpus", type=int, default=None, metavar="N",
                    help="devices the run may use; cases needing more are skipped "
                         "(default: the CUDA devices, or on CPU the CPU cores)")
    group.addoption("--harness-config", default=None, metavar="PATH",
                    help="test config (default: configs/test_config.json under the rootdir)")
    group.addoption("--harness-output", default=None, metavar="DIR",
                    help="where sessions write runs and results (default: reports/harness)")
    group.addoption("--harness-reference-cache", default=None, metavar="DIR",
                    help="single-device reference cache (default: <output>/reference-cache)")
    group.addoption("--harness-timeout", type=float, default=900.0, metavar="SECONDS",
                    help="per-run timeout; a run past it is killed with all its processes")
    group.addoption("--harness-device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="cuda, cpu (gloo, one process per device slot), or auto")


def _config_path(config: pytest.Config) -> Path:
    given = config.getoption("--harness-config")
    if given:
        return Path(given).resolve()
    return (config.rootpath / "configs" / "test_config.json").resolve()


def pytest_configure(config: pytest.Config) -> None:
    path = _config_path(config)
    config.addinivalue_line("markers", "harness: a precision case expanded from the test config")
    for tag in read_tags(path):
        config.addinivalue_line("markers", f"{tag}: test config tag {tag!r} ({path.name})")
    if config.getoption("--harness-config") and not any(
            path == Path(a.split("::")[0]).resolve() or Path(a).resolve() in path.parents
            for a in config.args):
        config.args.append(str(path))
    output = Path(config.getoption("--harness-output") or config.rootpath / "reports" / "harness")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _SESSION_KEY in workerinput:
        session_dir = Path(workerinput[_SESSION_KEY])
        worker = workerinput.get("workerid", "worker")
    else:
        session_dir = output / "sessions" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        worker = "main"
    cache = config.getoption("--harness-reference-cache")
    config.stash[_SETTINGS] = {
        "config_path": path, "output": output, "session_dir": session_dir, "worker": worker,
        "reference_root": Path(cache) if cache else output / "reference-cache",
    }
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(session_dir), "harness-xdist")


class _XdistHooks:
    def __init__(self, session_dir: Path) -> None:
        self.session_dir = session_dir

    def pytest_configure_node(self, node) -> None:  # every worker shares one session folder
        node.workerinput[_SESSION_KEY] = str(self.session_dir)


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".json" and file_path.resolve() == parent.config.stash[_SETTINGS]["config_path"]:
        return HarnessConfigFile.from_parent(parent, path=file_path)
    return None


class HarnessConfigFile(pytest.File):
    def collect(self):
        self.harness_config = load_config(self.path)
        for case in self.harness_config.cases:
            item = HarnessCaseItem.from_parent(self, name=case.name, case=case)
            item.add_marker("harness")
            item.add_marker(case.tag)
            yield item

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConfigError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


class CaseFailed(Exception):
    """A case that ran and failed; str() is the whole diagnosis."""


class HarnessCaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs) -> None:
        super().__init__(**kwargs)
        self.case = case

    def runtest(self) -> None:
        from harness.results import ResultsWriter, junit_properties

        runner = _runner(self.config, self.parent.harness_config)
        outcome = runner.run(self.case, self.nodeid)
        ResultsWriter(runner.settings.session_dir / "results.jsonl").append(outcome.record)
        self.user_properties.extend(junit_properties(outcome.record))
        if outcome.status == "skipped":
            pytest.skip(outcome.message)
        if outcome.status != "passed":
            raise CaseFailed(outcome.message)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.case.name} ({self.case.source})"


def _runner(config: pytest.Config, harness_config):
    if _RUNNER not in config.stash:
        from harness.runner import CaseRunner, Settings

        s = config.stash[_SETTINGS]
        device = config.getoption("--harness-device")
        if device == "auto":
            device = "cuda" if _cuda_count() else "cpu"
        slots = config.getoption("--gpus")
        if slots is None:
            slots = _cuda_count() if device == "cuda" else (os.cpu_count() or 1)
        # Leases are machine-wide for real GPUs, per session for virtual CPU slots.
        lease_dir = (Path("/tmp") / f"harness-device-leases-{os.getuid()}" if device == "cuda"
                     else s["session_dir"] / "leases")
        s["session_dir"].mkdir(parents=True, exist_ok=True)
        settings = Settings(
            session_id=s["session_dir"].name, session_dir=s["session_dir"],
            reference_root=s["reference_root"], lease_dir=lease_dir, slots=slots,
            device=device, timeout_s=config.getoption("--harness-timeout"), worker=s["worker"],
        )
        config.stash[_RUNNER] = CaseRunner(harness_config, settings)
    return config.stash[_RUNNER]


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is not None or _SETTINGS not in config.stash:
        return
    results = config.stash[_SETTINGS]["session_dir"] / "results.jsonl"
    if results.is_file():
        terminalreporter.write_line(f"harness results: {results}")
