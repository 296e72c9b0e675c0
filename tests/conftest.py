import pytest


@pytest.fixture(scope="session")
def tiny_assets():
    """The built-in synthetic llm.c files (generated once, cached, shared by xdist workers)."""
    from harness.assets import ensure_assets

    return ensure_assets("tiny")


@pytest.fixture(autouse=True)
def _isolated_session_location(tmp_path_factory, monkeypatch):
    """Tests never read or move the user's last-session pointer, nor follow their
    $HARNESS_OUTPUT (harness.results.location); the outer session's own pointer is written at
    its end, after every fixture is gone."""
    monkeypatch.setenv("HARNESS_LAST_SESSION",
                       str(tmp_path_factory.mktemp("pointer") / "last_session"))
    monkeypatch.delenv("HARNESS_OUTPUT", raising=False)


# ---------------------------------------------------------------------- test tiers
#
# Every test gets exactly one tier marker, applied here at collection (pyproject registers them):
#
#   torchrun    launches the trainer's ranks: already marked `slow`, or the harness's own config
#               cases (configs/test_config.json items), or a test whose code names torchrun
#   subprocess  starts another process: uses the `pytester` or `slurm` (a Slurm cluster and its
#               jobs) fixture, or its code (the test function's source, or a helper of its
#               module called by name) runs subprocess / sys.executable / multiprocessing /
#               run_process / runpytest
#   gpu         needs CUDA: its name or its marks say cuda / gpu
#   heavy       in-process, no child process, but over a second a test on the 2-core machine
#               (`--durations=50` of `-m unit`): models against Hugging Face, the trainer's CLI
#               and the InfiniTrain stand-in run in process, damaged-file and fuzz sweeps, the
#               report's plots, the solver against brute force. Listed by node-id prefix in
#               HEAVY below (a whole module when its time is in such tests or in a shared
#               import they all pay, such as transformers); re-measure when adding a slow one
#   unit        the rest: in-process, no child process (the default tier)
#
# The fast tier: `python -m pytest -m unit` (README, "Tests"; under a minute on the 2-core
# machine); `-m "unit or heavy"` adds the in-process rest. Wall-clock bounds are not tests:
# they live in benchmarks/.

import inspect  # noqa: E402
import re  # noqa: E402

TIERS = ("unit", "heavy", "subprocess", "torchrun", "gpu")
_SPAWNS = re.compile(r"\b(subprocess|sys\.executable|multiprocessing|run_process|runpytest|"
                     r"Popen|spawn_|launch_torchrun)\b")
HEAVY = (
    "tests/trainer/test_models_gpt2.py", "tests/trainer/test_models_llama3.py",
    "tests/trainer/test_trainer_cli.py", "tests/trainer/test_profiling.py",
    "tests/infinitrain_standin/test_standin.py",
    "tests/reliability/test_damaged_files.py", "tests/reliability/test_fuzz_config.py",
    "tests/reliability/test_fuzz_trainer_flags.py", "tests/reliability/test_fuzz_layout.py",
    "tests/report/test_report.py", "tests/report/test_plots.py",
    "tests/layout/test_solver.py::test_solver_matches_brute_force",
    "tests/layout/test_solver.py::test_solver_is_deterministic_and_scale_invariant",
    "tests/layout/test_layout.py::test_json_and_chunk_layout_round_trip",
    "tests/layout/test_layout.py::test_invariants",
    "tests/layout/test_layout.py::test_megatron_round_trip",
    "tests/layout/test_suggest.py::test_tool_agrees_with_from_costs",
)


_HELPERS: dict[str, set[str]] = {}


def _spawning_helpers(module) -> set[str]:
    """The module's own functions whose source starts a process (called by name from tests)."""
    if module.__name__ in _HELPERS:
        return _HELPERS[module.__name__]
    found = _HELPERS[module.__name__] = set()
    for name, value in vars(module).items():
        if inspect.isfunction(value) and value.__module__ == module.__name__ \
                and not name.startswith("test"):
            try:
                if _SPAWNS.search(inspect.getsource(value)):
                    found.add(name)
            except (OSError, TypeError):
                pass
    return found


def _tier(item) -> str:
    marks = {m.name for m in item.iter_markers()}
    if marks & set(TIERS):
        return next(t for t in TIERS if t in marks)
    if "slow" in marks or not hasattr(item, "function"):  # config cases run the trainer
        return "torchrun"
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError):
        source = ""
    if "cuda" in item.name.lower() or "gpu" in item.name.lower():
        return "gpu"
    if "torchrun" in source:
        return "torchrun"
    if {"pytester", "slurm"} & set(getattr(item, "fixturenames", ())) or _SPAWNS.search(source):
        return "subprocess"
    helpers = _spawning_helpers(item.module) if getattr(item, "module", None) else set()
    if any(re.search(rf"\b{re.escape(h)}\(", source) for h in helpers):
        return "subprocess"
    if item.nodeid.startswith(HEAVY):
        return "heavy"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, _tier(item)))
