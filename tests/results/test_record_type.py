"""The typed result record: one field list, the doc table generated from it, /1 and /2 records
read back, unknown keys refused with where they are."""

from __future__ import annotations

import dataclasses

import json

import pytest

from harness.results import FIELDS, ResultsWriter, new_record, read_results
from harness.results.result_record import (
    DOC_PATH,
    WRITE_DOC,
    Logs,
    Parallel,
    Reference,
    ResultRecord,
    Timings,
    doc_block,
    documented_block,
)


def test_doc_table_is_generated_from_the_fields():
    block = documented_block(DOC_PATH.read_text())
    assert block is not None, f"{DOC_PATH} lost its generated field table"
    assert block == doc_block(), f"{DOC_PATH} is out of date; run: {WRITE_DOC}"
    for name in FIELDS:
        assert f"| `{name}` |" in block


def test_fields_are_the_dataclass_and_new_record_has_them_all():
    assert FIELDS[0] == "format" and len(FIELDS) == len(set(FIELDS))
    assert tuple(ResultRecord().to_json()) == FIELDS
    assert tuple(new_record()) == FIELDS


def test_round_trip_keeps_the_json():
    record = ResultRecord(
        status="failed", name="t/gpt2/x", errors=["boom"],
        parallel=Parallel(pp=2, tp=1, dp=1, vpp=1, sequence_parallel=False, schedule="1F1B"),
        reference=Reference(key="k", path="/p", built=True, command=["a"]),
        logs=Logs(launcher_stdout="o", launcher_stderr="e", ranks={0: ["r0"]}),
        timings=Timings(reference_s=1.0, total_s=2.0),
        losses=[1.0, float("nan")])
    data = record.to_json()
    assert data["timings"] == {"reference_s": 1.0, "total_s": 2.0}  # phases not reached: absent
    assert data["parallel"]["schedule"] == "1F1B"
    assert data["logs"]["ranks"] == {"0": ["r0"]} and data["losses"] == [1.0, "nan"]
    assert ResultRecord.from_json(json.loads(json.dumps(data))).to_json() == data
    assert "schedule" not in ResultRecord(parallel=Parallel(pp=1)).to_json()["parallel"]


def test_version_1_records_are_read():
    old = {k: v for k, v in new_record(status="passed").items()
           if k not in ("trainer", "passthrough_flags")}
    old["format"] = "harness.result/1"
    back = ResultRecord.from_json(old)
    assert back.trainer is None and back.format == "harness.result/1"


@pytest.mark.parametrize("data, key", [
    ({**new_record(status="passed"), "bogus": 1}, "'bogus'"),
    ({**new_record(status="passed"), "timings": {"run_s": 1, "nap_s": 2}}, "'timings.nap_s'"),
])
def test_unknown_keys_name_the_key_and_the_line(tmp_path, data, key):
    path = tmp_path / "results.jsonl"
    good = json.dumps(new_record(status="passed"))
    path.write_text(good + "\n" + json.dumps(data) + "\n")
    with pytest.raises(ValueError, match=f"results.jsonl:2: unknown key {key}"):
        read_results(path)


def test_unknown_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="format 'harness.result/9'"):
        ResultRecord.from_json({"format": "harness.result/9"}, where="x:1")


def test_writer_takes_the_typed_record(tmp_path):
    path = tmp_path / "results.jsonl"
    ResultsWriter(path).append(ResultRecord(status="passed", name="a/b/c"))
    assert read_results(path)[0]["name"] == "a/b/c"
    with pytest.raises(TypeError, match="'tokens'"):
        ResultRecord(tokens=1)  # a name that is no field is refused, not a new key
    with pytest.raises(dataclasses.FrozenInstanceError):
        ResultRecord().status = "passed"  # assembled once: nothing fills a record in later
