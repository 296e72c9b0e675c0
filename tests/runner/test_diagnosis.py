"""harness.runner.diagnosis: the failure text of a crashed, killed, hung or faulty run and of a
mismatch, asserted line by line for every branch (which reason, which rank's logs, how many
lines of each)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from harness.launch import LaunchSpec, ProcessResult
from harness.runner.diagnosis import TAIL_LINES, crash_text, mismatch_text

CASE = SimpleNamespace(name="basic/gpt2/pp2")  # crash_text reads only the name


def _spec(tmp_path: Path, world_size: int = 2) -> LaunchSpec:
    return LaunchSpec(case="basic/gpt2/pp2", model="gpt2", flags={}, world_size=world_size,
                      checkpoint=tmp_path / "c.bin", input_bin=tmp_path / "t.bin",
                      output_dir=tmp_path / "out", gradients_dir=None, log_dir=tmp_path / "logs")


def _result(tmp_path: Path, returncode, timed_out=False, fault=None, launcher_lines=0):
    out, err = tmp_path / "launcher.out", tmp_path / "launcher.err"
    out.write_text("".join(f"out {i}\n" for i in range(launcher_lines)))
    err.write_text("".join(f"err {i}\n" for i in range(launcher_lines)))
    return ProcessResult(argv=("launcher", "--nproc-per-node", "2", "-m", "harness.trainer"),
                         returncode=returncode, timed_out=timed_out, duration_s=1.0,
                         stdout=out, stderr=err, fault=fault)


def _rank_logs(tmp_path: Path, lines: int = 40) -> dict:
    logs = {}
    for rank in ("0", "1"):
        path = tmp_path / f"rank{rank}.log"
        path.write_text("".join(f"rank {rank} line {i}\n" for i in range(lines)))
        logs[rank] = [path]
    return logs


def _head(text: str) -> list[str]:
    return text.splitlines()[:3]


def test_first_failing_rank_shows_its_own_log_tail_only(tmp_path):
    logs = _rank_logs(tmp_path)
    text = crash_text(CASE, _spec(tmp_path), _result(tmp_path, 1, launcher_lines=3), "1", logs, 60)
    assert _head(text) == [
        "basic/gpt2/pp2: the run failed: rank 1 of 2 failed first; exit code 1",
        "command: launcher --nproc-per-node 2 -m harness.trainer",
        f"launcher log: {tmp_path / 'launcher.out'}"]
    lines = text.splitlines()[3:]
    assert lines[0] == f"--- rank 1: {logs['1'][0]} (last lines) ---"
    assert lines[1:] == [f"rank 1 line {i}" for i in range(40 - TAIL_LINES, 40)]  # no launcher


def test_an_exit_code_with_no_rank_named_shows_the_launcher_not_every_rank(tmp_path):
    result = _result(tmp_path, 1, launcher_lines=2)
    text = crash_text(CASE, _spec(tmp_path), result, None, _rank_logs(tmp_path), 60)
    assert text.splitlines()[0] == "basic/gpt2/pp2: the run failed: exit code 1"
    assert text.splitlines()[3:] == [f"--- {result.stderr} (last lines) ---", "err 0", "err 1",
                                     f"--- {result.stdout} (last lines) ---", "out 0", "out 1"]


def test_a_signal_is_named_and_an_unknown_one_numbered(tmp_path):
    text = crash_text(CASE, _spec(tmp_path), _result(tmp_path, -9), None, {}, 60)
    assert text.splitlines()[0] == "basic/gpt2/pp2: the run failed: killed by signal SIGKILL (exit code -9)"
    text = crash_text(CASE, _spec(tmp_path), _result(tmp_path, -200), None, {}, 60, what="reference")
    assert text.splitlines()[0] == "basic/gpt2/pp2: the reference failed: killed by signal 200 (exit code -200)"


def test_a_native_crash_names_its_signal_also_as_a_shell_reports_it(tmp_path):
    from harness.runner.diagnosis import exit_text

    assert exit_text(-11) == "killed by signal SIGSEGV (exit code -11)"
    assert exit_text(-8) == "killed by signal SIGFPE (exit code -8)"
    assert exit_text(134) == ("killed by signal SIGABRT (exit code 134 = 128 + 6, as a shell "
                              "reports it)")
    assert exit_text(136).startswith("killed by signal SIGFPE")
    assert exit_text(130) == "exit code 130"  # SIGINT: not a crash signal
    assert exit_text(1) == "exit code 1"
    text = crash_text(CASE, _spec(tmp_path), _result(tmp_path, -6), None, {}, 60,
                      problem="the gpt2 binary stopped early: 3 of 10 step lines missing")
    assert text.splitlines()[0] == ("basic/gpt2/pp2: the run failed: the gpt2 binary stopped "
                                    "early: 3 of 10 step lines missing (killed by signal "
                                    "SIGABRT (exit code -6))")


def test_timeout_shows_six_lines_of_every_rank(tmp_path):
    logs = _rank_logs(tmp_path)
    text = crash_text(CASE, _spec(tmp_path), _result(tmp_path, None, timed_out=True), None,
                      logs, 90.5)
    lines = text.splitlines()
    assert lines[0] == ("basic/gpt2/pp2: the run failed: timed out after 90.5 s "
                        "(--harness-timeout); every process of the run was killed")
    assert lines[3:] == [f"--- rank 0: {logs['0'][0]} (last lines) ---",
                         *[f"rank 0 line {i}" for i in range(34, 40)],
                         f"--- rank 1: {logs['1'][0]} (last lines) ---",
                         *[f"rank 1 line {i}" for i in range(34, 40)]]


def test_a_problem_beside_exit_zero_or_a_code_and_a_fault_over_both(tmp_path):
    logs = _rank_logs(tmp_path, lines=3)
    spec = _spec(tmp_path)
    text = crash_text(CASE, spec, _result(tmp_path, 0), None, logs, 60,
                      problem="steps 3-4 missing")
    assert text.splitlines()[0] == "basic/gpt2/pp2: the run failed: steps 3-4 missing"
    assert f"--- rank 1: {logs['1'][0]} (last lines) ---" in text  # every rank, as for a hang
    text = crash_text(CASE, spec, _result(tmp_path, 3), None, logs, 60, problem="F line")
    assert text.splitlines()[0] == "basic/gpt2/pp2: the run failed: F line (exit code 3)"
    text = crash_text(CASE, spec, _result(tmp_path, None, timed_out=True), None, logs, 60,
                      problem="F line")
    assert "timed out after 60 s" in text.splitlines()[0]  # the timeout wins over a problem
    text = crash_text(CASE, spec, _result(tmp_path, 1, fault="node 1 lost"), "0", logs, 60,
                      problem="F line")
    assert text.splitlines()[0] == ("basic/gpt2/pp2: the run failed: rank 0 of 2 failed first; "
                                    "node 1 lost")


def test_without_rank_logs_the_launcher_tails_are_shown(tmp_path):
    result = _result(tmp_path, 1, launcher_lines=30)
    text = crash_text(CASE, _spec(tmp_path), result, None, {}, 60)
    assert text.splitlines()[3:] == [
        f"--- {result.stderr} (last lines) ---", *[f"err {i}" for i in range(5, 30)],
        f"--- {result.stdout} (last lines) ---", *[f"out {i}" for i in range(5, 30)]]
    # empty rank logs count as none
    empty = tmp_path / "empty.log"
    empty.write_text("\n")
    text = crash_text(CASE, _spec(tmp_path), result, "1", {"1": [empty]}, 60)
    assert f"--- {result.stderr} (last lines) ---" in text and "--- rank 1" not in text


def test_mismatch_text_indents_the_diff_under_a_header_then_where_to_look(tmp_path):
    text = mismatch_text(CASE, ["losses: mismatched 1 of 4 steps", "gradients:\n  h.1: 0.25"],
                         tmp_path / "run", tmp_path / "ref", ["launcher", "a b"])
    assert text.splitlines() == [
        "basic/gpt2/pp2: the run differs from the single-device reference",
        "  losses: mismatched 1 of 4 steps", "  gradients:", "    h.1: 0.25",
        f"run folder: {tmp_path / 'run'}", f"reference: {tmp_path / 'ref'}",
        "command: launcher 'a b'"]


def test_mismatch_text_names_what_the_run_differs_from(tmp_path):
    """A case whose self-check passed and whose baseline failed (a kernel bug every
    configuration shares) read "differs from the single-device reference" in its reason and in
    the bisect's verdict line, which is the verdict it had passed (seen in the bisect of a
    planted InfiniTrain RMSNorm commit). Plant: mismatch_text's header fixed again."""
    where = (tmp_path / "run", tmp_path / "ref", ["x"])
    first = [mismatch_text(CASE, [], *where, against=against).splitlines()[0]
             for against in (("the pytorch (live) baseline",),
                             ("the single-device reference", "the pytorch (live) baseline"))]
    assert first == [
        "basic/gpt2/pp2: the run differs from the pytorch (live) baseline",
        "basic/gpt2/pp2: the run differs from the single-device reference and from the "
        "pytorch (live) baseline"]
