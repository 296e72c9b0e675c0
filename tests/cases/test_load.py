"""harness.cases.load: reading and parsing a config file (the shipped one, bad JSON)."""

from __future__ import annotations

import pytest

from harness.cases import ConfigError, load_config
from tests.cases.config_files import ROOT


def test_shipped_config_loads_with_the_layout_matrix():
    config = load_config(ROOT / "configs" / "test_config.json")
    assert config.tags == ("basic", "pipeline_layout", "schedules")
    names = [c.name for c in config.cases]
    assert len(names) == len(set(names))
    layout = [c for c in config.cases if c.tag == "pipeline_layout"]
    assert {c.model for c in layout} == {"gpt2", "llama3"}
    for kind in ("partition", "costs", "chunks", "megatron"):
        for parallel in ("pp2-", "pp2-dp2-", "pp2-tp2-"):
            assert any(c.case_id.startswith(parallel) and kind in c.case_id for c in layout), (kind, parallel)
    assert max(c.world_size for c in config.cases) == 8
    # The layout matrix stays mostly small; the schedule matrix is mostly 8 devices (PP x DP x
    # TP per schedule, nightly) and its CI cost is bounded in tests/trainer/test_coverage.py.
    small = [c for c in config.cases if c.tag != "schedules"]
    assert sum(c.world_size <= 4 for c in small) >= 0.75 * len(small)
    assert all(c.flags["num_iteration"] == 4 for c in config.cases)  # typed "@ITERATIONS@"


def test_invalid_json_and_nan_are_refused(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"test_groups": [}')
    with pytest.raises(ConfigError, match=r"c.json: invalid JSON at line 1 column 18"):
        load_config(path)
    path.write_text('{"tolerances": {"float32": {"loss": {"atol": NaN}}}, "test_groups": []}')
    with pytest.raises(ConfigError, match="NaN is not a number JSON allows"):
        load_config(path)
