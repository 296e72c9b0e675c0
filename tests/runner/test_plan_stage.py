"""The plan stage refuses a layout that cannot place the model's layers, as a config error,
before anything launches: launched, the bundled trainer's own refusal would read as a crashed
run (`failed`), which a nightly counts as a numerical regression."""

from __future__ import annotations

import json


def test_a_bad_layout_is_a_config_error_and_nothing_is_launched(tmp_path, tiny_assets):
    from harness.cases import load_config
    from harness.runner import CaseRunner, Settings

    config_path = tmp_path / "cases.json"
    config_path.write_text(json.dumps({
        "models": ["gpt2"],
        "test_groups": [{"tag": "bad", "tests": [
            {"id": "neg", "args": {"pipeline_parallel": 2, "pipeline_layer_partition": "9,-1"}}]}]}))
    config = load_config(config_path)
    settings = Settings(session_id="s", session_dir=tmp_path / "session",
                        reference_root=tmp_path / "refs", lease_dir=tmp_path / "leases",
                        slots=2, device="cpu", timeout_s=60)
    outcome = CaseRunner(config, settings).run(config.cases[0])
    assert outcome.status == "error", outcome.message
    assert "bad/gpt2/neg: --pipeline_layer_partition '9,-1'" in outcome.message
    assert "'-1' is not positive" in outcome.message
    record = outcome.record
    assert record["command"] is None and record["reference"] is None  # nothing ran
    assert not (tmp_path / "refs").exists() or not any((tmp_path / "refs").iterdir())
