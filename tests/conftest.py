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
#   subprocess  starts another process: uses the `pytester` fixture, or its code (the test
#               function's source, or a helper of its module called by name) runs
#               subprocess / sys.executable / multiprocessing / run_process / runpytest
#   gpu         needs CUDA: its name or its marks say cuda / gpu
#   unit        the rest: in-process, no child process (the default tier)
#
# The fast tier: `python -m pytest -m unit` (README, "Tests"). Wall-clock bounds are not tests:
# they live in benchmarks/.

import inspect  # noqa: E402
import re  # noqa: E402

TIERS = ("unit", "subprocess", "torchrun", "gpu")
_SPAWNS = re.compile(r"\b(subprocess|sys\.executable|multiprocessing|run_process|runpytest|"
                     r"Popen|spawn_|launch_torchrun)\b")


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
    if "pytester" in getattr(item, "fixturenames", ()) or _SPAWNS.search(source):
        return "subprocess"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, _tier(item)))
