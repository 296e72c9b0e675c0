"""harness.contracts.trace: InfiniTrain's `--precision_check` folder read as data (the timestamp
folder, per-rank logs, `<name>[_idx]_<phase>` entries, malformed input named by file and line)
and the pairing facts (prefix, InfiniTrain-only modules with their why and source, a pipeline
stage's local layer index made global). Trace folders are written here in the exact format of
precision_checker.cc:352-371 (`write_rank`, also used by tests/compare/test_trace.py)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.contracts.trace import (IDENTITY, PAIRINGS, TraceError, find_trace_root,
                                     globalize_layer, pairing_of, read_trace, split_logged,
                                     trace_ranks)

STAMP = "20261205_142103"


# ------------------------------------------------------------------------------ the writer

def _g(value: float) -> str:
    """A float as C++'s default ostream prints it (%g, 6 significant digits)."""
    return f"{float(value):.6g}"


def log_line(logged: str, array: np.ndarray, tensor: int = 0, context: str = "") -> str:
    """One line as precision_checker.cc:352-371 writes it."""
    flat = np.asarray(array, np.float32).reshape(-1)
    finite = flat[np.isfinite(flat)]
    nan, inf = int(np.isnan(flat).sum()), int(np.isinf(flat).sum())
    lo, hi, mean = ((_g(finite.min()), _g(finite.max()), _g(finite.mean())) if finite.size
                    else ("nan", "nan", "nan"))
    values = ", ".join(_g(v) for v in flat[:6]) + (", ..." if flat.size > 6 else "")
    key = "[GAS-0] [L-0]" + (f" {context}" if context else "")
    shape = ",".join(str(d) for d in np.shape(array))
    return (f"{key} {logged} tensor[{tensor}]: dtype=float32 shape=({shape}) min={lo} max={hi} "
            f"mean={mean} [{values}] [NaN:{nan} Inf:{inf}]" + (" <- ERROR" if nan or inf else ""))


