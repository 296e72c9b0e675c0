import harness.session_folder
from harness.session_folder import new_session_dir


def test_two_sessions_started_in_one_second_by_one_process_get_their_own_folders(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(harness.session_folder.time, "strftime", lambda _format: "20261129-120000")
    first = new_session_dir(tmp_path)
    first.mkdir()
    second = new_session_dir(tmp_path)
    assert second != first and second.name == f"{first.name}-2"
    assert sorted([first.name, second.name])[-1] == second.name  # name order is still time order
