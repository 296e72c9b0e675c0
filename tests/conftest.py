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