def write_rank(root, rank: int, calls, *, iterations: int = 1, context: str = "") -> list[str]:
    """Rank `rank`'s log and rank_<R>/*.npy under the timestamp folder `root`. `calls`:
    (module, phase, array) in execution order; the index suffix is counted as SaveNpy does
    (counters restart each iteration; the log keeps every iteration, the files the last).
    Returns the logged names of one iteration."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"rank_{rank}").mkdir(exist_ok=True)
    lines: list[str] = []
    for _ in range(iterations):
        counters: dict[tuple[str, str], int] = {}
        logged_names = []
        for module, phase, array in calls:
            idx = counters.get((module, phase), 0)
            counters[(module, phase)] = idx + 1
            logged = f"{module}_{idx}_{phase}" if idx else f"{module}_{phase}"
            logged_names.append(logged)
            array = np.asarray(array, np.float32)
            np.save(root / f"rank_{rank}" / f"{logged}.npy", array)
            lines.append(log_line(logged, array, context=context))
    (root / f"precision_check_rank_{rank}.log").write_text("\n".join(lines) + "\n")
    return logged_names


def small(seed: int = 0, shape=(2, 3)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


CALLS = [("transformer.wte", "forward", small(1)),
         ("transformer.h.0.ln_1", "forward", small(2)),
         ("transformer.h.0.mlp.gelu", "forward", small(3)),
         ("CrossEntropyLoss", "forward", np.float32(5.5)),
         ("CrossEntropyLoss", "backward", np.float32(1.0)),
         ("transformer.h.0.mlp.gelu", "backward", small(4)),
         ("transformer.h.0.ln_1", "backward", small(5))]


@pytest.fixture
def stamp(tmp_path):
    root = tmp_path / "dump" / STAMP
    write_rank(root, 0, CALLS)
    return root


# ------------------------------------------------------------------------- the folder

def test_the_one_timestamp_folder_under_the_path_is_found(stamp):
    assert find_trace_root(stamp.parent) == stamp


def test_the_timestamp_folder_given_directly_is_itself(stamp):
    assert find_trace_root(stamp) == stamp
    assert find_trace_root(str(stamp)) == stamp


def test_two_timestamp_folders_are_an_error_naming_both(stamp):
    other = stamp.parent / "20261205_150000"
    write_rank(other, 0, CALLS[:1])
    with pytest.raises(TraceError) as error:
        find_trace_root(stamp.parent)
    assert STAMP in str(error.value) and "20261205_150000" in str(error.value)
    assert "2 timestamp folders" in str(error.value)


def test_no_timestamp_folder_is_an_error(tmp_path):
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "not_a_stamp").mkdir()
    with pytest.raises(TraceError, match=r"0 timestamp folders \(none\)"):
        find_trace_root(tmp_path / "dump")
    with pytest.raises(TraceError, match="no precision-check folder"):
        find_trace_root(tmp_path / "absent")


def test_ranks_are_the_logs_found_and_rank_0_is_required(tmp_path):
    root = tmp_path / STAMP
    for rank in (0, 2, 10, 1):
        write_rank(root, rank, CALLS[:1])
    assert trace_ranks(root) == [0, 1, 2, 10]
    (root / "precision_check_rank_0.log").unlink()
    with pytest.raises(TraceError) as error:
        trace_ranks(root)
    assert "precision_check_rank_0.log" in str(error.value)
    assert "1, 2, 10" in str(error.value)


def test_no_log_at_all_names_none(tmp_path):
    root = tmp_path / STAMP
    root.mkdir()
    with pytest.raises(TraceError, match=r"ranks found: none"):
        trace_ranks(root)


def test_a_missing_log_or_rank_folder_is_an_error(stamp):
    with pytest.raises(TraceError, match="precision_check_rank_1.log: missing"):
        read_trace(stamp, 1)
    for path in (stamp / "rank_0").iterdir():
        path.unlink()
    (stamp / "rank_0").rmdir()
    with pytest.raises(TraceError) as error:
        read_trace(stamp, 0)
    assert "rank_0" in str(error.value) and "save_tensors=true" in str(error.value)


def test_a_malformed_line_names_its_file_and_line(stamp):
    log = stamp / "precision_check_rank_0.log"
    lines = log.read_text().splitlines()
    lines[2] = "[GAS-0] [L-0] transformer.h.0.mlp.gelu_forward: a line of another form"
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as error:
        read_trace(stamp, 0)
    assert f"{log}:3:" in str(error.value)


def test_a_logged_file_missing_is_an_error_naming_it(stamp):
    (stamp / "rank_0" / "transformer.h.0.ln_1_backward.npy").unlink()
    with pytest.raises(TraceError) as error:
        read_trace(stamp, 0)
    assert "transformer.h.0.ln_1_backward.npy: missing" in str(error.value)
    assert "line 7" in str(error.value)


def test_an_empty_log_is_an_error(tmp_path):
    root = tmp_path / STAMP
    (root / "rank_0").mkdir(parents=True)
    (root / "precision_check_rank_0.log").write_text("\n")
    with pytest.raises(TraceError, match="no entries"):
        read_trace(root, 0)


# ------------------------------------------------------------------------- the entries

def test_entries_in_execution_order_with_their_fields(stamp):
    trace = read_trace(stamp, 0)
    assert trace.rank == 0 and trace.root == stamp
    assert [(e.module, e.phase, e.index) for e in trace.entries] == \
        [(m, p, 0) for m, p, _ in CALLS]
    assert [e.order for e in trace.entries] == list(range(len(CALLS)))
    first = trace.entries[0]
    assert first.shape == (2, 3) and first.dtype == "float32" and first.tensor == 0
    assert first.nan == 0 and first.inf == 0
    assert first.file == stamp / "rank_0" / "transformer.wte_forward.npy"
    loss = trace.entries[3]
    assert loss.shape == () and loss.label == "CrossEntropyLoss forward"


def test_index_suffixes_follow_the_counter(tmp_path):
    root = tmp_path / STAMP
    a, b = small(1), small(2)
    names = write_rank(root, 0, [("transformer.h.0", "forward", a),
                                 ("transformer.h.0", "forward", b),
                                 ("transformer.h.0", "backward", b),
                                 ("transformer.h.0", "backward", a)])
    assert names == ["transformer.h.0_forward", "transformer.h.0_1_forward",
                     "transformer.h.0_backward", "transformer.h.0_1_backward"]
    entries = read_trace(root, 0).entries
    assert [(e.module, e.phase, e.index) for e in entries] == [
        ("transformer.h.0", "forward", 0), ("transformer.h.0", "forward", 1),
        ("transformer.h.0", "backward", 0), ("transformer.h.0", "backward", 1)]
    assert entries[1].label == "transformer.h.0 forward#1"
    assert entries[1].file.name == "transformer.h.0_1_forward.npy"


def test_a_module_whose_own_name_ends_in_digits_stays_whole(tmp_path):
    root = tmp_path / STAMP
    write_rank(root, 0, [("block_3", "forward", small(1)), ("block_3", "forward", small(2)),
                         ("block", "forward", small(3))])
    entries = read_trace(root, 0).entries
    assert [(e.module, e.index) for e in entries] == [("block_3", 0), ("block_3", 1),
                                                      ("block", 0)]
    assert [e.file.name for e in entries] == ["block_3_forward.npy", "block_3_1_forward.npy",
                                              "block_forward.npy"]


def test_split_logged():
    seen: dict = {}
    assert split_logged("transformer.h.0_forward", seen) == ("transformer.h.0", "forward", 0)
    assert split_logged("h_3_backward", seen) == ("h_3", "backward", 0)
    seen[("transformer.h.0", "forward")] = 1
    assert split_logged("transformer.h.0_1_forward", seen) == ("transformer.h.0", "forward", 1)
    # the counter says call 1 is due, not call 2: the suffix is the module's own name
    assert split_logged("transformer.h.0_2_forward", seen) == ("transformer.h.0_2", "forward", 0)
    with pytest.raises(TraceError, match="_forward or _backward"):
        split_logged("transformer.h.0_sideways", seen)


def test_a_layer_name_context_word_is_skipped(tmp_path):
    root = tmp_path / STAMP
    write_rank(root, 0, CALLS[:2], context="attn_out")
    assert "[GAS-0] [L-0] attn_out transformer.wte_forward tensor[0]" in \
        (root / "precision_check_rank_0.log").read_text()
    entries = read_trace(root, 0).entries
    assert [e.module for e in entries] == ["transformer.wte", "transformer.h.0.ln_1"]


def test_an_error_line_parses_its_nan_and_inf_counts(tmp_path):
    root = tmp_path / STAMP
    bad = np.array([[np.nan, 1.0, np.inf], [np.nan, 2.0, 3.0]], np.float32)
    write_rank(root, 0, [("transformer.h.0.attn", "forward", bad)])
    text = (root / "precision_check_rank_0.log").read_text()
    assert text.rstrip().endswith("[NaN:2 Inf:1] <- ERROR")
    (entry,) = read_trace(root, 0).entries
    assert (entry.nan, entry.inf, entry.shape) == (2, 1, (2, 3))


def test_a_second_output_tensor_is_read(tmp_path):
    root = tmp_path / STAMP
    (root / "rank_0").mkdir(parents=True)
    a, b = small(1), small(2, (4,))
    np.save(root / "rank_0" / "attn_forward.npy", a)
    np.save(root / "rank_0" / "attn_1_forward.npy", b)
    (root / "precision_check_rank_0.log").write_text(
        log_line("attn_forward", a) + "\n" + log_line("attn_1_forward", b, tensor=1) + "\n")
    entries = read_trace(root, 0).entries
    assert [(e.module, e.index, e.tensor, e.shape) for e in entries] == \
        [("attn", 0, 0, (2, 3)), ("attn", 1, 1, (4,))]


def test_a_log_of_several_iterations_is_read_as_its_last(tmp_path):
    """InfiniTrain opens the log once (trunc) and keeps every iteration's lines; the counters
    restart every iteration and the files hold the last one (precision_checker.cc:156-190,
    gpt2/main.cc:393). A trace of step N > 1 is such a log: the last iteration's entries."""
    root = tmp_path / STAMP
    write_rank(root, 0, CALLS, iterations=3)
    assert len((root / "precision_check_rank_0.log").read_text().splitlines()) == 3 * len(CALLS)
    entries = read_trace(root, 0).entries
    assert [(e.module, e.phase, e.index) for e in entries] == [(m, p, 0) for m, p, _ in CALLS]
    assert [e.order for e in entries] == list(range(len(CALLS)))


