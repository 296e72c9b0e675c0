"""Layout groups are keyed by what is computed (flag roles mathematics and topology, from
harness.contracts.flags), not by a hand list of flags to ignore.

Planted: records as the runner wrote them before it left its run-private paths out of
`flags` (each with its own `dump_parameter_updates`). The hand list missed that flag, so no two
cases ever grouped and the report's "Layout throughput" section was gone."""

from __future__ import annotations

from harness.report.case_view import view
from harness.report.throughput import layout_groups


def _record(name: str, partition: str, tokens_per_s: float, **flags) -> dict:
    first = int(partition.split(",")[0])
    return {"name": f"pl/gpt2/{name}", "model": "gpt2", "status": "passed",
            "parallel": {"pp": 2, "tp": 1, "dp": 1, "vpp": 1, "schedule": "1F1B"},
            "layout": {"num_layers": 8, "pp": 2, "vpp": 1,
                       "chunks": [[0, 0, first], [1, first, 8]]},
            "tokens_per_s": tokens_per_s, "step_time_ms": 1000.0 / tokens_per_s,
            "flags": {"pipeline_parallel": 2, "dtype": "float32",
                      "pipeline_layer_partition": partition, **flags}}


def test_cases_differing_in_run_paths_only_still_group():
    records = [_record("uniform", "4,4", 100.0, dump_parameter_updates="/s/uniform/updates",
                       output_dir="/s/uniform", profile_layers="/s/uniform/layers.jsonl"),
               _record("skew", "5,3", 120.0, dump_parameter_updates="/s/skew/updates",
                       output_dir="/s/skew")]
    groups = layout_groups([view(r) for r in records])
    assert len(groups) == 1 and len(groups[0].members) == 2


def test_a_mathematics_flag_still_splits_groups():
    records = [_record("a", "4,4", 100.0, learning_rate=1e-3),
               _record("b", "5,3", 120.0, learning_rate=1e-2)]
    assert layout_groups([view(r) for r in records]) == []
