import os
import sys
from pathlib import Path

import pytest

from tests.tiers import MODULES, OWN_MARKS, PYTEST_MARKS, TESTS, TIERS, selects_none_of_ours

REPO = Path(__file__).resolve().parents[1]
TESTS_DIR = REPO / "tests"
_NONE_OF_OURS = pytest.StashKey[bool]()


_COMPILED: dict = {}


def _evaluate(markexpr: str, marks: set[str]) -> bool:
    # pytest's own -m evaluation (pytest exports no public one); compiled once per expression
    compiled = _COMPILED.get(markexpr)
    if compiled is None:
        from _pytest.mark.expression import Expression
        compiled = _COMPILED[markexpr] = Expression.compile(markexpr)
    return compiled.evaluate(lambda name, **kwargs: name in marks)


def pytest_configure(config):
    ours = config.rootpath == REPO  # not a session a test starts elsewhere
    if ours and hasattr(config, "workerinput"):
        # An xdist worker: the processes its tests start (sessions, their single-device
        # references) run with one OpenMP thread, as the harness runs CPU ranks
        # (harness.launch.backends), not with every core each beside the other workers.
        # Measured on 2 cores: one session-heavy test alone 36.3 -> 30.1 s; whole fresh-clone
        # CI runs vary more than that here (11 min 14 s to 12 min 30 s with it).
        threads = os.environ.setdefault("OMP_NUM_THREADS", "1")
        if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:
            sys.modules["torch"].set_num_threads(int(threads))
    try:
        none = ours and selects_none_of_ours(config.option.markexpr or "", _evaluate)
    except Exception:  # an expression pytest will refuse itself, or a pytest without the module
        none = False
    config.stash[_NONE_OF_OURS] = none
    if ours and not config.pluginmanager.hasplugin("pytester"):
        # pytester, for every folder of tests/ (in a conftest below the rootdir's,
        # `pytest_plugins` is not allowed)
        config.pluginmanager.import_plugin("pytester")
    if ours and not none:
        # Imported before any test: pytester's in-process runs drop the modules first imported
        # inside them from sys.modules, and neither numpy's nor torch's C extension can be
        # loaded a second time in one process. Seen when tests/launch ran alone: numpy's
        # "cannot load module more than once", torch's "bad call flags", then a segfault in a
        # later garbage collection. Not in a session a test starts with its config under
        # tests/ (InfiniTrain's, its rootdir elsewhere), which loads this conftest too but runs
        # no test of ours: torch cost each of them, and each of its xdist workers, 1.5 s.
        import numpy  # noqa: F401
        try:
            import torch  # noqa: F401
        except ImportError:  # the torch-free tiers run without it
            pass


def pytest_ignore_collect(collection_path, config):
    """With a -m that no test of ours can match (the main job's `-m pipeline_layout`), tests/
    is not collected at all: see tests/tiers.py."""
    if config.stash.get(_NONE_OF_OURS, False) and collection_path.is_relative_to(TESTS_DIR):
        return True
    return None


@pytest.fixture(scope="session")
def tiny_assets():
    """The built-in synthetic llm.c files (generated once, cached, shared by xdist workers)."""
    from harness.assets import ensure_assets

    return ensure_assets("tiny")


@pytest.fixture(autouse=True)
def _seeded_random_state():
    """Each test starts from the same numpy and torch random state, whatever ran before it on
    its xdist worker: an unseeded draw otherwise depends on the tests' order, which xdist's load
    balancing changes from run to run (test_gpt2_tied_head_is_one_parameter passed or failed
    by that)."""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(0)


# The pytest plugins that installed packages register (hypothesis', anyio's) and that no
# session a test starts uses: they cost each pytest process it starts (and each of that
# session's xdist workers) 0.35 s of a 0.85 s start on the 2-core machine, and the suite starts
# at least 118 of them.
INNER_SESSION_ARGS = ("-p", "no:hypothesispytest", "-p", "no:anyio")


@pytest.fixture(autouse=True)
def _lean_inner_sessions(request, monkeypatch):
    """Every pytest a test starts (pytester's subprocess runs, `python -m pytest` commands)
    gets INNER_SESSION_ARGS through PYTEST_ADDOPTS. pytester discards the outer session's
    PYTEST_ADDOPTS when it is set up, so it is set up first and the variable set after."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")
    outer = os.environ.get("PYTEST_ADDOPTS", "")
    monkeypatch.setenv("PYTEST_ADDOPTS", " ".join([outer, *INNER_SESSION_ARGS]).strip())


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
# Every test gets exactly one tier marker (pyproject registers them), declared in tests/tiers.py
# (by file, with the tests that differ listed by name) unless the test carries a tier mark of
# its own. A test with neither fails with what to add, so no test lands in a tier by a guess.

_UNDECLARED = pytest.StashKey[str]()


def declared_tier(nodeid: str) -> str | None:
    """The tier tests/tiers.py declares for a node id (its parameters left out), or None."""
    path, _, rest = nodeid.partition("::")
    test = rest.split("[", 1)[0]
    return TESTS.get(f"{path}::{test}") or MODULES.get(path)


_MARKS_OF_OURS = set(TIERS) | set(OWN_MARKS) | set(PYTEST_MARKS)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config, items):
    # A session a test starts (pytester, its rootdir elsewhere) with a config file that lives
    # under tests/ loads this conftest too: its cases are that session's, no tests of ours.
    inner = config.rootpath != REPO
    for item in items:
        if inner and item.path.is_relative_to(REPO):
            continue
        if isinstance(item, pytest.Function):  # a test function, not a config's case
            foreign = sorted({m.name for m in item.iter_markers()} - _MARKS_OF_OURS)
            if foreign:  # it would be skipped by a -m that names them (tests/tiers.py)
                item.stash[_UNDECLARED] = (
                    f"{item.nodeid} carries the mark(s) {', '.join(foreign)}: a test of ours "
                    f"carries only {', '.join(sorted(_MARKS_OF_OURS))}; add a new one to "
                    f"OWN_MARKS in tests/tiers.py")
                continue
        if any(m.name in TIERS for m in item.iter_markers()):
            continue
        tier = declared_tier(item.nodeid)
        if tier is None:
            path = item.nodeid.partition("::")[0]
            item.stash[_UNDECLARED] = (
                f"{item.nodeid} has no tier: add {path!r} to MODULES in tests/tiers.py (or the "
                f"test to TESTS), or mark it with one of {', '.join(TIERS)}")
            continue
        item.add_marker(getattr(pytest.mark, tier))


def pytest_runtest_setup(item):
    if _UNDECLARED in item.stash:
        pytest.fail(item.stash[_UNDECLARED], pytrace=False)