# ------------------------------------------------------------------------- pairing facts

CONTAINERS = ("TransformerFirstStage", "TransformerChunk", "TransformerLastStage", "Transformer",
              "CrossEntropyLoss")


def test_the_programs_with_facts():
    assert {"gpt2", "llama3"} <= set(PAIRINGS)
    for program in ("gpt2", "llama3"):
        pairing = pairing_of(program)
        assert pairing.program == program and pairing.prefix == "transformer."
        assert pairing.stage_local_layers and "transformer.cc" in pairing.stage_local_source
        assert "transformer.cc" in pairing.prefix_source


@pytest.mark.parametrize("program", ["gpt2", "llama3"])
def test_the_prefix_is_stripped(program):
    pairing = pairing_of(program)
    assert pairing.bundled_name("transformer.h.0.mlp.c_fc") == "h.0.mlp.c_fc"
    assert pairing.bundled_name("transformer.wte") == "wte"
    assert pairing.bundled_name("transformer.ln_f") == "ln_f"
    assert pairing.why_unpaired("transformer.h.0.mlp.c_fc", "subject") is None


@pytest.mark.parametrize("program", ["gpt2", "llama3"])
@pytest.mark.parametrize("container", CONTAINERS)
def test_infinitrain_only_modules_have_no_counterpart_and_say_why(program, container):
    pairing = pairing_of(program)
    assert pairing.bundled_name(container) is None
    fact = next(f for f in pairing.facts if f.subject == container)
    why = pairing.why_unpaired(container, "subject")
    assert why == f"{fact.why} ({fact.source})"
    assert "master@b24d92f:" in fact.source
    # the other side has no module of that name to explain
    assert pairing.why_unpaired(container, "bundled") is None


