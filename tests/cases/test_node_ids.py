"""harness.cases.node_ids: where a case is in its config file, and which cases a
--harness-cases selection keeps."""

from __future__ import annotations

import pytest

from harness.cases.node_ids import case_selected, parse_case_patterns


def test_case_line_points_at_the_case_id_under_its_tag(tmp_path):
    from harness.cases.node_ids import case_line

    path = tmp_path / "c.json"
    path.write_text('{"test_groups": [\n {"tag": "a", "tests": [\n  {"id": "x"}]},\n'
                    ' {"tag": "b", "tests": [\n  {"id": "y"},\n  {"id": "x"}]}]}\n')
    assert case_line(path, "a", "x") == 3
    assert case_line(path, "b", "x") == 6
    assert case_line(path, "b", "zz") is None
    assert case_line(tmp_path / "missing.json", "a", "x") is None


def test_case_patterns_match_the_cases_own_name_part_by_part():
    patterns = parse_case_patterns("basic/gpt2/1, basic/*/4,lora/llama3/*")
    assert patterns == ("basic/gpt2/1", "basic/*/4", "lora/llama3/*")
    assert case_selected("basic/gpt2/1", patterns)
    assert not case_selected("basic/gpt2/1_bfloat16", patterns)  # ids are whole, not substrings
    assert case_selected("basic/llama3/4", patterns)
    assert not case_selected("zero/llama3/4", patterns)
    assert case_selected("lora/llama3/2_lora", patterns)
    assert parse_case_patterns(None) == () and parse_case_patterns("") == ()


@pytest.mark.parametrize("text", ["basic/gpt2", "basic//1", "a/b/c/d"])
def test_a_pattern_that_is_not_tag_model_id_is_one_line(text):
    with pytest.raises(ValueError, match=r"--harness-cases .*: expected tag/model/id"):
        parse_case_patterns(text)
