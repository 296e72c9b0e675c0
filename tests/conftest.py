import pytest


@pytest.fixture(scope="session")
def tiny_assets():
    """The built-in synthetic llm.c files (generated once, cached, shared by xdist workers)."""
    from harness.assets import ensure_assets

    return ensure_assets("tiny")
