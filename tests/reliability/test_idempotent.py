"""Verdicts do not depend on reference-cache state, case order or xdist worker, for every
trainer backend.

For each backend the same small session runs three times into one output folder OUT:

    A  from a cold cache, under ``-n 2``
    B  again, serially (a warm reference cache and warm binary facts, as every nightly after
       the first)
    C  again, under ``-n 2``

and every case must get the same decision each time: its status, its record's ``reason``, and
whether its gradients were compared (``False`` with the reason, else the number of parameters).
B and C build no reference; OUT then holds three sessions. A second session into the same
folder used to fail cases the first passed (InfiniTrain's binary facts read back from the cache
on a warm run): these are the regression tests for that class of bug.

Backends: the bundled PyTorch trainer (``harness``), a foreign trainer from an argv template
(``command``, the plugin tests' fake trainer), and ``infinitrain`` on the InfiniTrain stand-in,
both as master on a CPU build (no --dump_gradients, no multi-rank runs) and as #209 on a CUDA
build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.history.store import history_path, read_history
from tests.conftest import INNER_SESSION_ARGS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FAKE_TRAINER = REPO / "tests" / "plugin" / "fake_trainer.py"
INFINITRAIN_CONFIG = REPO / "tests" / "infinitrain" / "data" / "infinitrain_test_config.json"
TAIL = 4000


# -- the backends' sessions ---------------------------------------------------------------------

def _harness(root: Path) -> tuple[list[str], callable]:
    """The bundled trainer on the tiny synthetic assets: pp2 and dp2 do the same mathematics
    (one reference key), pp4 needs more devices than --gpus allows (skipped)."""
    config = {
        "models": ["gpt2"],
        "assets": {"preset": "tiny", "seed": 0},
        "defaults": {"batch_size": 2, "sequence_length": 32, "total_batch_size": 128,
                     "num_iteration": 3, "learning_rate": 0.001},
        "test_groups": [{"tag": "t", "tests": [
            {"id": "pp2", "args": {"pipeline_parallel": 2}},
            {"id": "dp2", "args": {"data_parallel": 2}},
            {"id": "pp4", "args": {"pipeline_parallel": 4}},
        ]}],
    }
    path = root / "cases.json"
    path.write_text(json.dumps(config, indent=2))

    def expect(first: dict[str, dict]) -> None:
        assert set(first) == {"t/gpt2/pp2", "t/gpt2/dp2", "t/gpt2/pp4"}
        for name in ("t/gpt2/pp2", "t/gpt2/dp2"):
            assert first[name]["status"] == "passed", first[name]
            assert first[name]["gradients"]["parameters"] > 0
        # One reference for both, built once even with two workers asking at once.
        assert sum(first[n]["reference"]["built"] for n in ("t/gpt2/pp2", "t/gpt2/dp2")) == 1
        assert first["t/gpt2/pp4"]["status"] == "skipped"
        assert "needs 4 devices" in first["t/gpt2/pp4"]["reason"]

    return ["--harness-config", str(path), "--harness-device", "cpu", "--gpus", "2"], expect


def _command(root: Path) -> tuple[list[str], callable]:
    """The fake trainer through the command backend (as tests/plugin run it): pp2 and dp2 on one
    reference key, a gradient difference that must fail every time, a skip."""
    for model in ("gpt2", "llama3"):
        (root / f"{model}.bin").write_bytes(model.encode() * 8)
        (root / f"{model}_tokens.bin").write_bytes(b"tokens" * 8)
    config = {
        "models": ["gpt2"],
        "model_files": {m: {"checkpoint": str(root / f"{m}.bin"),
                            "input_bin": str(root / f"{m}_tokens.bin")}
                        for m in ("gpt2", "llama3")},
        "trainer": {"backend": "command", "version": "fake-1", "command": [
            "{python}", str(FAKE_TRAINER), "--case", "{case}", "--world_size", "{world_size}",
            "--output_dir", "{output_dir}", "--gradients_dir", "{gradients_dir}",
            "--log_dir", "{log_dir}", "--model", "{model}", "--devices", "{devices}",
            "{flags}"]},
        # total_batch_size 16: one reference key for dp 1 and dp 2
        "defaults": {"num_iteration": 3, "batch_size": 1, "sequence_length": 8,
                     "total_batch_size": 16},
        "test_groups": [{"tag": "fake", "tests": [
            {"id": "pp2", "args": {"pipeline_parallel": 2}},
            {"id": "dp2", "args": {"data_parallel": 2}},
            {"id": "bad-grad", "args": {"pipeline_parallel": 2}},
            {"id": "pp4", "args": {"pipeline_parallel": 4}},
        ]}],
    }
    path = root / "cases.json"
    path.write_text(json.dumps(config, indent=2))

    def expect(first: dict[str, dict]) -> None:
        assert set(first) == {f"fake/gpt2/{i}" for i in ("pp2", "dp2", "bad-grad", "pp4")}
        for name in ("fake/gpt2/pp2", "fake/gpt2/dp2"):
            assert first[name]["status"] == "passed", first[name]
            assert first[name]["gradients"]["parameters"] > 0
        assert first["fake/gpt2/bad-grad"]["status"] == "failed"
        assert first["fake/gpt2/pp4"]["status"] == "skipped"
        assert "needs 4 devices" in first["fake/gpt2/pp4"]["reason"]

    return ["--harness-config", str(path), "--harness-device", "cpu", "--gpus", "2"], expect


# InfiniTrain's basic/gpt2 float32 cases 1 and 2 (one device; batch 4 and 80) and 6 (PP 8 on
# 8 ranks). A bare "2" would match every case ("gpt2"), hence the exclusions.
INFINITRAIN_CASES = {"basic/gpt2/1", "basic/gpt2/2", "basic/gpt2/6"}
# Case ids are bare numbers: -k names them with their model (`gpt2/3`), since a bare digit
# also matches every case when the checkout's path holds that digit (a folder `ci1`).
INFINITRAIN_SELECT = ["-m", "basic", "-k", "gpt2 and not bfloat16 and not "
                      "(gpt2/3 or gpt2/4 or gpt2/5 or gpt2/7 or gpt2/8)"]


def _infinitrain(flavour: str, cuda: bool):
    def setup(root: Path) -> tuple[list[str], callable]:
        from tests.infinitrain_standin.build import make_build_dir
        from tests.infinitrain_standin.model_files import micro_model_vars

        build = make_build_dir(root / "build", flavour=flavour, cuda=cuda)
        args = ["--harness-config", str(INFINITRAIN_CONFIG), "--harness-trainer", "infinitrain",
                "--infinitrain-build", str(build), "--gpus", "8", *micro_model_vars(root),
                *INFINITRAIN_SELECT]

        def expect(first: dict[str, dict]) -> None:
            assert set(first) == INFINITRAIN_CASES
            single = [first["basic/gpt2/1"], first["basic/gpt2/2"]]
            multi = first["basic/gpt2/6"]
            if cuda:  # #209's gpt2 dumps gradients, and runs 8 ranks
                for r in [*single, multi]:
                    assert r["status"] == "passed", r
                    assert r["gradients"]["parameters"] > 0, r["gradients"]
            else:  # master on CPU: no --dump_gradients, no parallel ranks
                assert multi["status"] == "skipped" and "has no CUDA" in multi["reason"], multi
                for r in single:
                    assert r["status"] == "passed", r
                    assert r["gradients"]["compared"] is False
                    assert "lists no --dump_gradients" in r["gradients"]["reason"]

        return args, expect
    return setup


BACKENDS = {
    "harness": _harness,
    "command": _command,
    "infinitrain-master-cpu": _infinitrain("master", cuda=False),
    "infinitrain-pr209-cuda": _infinitrain("pr209", cuda=True),
}


# -- running and comparing ------------------------------------------------------------------------

def _session(root: Path, out: Path, args: list[str], *more: str) -> tuple[str, dict[str, dict]]:
    """One pytest session with the harness plugin, outside the repository's own ini (its
    testpaths / addopts); returns its output and the records of the session it wrote last."""
    before = set(out.glob("sessions/*/results.jsonl"))
    argv = [sys.executable, "-m", "pytest", "-c", str(root / "pytest.ini"), "--rootdir",
            str(root), "-p", "no:cacheprovider", "-q", "--harness-output", str(out),
            *INNER_SESSION_ARGS,  # its own environment has no PYTEST_ADDOPTS
            *args, *more]
    result = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=600,
                            env={k: v for k, v in os.environ.items()
                                 if k not in ("FAKE_RECORD_DIR", "PYTEST_ADDOPTS")})
    output = f"$ {' '.join(argv)}\n(exit code {result.returncode})\n{result.stdout}{result.stderr}"
    new = sorted(set(out.glob("sessions/*/results.jsonl")) - before)
    assert len(new) == 1, f"expected one new session under {out}, got {new}\n{output[-TAIL:]}"
    records = [json.loads(line) for line in new[0].read_text().splitlines()]
    return output, {r["name"]: r for r in records}


def _decision(record: dict | None):
    """What a session decided about a case: status, reason, and whether its gradients were
    compared (False with the reason, else the number of parameters)."""
    if record is None:
        return "(no record)"
    g = record.get("gradients")
    if isinstance(g, dict) and g.get("compared") is False:
        gradients = ("not compared", g.get("reason"))
    else:
        gradients = g.get("parameters") if isinstance(g, dict) else g
    return record["status"], record.get("reason"), gradients


def _assert_same(label: str, first: dict[str, dict], again: dict[str, dict], output: str,
                 first_output: str) -> None:
    differ = {name: (_decision(first.get(name)), _decision(again.get(name)))
              for name in sorted(set(first) | set(again))
              if _decision(first.get(name)) != _decision(again.get(name))}
    if differ:
        lines = [f"session {label} decided differently from session A:"]
        for name, (a, b) in differ.items():
            lines += [f"  {name}", f"    A: {a}", f"    {label}: {b}"]
            errors = (again.get(name) or {}).get("errors") or (first.get(name) or {}).get("errors")
            if errors:
                lines.append(f"    first error: {errors[0][:1500]}")
        lines += [f"--- session {label}'s output (tail) ---", output[-TAIL:],
                  "--- session A's output (tail) ---", first_output[-TAIL // 2:]]
        pytest.fail("\n".join(lines), pytrace=False)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_verdicts_do_not_depend_on_cache_order_or_worker(backend, tmp_path):
    root = tmp_path
    (root / "pytest.ini").write_text("[pytest]\n")  # not the repository's testpaths / addopts
    args, expect = BACKENDS[backend](root)
    out = root / "out"

    # A: cold cache, two workers.
    output_a, first = _session(root, out, args, "-n", "2")
    try:
        expect(first)
    except AssertionError as e:
        raise AssertionError(f"session A: {e}\n"
                             + "\n".join(f"  {n}: {_decision(r)}" for n, r in first.items())
                             + f"\n{output_a[-TAIL:]}") from None

    # B: the same output folder (warm reference cache and binary facts), serially.
    # C: again, under two workers.
    for label, more in (("B", ()), ("C", ("-n", "2"))):
        output, again = _session(root, out, args, *more)
        _assert_same(label, first, again, output, output_a)
        built = sorted(n for n, r in again.items()
                       if r["status"] == "passed" and r["reference"]["built"] is not False)
        assert not built, f"session {label} built a reference for {built}\n{output[-TAIL:]}"

    assert len(list(out.glob("sessions/*/results.jsonl"))) == 3

    # The history beside them (harness.history): each session appended once, by the
    # controller only (two workers wrote the records of A and C), every night the same verdict.
    assert f"history: {len(first)} cases appended to {history_path(out)}" in output_a
    history = read_history(history_path(out))
    assert history.notes == []
    assert len({(r.session, r.date) for r in history.rows}) == 3
    for name, record in first.items():
        assert [r.status for r in history.rows if r.name == name] == [record["status"]] * 3