def test_the_head_pairs_by_name_on_both_models():
    # the bundled GPT-2 logs its tied head as a parameterless `lm_head` (TiedLMHead), so
    # InfiniTrain's lm_head pairs with it as LLaMA 3's untied one does
    for program in ("gpt2", "llama3"):
        assert pairing_of(program).bundled_name("lm_head") == "lm_head"
        assert pairing_of(program).why_unpaired("lm_head", "subject") is None


def test_an_unknown_program_names_the_known_ones():
    with pytest.raises(KeyError) as error:
        pairing_of("gemma")
    assert "gemma" in str(error.value) and "gpt2" in str(error.value) \
        and "llama3" in str(error.value)


def test_identity_keeps_every_name():
    assert IDENTITY.bundled_name("h.0.attn") == "h.0.attn"
    assert IDENTITY.bundled_name("transformer.h.0.attn") == "transformer.h.0.attn"
    assert IDENTITY.why_unpaired("h.0.attn", "subject") is None


def test_globalize_layer():
    assert globalize_layer("transformer.h.1.attn.c_attn", [4, 5, 6]) == \
        "transformer.h.5.attn.c_attn"
    assert globalize_layer("transformer.h.0", (4, 5, 6)) == "transformer.h.4"
    assert globalize_layer("h.2.mlp", (4, 5, 6)) == "h.6.mlp"
    assert globalize_layer("transformer.h.10.ln_1", list(range(20, 32))) == \
        "transformer.h.30.ln_1"
    for name in ("transformer.wte", "lm_head", "TransformerChunk", "transformer.ln_f"):
        assert globalize_layer(name, (4, 5, 6)) == name
    assert globalize_layer("transformer.h.1", ()) == "transformer.h.1"
    with pytest.raises(TraceError) as error:
        globalize_layer("transformer.h.3.attn", [4, 5, 6])
    assert "transformer.h.3.attn" in str(error.value) and "[4, 5, 6]" in str(error.value)


def test_docs_table_every_pairing_fact():
    from pathlib import Path

    from harness.contracts.trace import pairing_table

    text = (Path(__file__).resolve().parents[2] / "docs" / "traces.md").read_text()
    missing = [line for line in pairing_table() if line not in text]
    assert not missing, "docs/traces.md lacks these pairing rows:\n" + "\n".join(missing)
