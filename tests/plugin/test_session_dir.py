import harness.plugin
from harness.plugin import _new_session_dir


def test_two_sessions_started_in_one_second_by_one_process_get_their_own_folders(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(harness.plugin.time, "strftime", lambda _format: "20261129-120000")
    first = _new_session_dir(tmp_path)
    first.mkdir()
    second = _new_session_dir(tmp_path)
    assert second != first and second.name == f"{first.name}-2"
    assert sorted([first.name, second.name])[-1] == second.name  # name order is still time order
