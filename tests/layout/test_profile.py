import json

import pytest

from harness.layout import LayerCosts, LayoutError
from harness.layout.profile import RECORD_FORMAT, read_profile


def record(layer, fwd, bwd, step=0, rank=0, **extra):
    return json.dumps({"format": RECORD_FORMAT, "step": step, "layer": layer, "forward_ms": fwd,
                       "backward_ms": bwd, "rank": rank, **extra})


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_json_records_give_median_of_forward_plus_backward_after_warmup(tmp_path):
    lines = []
    for step, (warm, times) in enumerate([(True, 100.0), (False, 1.0), (False, 3.0), (False, 2.0)]):
        lines += [record(0, times, times, step), record(1, times / 2, 0.0, step),
                  record("embedding", 0.25, 0.25, step), record("lm_head", 2.0, 2.0, step, microbatch=0)]
    costs = read_profile([write(tmp_path, "p.jsonl", lines)])
    assert costs == LayerCosts((4.0, 1.0), 0.5, 4.0)


def test_warmup_is_per_rank_and_file(tmp_path):
    a = write(tmp_path, "a.jsonl", [record(0, 50, 0, 0, rank=0), record(0, 1, 0, 1, rank=0),
                                    record(0, 50, 0, 0, rank=1), record(0, 1, 0, 1, rank=1)])
    b = write(tmp_path, "b.jsonl", [record(1, 50, 0, 0), record(1, 3, 0, 1)])
    assert read_profile([a, b]).layers == (1.0, 3.0)
    assert read_profile([a, b], warmup_samples=0).layers == (25.5, 26.5)


def test_infinitrain_text_records_use_device_time_else_host(tmp_path):
    path = write(tmp_path, "prof.txt", [
        "Name                 Device   Host(us)  Device(us)  Peak",
        "TransformerLayer.0   cuda:0   900       800         12MB",
        "TransformerLayer.0   cuda:0   500       400         12MB",
        "TransformerLayer.1   cpu      300       0           0",
        "TransformerLayer.1   cpu      200       0           0",
        "Embedding            cuda:0   1         1           0",
    ])
    assert read_profile([path]).layers == (0.4, 0.2)


@pytest.mark.parametrize("lines, message", [
    (["{not json"], "p.jsonl:1: not JSON"),
    ([record(0, 1, 1), '{"format": "other/1"}'], "p.jsonl:2: format is 'other/1'"),
    ([record(0, 1, 1), record(-1, 1, 1)], "p.jsonl:2: layer -1 is not a layer index"),
    ([record(0, 1, 1), record("head", 1, 1)], "p.jsonl:2: layer 'head'"),
    ([record(0, 1, 1), record(0, "1", 1)], "p.jsonl:2: forward_ms '1' is not a finite number"),
    ([record(0, 1, -1)], "p.jsonl:1: backward_ms -1"),
    ([record(0, 1, 1, step=1.5)], "p.jsonl:1: step 1.5 is not an integer"),
    ([record(0, 1, 1, rank=True)], "p.jsonl:1: rank True is not an integer"),
    ([record(0, 1, 1), "", "TransformerLayer.0 cpu 1 1 0"], "p.jsonl:3: not JSON"),
])
def test_bad_json_records_name_file_and_line(tmp_path, lines, message):
    with pytest.raises(LayoutError, match=message.replace("(", r"\(")) as err:
        read_profile([write(tmp_path, "p.jsonl", lines)])
    assert RECORD_FORMAT in str(err.value)


@pytest.mark.parametrize("lines, message", [
    (["TransformerLayer.0 cuda:0 12"], "p.txt:1: malformed record"),
    (["TransformerLayer.0 cuda:0 abc 1 0"], "p.txt:1: malformed record"),
    (["header", "TransformerLayer.0 cuda:0 nan 1 0"], "p.txt:2: times in"),
    (["header only"], "p.txt: no layer timing records"),
    ([""], "p.txt: profile is empty"),
])
def test_bad_text_records_name_file_and_line(tmp_path, lines, message):
    with pytest.raises(LayoutError, match=message):
        read_profile([write(tmp_path, "p.txt", lines)])


def test_missing_layer_and_warmup_exhaustion(tmp_path):
    gap = write(tmp_path, "gap.jsonl", [record(0, 1, 1), record(2, 1, 1)])
    with pytest.raises(LayoutError, match="no records for layer\\(s\\) 1; expected every layer 0..2"):
        read_profile([gap], warmup_samples=0)
    short = write(tmp_path, "short.jsonl", [record(0, 1, 1), record(0, 1, 1, step=1), record(1, 1, 1)])
    with pytest.raises(LayoutError, match="layer 1 has 1 sample\\(s\\), all dropped as warm-up \\(--warmup-samples 1\\)"):
        read_profile([short])
    only_head = write(tmp_path, "head.jsonl", [record("lm_head", 1, 1)])
    with pytest.raises(LayoutError, match="no transformer layer records"):
        read_profile([only_head], warmup_samples=0)


def test_unreadable_file_and_bad_warmup(tmp_path):
    with pytest.raises(LayoutError, match="missing.jsonl: cannot read profile"):
        read_profile([tmp_path / "missing.jsonl"])
    with pytest.raises(LayoutError, match="--warmup-samples must be an integer >= 0"):
        read_profile([tmp_path / "x"], warmup_samples=-1)
