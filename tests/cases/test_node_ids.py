"""harness.cases.node_ids: where a case is in its config file."""

from __future__ import annotations



def test_case_line_points_at_the_case_id_under_its_tag(tmp_path):
    from harness.cases.node_ids import case_line

    path = tmp_path / "c.json"
    path.write_text('{"test_groups": [\n {"tag": "a", "tests": [\n  {"id": "x"}]},\n'
                    ' {"tag": "b", "tests": [\n  {"id": "y"},\n  {"id": "x"}]}]}\n')
    assert case_line(path, "a", "x") == 3
    assert case_line(path, "b", "x") == 6
    assert case_line(path, "b", "zz") is None
    assert case_line(tmp_path / "missing.json", "a", "x") is None
