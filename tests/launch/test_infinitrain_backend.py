"""InfiniTrainBackend against a hand-made build folder (dummy executables) and hand-written
stderr / glog files: no real trainer is launched."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.launch import LaunchSpec, ProcessResult
from harness.launch.infinitrain import (
    DEFAULT_NUM_ITERATION,
    InfiniTrainBackend,
    InfiniTrainError,
    strip_glog_prefix,
)
from tests.infinitrain_standin.build import make_build_dir

MODELS = ("gpt2", "llama3")


def _executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# What the dummy binaries list (gflags' --helpxml): gpt2 has #209's --dump_gradients, llama3 not.
LISTED = {"gpt2": ("dtype", "batch_size", "num_iteration", "tensor_parallel", "dump_gradients",
                   "nthread_per_process", "lora_rank", "precision_check"),
          "llama3": ("dtype", "batch_size", "num_iteration", "tensor_parallel", "lora_rank",
                     "nthread_per_process")}


def _listing_binary(path: Path, flags, cuda: bool = True) -> Path:
    xml = "".join(f"<flag><file>main.cc</file><name>{f}</name><meaning>m</meaning>"
                  f"<default></default><current></current><type>string</type></flag>"
                  for f in flags)
    links = "# links: libcudart.so libnccl.so\n" if cuda else ""
    return _executable(path, f"#!/bin/sh\n# {path.name}\n{links}"
                             f"case \"$1\" in --helpxml) echo '<AllFlags>{xml}</AllFlags>'; "
                             f"exit 1;; esac\nexit 0\n")


@pytest.fixture
def build(tmp_path) -> Path:
    folder = tmp_path / "build"
    for name in MODELS:
        _listing_binary(folder / name, LISTED[name])
    _executable(folder / "infini_run", "#!/bin/sh\n# infini_run\nexit 0\n")
    return folder


def _spec(tmp_path: Path, model: str = "gpt2", flags: dict | None = None, world_size: int = 1,
          gradients: bool = False, port: int | None = None) -> LaunchSpec:
    out = tmp_path / "run"
    return LaunchSpec(case="case", model=model, flags=dict(flags or {}), world_size=world_size,
                      checkpoint=tmp_path / "assets" / f"{model}.bin",
                      input_bin=tmp_path / "assets" / "tokens.bin", output_dir=out,
                      gradients_dir=(out / "gradients") if gradients else None,
                      log_dir=out / "logs", port=port)


def _result(spec: LaunchSpec, stderr: str = "", stdout: str = "", returncode: int | None = 0,
            timed_out: bool = False) -> ProcessResult:
    spec.log_dir.mkdir(parents=True, exist_ok=True)
    err, out = spec.log_dir / "launcher.stderr", spec.log_dir / "launcher.stdout"
    err.write_text(stderr)
    out.write_text(stdout)
    return ProcessResult(("gpt2",), returncode, timed_out, 0.1, out, err)


def _glog_file(spec: LaunchSpec, text: str, pid: int = 13918) -> Path:
    folder = spec.log_dir / "glog"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"gpt2.host.user.log.INFO.20261201-093956.{pid}"
    path.write_text("Log file created at: 2026/12/01 09:39:56\nRunning on machine: host\n"
                    "Log line format: [IWEF]yyyymmdd hh:mm:ss.uuuuuu threadid file:line] msg\n"
                    + text)
    return path


def _step(step: int, total: int = 3, loss: float = 5.123456, severity: str = "E") -> str:
    return (f"{severity}20261201 09:39:56.975863 13918 main.cc:493] step {step:4d}/{total} | "
            f"train loss {loss:.6f} | lr 1.00e-04 | (12.00 ms | 1000 tok/s | peak used:     5 MB"
            f" | peak reserved:     6 MB, DP=1, TP=1, SP=1, PP=1)\n")


def _flag_names(argv: list[str]) -> list[str]:
    return [item[2:].split("=", 1)[0] for item in argv if item.startswith("--")]


# ------------------------------------------------------------------ the build folder


def test_missing_build_folder_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(InfiniTrainError, match=f"--infinitrain-build {missing}: not a folder"):
        InfiniTrainBackend(missing)


def test_a_file_is_not_a_build_folder(tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(InfiniTrainError, match="not a folder"):
        InfiniTrainBackend(path)


def test_unknown_launch_mode(build):
    with pytest.raises(InfiniTrainError, match="--infinitrain-launch 'mpirun': expected one of "
                                               "threads, infini_run"):
        InfiniTrainBackend(build, launch="mpirun")


def test_missing_binary_names_the_folder_and_the_binary(build, tmp_path):
    (build / "llama3").unlink()
    backend = InfiniTrainBackend(build)
    assert backend.binary("gpt2") == build.resolve() / "gpt2"
    with pytest.raises(InfiniTrainError) as caught:
        backend.binary("llama3")
    assert str(build.resolve()) in str(caught.value) and "`llama3`" in str(caught.value)
    with pytest.raises(InfiniTrainError, match="no `llama3` binary"):
        backend.command(_spec(tmp_path, model="llama3"))


def test_missing_launcher_names_the_folder_and_where_it_looked(build, tmp_path):
    (build / "infini_run").unlink()
    backend = InfiniTrainBackend(build, launch="infini_run")
    with pytest.raises(InfiniTrainError) as caught:
        backend.launcher()
    message = str(caught.value)
    assert str(build.resolve()) in message
    assert "infini_run, tools/infini_run/infini_run" in message
    with pytest.raises(InfiniTrainError, match="no infini_run launcher"):
        backend.command(_spec(tmp_path, world_size=2))
    # threads mode needs no launcher
    assert InfiniTrainBackend(build).command(_spec(tmp_path, world_size=2))


def test_launcher_under_tools(build):
    (build / "infini_run").unlink()
    nested = _executable(build / "tools" / "infini_run" / "infini_run")
    assert InfiniTrainBackend(build, launch="infini_run").launcher() == nested.resolve()


# ------------------------------------------------------------------ version


def test_version_is_stable_for_the_same_bytes(build):
    first = InfiniTrainBackend(build).version()
    assert first.startswith("infinitrain-") and len(first) == len("infinitrain-") + 16
    assert InfiniTrainBackend(build).version() == first
    os.utime(build / "gpt2", (1, 1))  # a touch is not a rebuild
    (build / "CMakeCache.txt").write_text("not a library")
    (build / "notes.so.txt").write_text("not a library either")
    assert InfiniTrainBackend(build).version() == first
    assert InfiniTrainBackend(build, launch="infini_run").version() == first


@pytest.mark.parametrize("name", ["gpt2", "llama3", "infini_run"])
def test_version_changes_with_a_binary(build, name):
    before = InfiniTrainBackend(build).version()
    _executable(build / name, "#!/bin/sh\n# rebuilt\nexit 0\n")
    assert InfiniTrainBackend(build).version() != before


@pytest.mark.parametrize("relative", ["libinfini_train.so", "lib/libkernels.so",
                                      "third_party/libglog.so.0.7", "libstatic.a"])
def test_version_changes_with_a_library(build, relative):
    library = build / relative
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(b"\x7fELF one")
    before = InfiniTrainBackend(build).version()
    library.write_bytes(b"\x7fELF two")
    after = InfiniTrainBackend(build).version()
    assert after != before
    library.unlink()
    assert InfiniTrainBackend(build).version() not in (before, after)


def test_version_is_computed_once_per_backend(build):
    backend = InfiniTrainBackend(build)
    first = backend.version()
    _executable(build / "gpt2", "#!/bin/sh\n# rebuilt\n")
    assert backend.version() == first  # cached: one session, one reference key


# ------------------------------------------------------------------ command


def test_command_world_1(build, tmp_path):
    spec = _spec(tmp_path, flags={"dtype": "bfloat16", "batch_size": 4,
                                  "sequence_parallel": False, "my_flag": "x"})
    binary = str(build.resolve() / "gpt2")
    assert InfiniTrainBackend(build).command(spec) == [
        binary, f"--input_bin={spec.input_bin}", f"--llmc_filepath={spec.checkpoint}",
        "--device=cpu", "--dtype=bfloat16", "--batch_size=4", "--sequence_parallel=false",
        "--my_flag=x"]
    assert InfiniTrainBackend(build, launch="infini_run").command(spec)[0] == binary


def test_command_threads_mode_adds_nthread_per_process(build, tmp_path):
    spec = _spec(tmp_path, flags={"tensor_parallel": 2, "num_iteration": 5}, world_size=4)
    argv = InfiniTrainBackend(build).command(spec)
    assert argv[0] == str(build.resolve() / "gpt2")
    assert argv[4:] == ["--tensor_parallel=2", "--num_iteration=5", "--nthread_per_process=4"]


def test_command_threads_mode_overrides_nthread_per_process(build, tmp_path):
    spec = _spec(tmp_path, flags={"nthread_per_process": 2, "pipeline_parallel": 4},
                 world_size=4)
    argv = InfiniTrainBackend(build).command(spec)
    assert [a for a in argv if a.startswith("--nthread_per_process")] == [
        "--nthread_per_process=4"]
    assert spec.flags["nthread_per_process"] == 2  # the spec is not changed


def test_command_infini_run_mode(build, tmp_path):
    spec = _spec(tmp_path, model="llama3", world_size=4, port=31234,
                 flags={"nthread_per_process": 4, "tensor_parallel": 2, "lora_rank": 8})
    argv = InfiniTrainBackend(build, launch="infini_run").command(spec)
    assert argv == [
        str(build.resolve() / "infini_run"), "--nproc_per_node=4",
        "--rdzv_endpoint=127.0.0.1:31234", "--", str(build.resolve() / "llama3"),
        f"--input_bin={spec.input_bin}", f"--llmc_filepath={spec.checkpoint}", "--device=cpu",
        "--tensor_parallel=2", "--lora_rank=8"]


def test_command_infini_run_mode_default_port(build, tmp_path):
    argv = InfiniTrainBackend(build, launch="infini_run").command(_spec(tmp_path, world_size=2))
    assert "--rdzv_endpoint=127.0.0.1:29500" in argv


def test_dump_gradients_only_with_a_gradients_dir(build, tmp_path):
    backend = InfiniTrainBackend(build)
    without = backend.command(_spec(tmp_path))
    assert not [a for a in without if a.startswith("--dump_gradients")]
    spec = _spec(tmp_path, gradients=True)
    assert f"--dump_gradients={spec.gradients_dir}" in backend.command(spec)
    infini = InfiniTrainBackend(build, launch="infini_run")
    assert f"--dump_gradients={spec.gradients_dir}" in infini.command(
        _spec(tmp_path, gradients=True, world_size=2))


def test_no_dump_gradients_for_a_binary_whose_listing_lacks_it(build, tmp_path):
    backend = InfiniTrainBackend(build)
    assert not [a for a in backend.command(_spec(tmp_path, model="llama3", gradients=True))
                if a.startswith("--dump_gradients")]
    assert [a for a in backend.command(_spec(tmp_path, model="gpt2", gradients=True))
            if a.startswith("--dump_gradients")]


@pytest.mark.parametrize("launch, world", [("threads", 1), ("threads", 2), ("infini_run", 2)])
def test_command_invents_nothing(build, tmp_path, launch, world):
    flags = {"dtype": "float32", "batch_size": 2, "total_batch_size": 512,
             "overfit_single_batch": True, "save": "/s/x", "load": "/s/x/checkpoint_step_000010",
             "freq_generate_txt": 1000, "some_new_flag": "7"}
    spec = _spec(tmp_path, flags=flags, world_size=world, gradients=True)
    argv = InfiniTrainBackend(build, launch=launch).command(spec)
    binary_at = argv.index(str(build.resolve() / "gpt2"))
    names = _flag_names(argv[binary_at + 1:])
    harness_set = {"input_bin", "llmc_filepath", "device", "dump_gradients"}
    if launch == "threads" and world > 1:
        harness_set.add("nthread_per_process")
    assert sorted(names) == sorted([*flags, *harness_set])
    for name, value in flags.items():
        expected = {True: "true", False: "false"}.get(value, value)
        assert f"--{name}={expected}" in argv


# ------------------------------------------------------------------ environment


def test_environment_points_glog_at_the_log_folder(build, tmp_path, monkeypatch):
    monkeypatch.setenv("GLOG_logtostderr", "1")
    monkeypatch.setenv("GLOG_logtostdout", "1")
    backend = InfiniTrainBackend(build, env={"GLOG_logtostderr": "1", "MY_VAR": "v"})
    spec = _spec(tmp_path)
    env = backend.environment(spec)
    assert env["GLOG_log_dir"] == str(spec.log_dir / "glog")
    assert Path(env["GLOG_log_dir"]).is_dir()
    assert Path(env["GLOG_log_dir"]).is_relative_to(spec.log_dir)
    assert "GLOG_logtostderr" not in env and "GLOG_logtostdout" not in env
    assert env["MY_VAR"] == "v" and env["HARNESS_CASE"] == "case"


def test_working_dir_is_per_run(build, tmp_path):
    spec = _spec(tmp_path)
    folder = InfiniTrainBackend(build).working_dir(spec)
    assert folder.is_dir() and folder.is_relative_to(spec.output_dir)


# ------------------------------------------------------------------ collect


def test_collect_parses_glog_prefixed_step_lines(build, tmp_path):
    spec = _spec(tmp_path, flags={"num_iteration": 3})
    stderr = "".join(_step(s, loss=5.123456 - s / 10) for s in (1, 2, 3))
    outputs = InfiniTrainBackend(build).collect(spec, _result(spec, stderr=stderr))
    assert outputs.problem is None
    assert outputs.run_record is None and outputs.gradients_dir is None
    assert [s["step"] for s in outputs.steps] == [1, 2, 3]
    first = outputs.steps[0]
    assert first["loss"] == pytest.approx(5.023456)
    assert first["lr"] == pytest.approx(1e-4)
    assert first["step_time_ms"] == 12.0 and first["tokens_per_s"] == 1000.0
    assert first["peak_memory_mb"] == 5.0


def test_collect_reads_the_glog_files(build, tmp_path):
    spec = _spec(tmp_path, flags={"num_iteration": 2}, gradients=True)
    _glog_file(spec, "I20261201 09:39:56.000001 13918 main.cc:100] starting\n"
               + _step(1, 2, severity="I") + _step(2, 2, severity="I"))
    (spec.log_dir / "glog" / "gpt2.INFO").symlink_to(next((spec.log_dir / "glog").iterdir()))
    backend = InfiniTrainBackend(build)
    result = _result(spec)
    outputs = backend.collect(spec, result)
    assert [s["step"] for s in outputs.steps] == [1, 2] and outputs.problem is None
    assert outputs.gradients_dir == spec.gradients_dir
    assert backend.rank_logs(spec, result) == {
        "pid 13918": [spec.log_dir / "glog" / "gpt2.host.user.log.INFO.20261201-093956.13918"]}


def test_rank_logs_fall_back_to_the_launcher_files(build, tmp_path):
    spec = _spec(tmp_path)
    result = _result(spec, stderr="x")
    assert InfiniTrainBackend(build).rank_logs(spec, result) == {
        "launcher": [result.stdout, result.stderr]}


def test_collect_a_fatal_line_is_a_problem_with_its_rank(build, tmp_path):
    spec = _spec(tmp_path, flags={"num_iteration": 3})
    stderr = (_step(1) + "F20261201 09:39:57.000100 13920 nccl.cc:77] Check failed: "
              "NCCL error on rank 3: unhandled cuda error \n*** Check failure stack trace: ***\n")
    backend = InfiniTrainBackend(build)
    result = _result(spec, stderr=stderr, returncode=-6)
    outputs = backend.collect(spec, result)
    assert "Check failed: NCCL error on rank 3: unhandled cuda error" in outputs.problem
    assert backend.failing_rank(spec, result) == "3"


def test_collect_a_fatal_line_in_a_glog_file_only(build, tmp_path):
    spec = _spec(tmp_path, flags={"num_iteration": 1})
    _glog_file(spec, _step(1, 1, severity="I")
               + "F20261201 09:39:57.000100 13918 main.cc:9] Rank_1 ran out of memory\n")
    backend = InfiniTrainBackend(build)
    result = _result(spec, returncode=0)
    assert "Rank_1 ran out of memory" in backend.collect(spec, result).problem
    assert backend.failing_rank(spec, result) == "1"


def test_failing_rank_is_none_without_a_rank(build, tmp_path):
    spec = _spec(tmp_path)
    backend = InfiniTrainBackend(build)
    result = _result(spec, stderr="F20261201 09:39:57.000100 13918 main.cc:9] out of memory\n")
    assert backend.failing_rank(spec, result) is None
    assert backend.failing_rank(spec, _result(spec, stderr=_step(1))) is None


def test_exit_0_with_missing_steps_is_a_problem(build, tmp_path):
    spec = _spec(tmp_path, flags={"num_iteration": 3})
    outputs = InfiniTrainBackend(build).collect(spec, _result(spec, stderr=_step(1) + _step(3)))
    assert outputs.problem == "the gpt2 binary exited 0 with 1 of 3 step lines missing (step 2)"
    assert [s["step"] for s in outputs.steps] == [1, 3]


def test_many_missing_steps_are_abbreviated(build, tmp_path):
    spec = _spec(tmp_path)  # the default: 10 iterations
    outputs = InfiniTrainBackend(build).collect(spec, _result(spec, stderr=_step(1, 10)))
    assert "9 of 10 step lines missing (step 2, 3, 4, 5, 6, ...)" in outputs.problem


def test_a_timeout_is_left_to_the_runner(build, tmp_path):
    spec = _spec(tmp_path, flags={"num_iteration": 3})
    outputs = InfiniTrainBackend(build).collect(
        spec, _result(spec, stderr=_step(1), returncode=None, timed_out=True))
    assert outputs.problem is None and len(outputs.steps) == 1


def test_an_unknown_flag_names_the_flag_and_the_binary(build, tmp_path):
    spec = _spec(tmp_path, flags={"foo": 1})
    stderr = "ERROR: unknown command line flag 'foo'\n"
    backend = InfiniTrainBackend(build)
    outputs = backend.collect(spec, _result(spec, stderr=stderr, returncode=1))
    assert "--foo" in outputs.problem
    assert str(build.resolve() / "gpt2") in outputs.problem


def test_capabilities_come_from_the_listing_before_any_run(build, tmp_path):
    backend = InfiniTrainBackend(build, facts_dir=tmp_path / "facts")
    spec = _spec(tmp_path, model="llama3", flags={"num_iteration": 3}, gradients=True)
    assert "--dump_gradients" not in " ".join(backend.command(spec))
    assert "llama3 binary lists no --dump_gradients" in backend.gradients_unavailable("llama3", {})
    assert backend.gradients_unavailable("gpt2", {}) is None
    # a flag the listing does not name skips the case; one it names does not
    assert backend.unsupported("gpt2", {"lora_rank": 8, "dtype": "float32"}, 1) is None
    reason = backend.unsupported("llama3", {"pipeline_layer_partition": "4,4", "zero_stage": 1}, 1)
    assert reason.startswith("this build's llama3 binary does not accept "
                             "--pipeline_layer_partition, --zero_stage (not in its --helpxml")
    # a fresh backend (another session, another worker) decides the same from the store
    again = InfiniTrainBackend(build, facts_dir=tmp_path / "facts")
    assert again.gradients_unavailable("llama3", {}) == backend.gradients_unavailable("llama3", {})
    # a flag neither the binary nor the harness knows is a mistake, not a build's feature
    with pytest.raises(InfiniTrainError, match=r"does not accept --my_new_flag: not in its "
                                               r"--helpxml flag listing, nor a flag the harness"):
        backend.unsupported("gpt2", {"my_new_flag": 3, "zero_stage": 1}, 1)
    assert len(list((tmp_path / "facts").glob("*.json"))) == 2  # one entry per binary


def test_a_build_without_cuda_cannot_run_several_ranks(tmp_path):
    folder = tmp_path / "cpu-build"
    _listing_binary(folder / "gpt2", LISTED["gpt2"], cuda=False)
    backend = InfiniTrainBackend(folder, facts_dir=tmp_path / "facts")
    assert backend.unsupported("gpt2", {}, 1) is None
    reason = backend.unsupported("gpt2", {"tensor_parallel": 2}, 8)
    assert reason.startswith("needs 8 ranks, but this build of gpt2 has no CUDA (its binary "
                             "links no libcudart / libnccl)")


def test_a_binary_that_answers_no_listing_is_one_clear_line(tmp_path):
    folder = tmp_path / "odd-build"
    _executable(folder / "gpt2", "#!/bin/sh\necho 'usage: gpt2'\nexit 2\n")
    backend = InfiniTrainBackend(folder, facts_dir=tmp_path / "facts")
    with pytest.raises(InfiniTrainError) as raised:
        backend.unsupported("gpt2", {}, 1)
    assert str(raised.value) == (
        f"{folder.resolve() / 'gpt2'}: answers no flag listing (`gpt2 --helpxml` printed "
        f"'usage: gpt2'); expected gflags' XML listing (<AllFlags>...</AllFlags>), as "
        f"InfiniTrain's binaries print")


def test_a_signal_crash_names_the_binary_not_infini_run_in_threads_mode(build, tmp_path):
    spec = _spec(tmp_path, flags={"num_iteration": 3}, world_size=2)
    threads = InfiniTrainBackend(build).collect(spec, _result(spec, stderr=_step(1),
                                                              returncode=-11))
    assert threads.problem == "the gpt2 binary stopped early: 2 of 3 step lines missing (step 2, 3)"
    infini = InfiniTrainBackend(build, launch="infini_run").collect(
        spec, _result(spec, stderr=_step(1), returncode=0))
    assert infini.problem.endswith("a rank crashed or stopped early (infini_run exits 0 "
                                   "whatever its children do)")


def test_glog_writes_every_line_unbuffered(build, tmp_path):
    env = InfiniTrainBackend(build).environment(_spec(tmp_path))
    assert env["GLOG_logbuflevel"] == "-1"


def test_a_loader_check_names_the_file_and_the_preset_that_loads(build, tmp_path):
    spec = _spec(tmp_path, flags={"num_iteration": 1})
    stderr = ("F20261201 09:39:57.000100 13918 config.h:36] Check failed: c.n_kv_head == "
              "c.n_head (12 vs. 4) GPT-2 does not use GQA; n_kv_head must equal n_head\n")
    problem = InfiniTrainBackend(build).collect(spec, _result(spec, stderr=stderr,
                                                              returncode=-6)).problem
    assert problem.startswith("a rank stopped on a fatal error: Check failed: c.n_kv_head == "
                              "c.n_head (12 vs. 4)")
    assert f"the model file {spec.checkpoint} is refused by gpt2's loader" in problem
    assert "preset `infinitrain`" in problem


def test_strip_glog_prefix():
    assert strip_glog_prefix(_step(1) + "plain line\n").splitlines() == [
        _step(1).split("] ", 1)[1].rstrip("\n"), "plain line"]


# ------------------------------------------------------------------ what is compared


def test_gradients_unavailable(build):
    backend = InfiniTrainBackend(build)
    assert backend.gradients_unavailable("gpt2", {}) is None
    # TP dumps are compared (replicated files whole, shards against their slice)
    assert backend.gradients_unavailable("gpt2", {"tensor_parallel": 2}) is None
    assert backend.gradient_shards({"tensor_parallel": "4"}) == 4
    assert backend.gradient_shards({}) == 1
    assert backend.gradients_unavailable("gpt2", {"load": "/c/x/checkpoint_step_000030"}) == (
        "not compared for a resumed run: InfiniTrain dumps gradients only on the first step of "
        "a run from scratch (the loop's step index 0)")
    assert backend.gradients_unavailable("gpt2", {"load": ""}) is None
    reason = backend.gradients_unavailable("llama3", {})
    assert "llama3" in reason and "--dump_gradients" in reason


def test_first_and_expected_steps_of_a_resumed_run(build):
    backend = InfiniTrainBackend(build)
    args = {"load": "/session/checkpoints/gpt2/ckpt/checkpoint_step_000030", "num_iteration": 50}
    assert backend.first_step(args) == 31
    assert backend.expected_steps(args) == list(range(31, 51))


def test_first_and_expected_steps_by_default(build):
    backend = InfiniTrainBackend(build)
    assert DEFAULT_NUM_ITERATION == 10
    assert backend.first_step({}) == 1
    assert backend.expected_steps({}) == list(range(1, 11))
    assert backend.expected_steps({"num_iteration": "3"}) == [1, 2, 3]
    assert backend.first_step({"load": "/somewhere/else"}) == 1


def test_a_resumed_run_expects_only_its_own_steps(build, tmp_path):
    spec = _spec(tmp_path, flags={"load": "/c/checkpoint_step_000002", "num_iteration": 4})
    backend = InfiniTrainBackend(build)
    assert backend.collect(spec, _result(spec, stderr=_step(3, 4) + _step(4, 4))).problem is None
    problem = backend.collect(spec, _result(spec, stderr=_step(3, 4))).problem
    assert "1 of 2 step lines missing (step 4)" in problem


def test_fatal_lines_of_older_glog_without_the_year_are_recognised():
    from harness.launch.infinitrain import _FATAL

    for prefix in ("F0625", "F20260625"):
        line = f"{prefix} 05:21:33.123456 12345 main.cc:12] Check failed: planted rank 2"
        assert _FATAL.search(line)["message"] == "Check failed: planted rank 2"


def test_expected_steps_follow_tiny_mixtrals_log_interval(build):
    """tiny_mixtral prints every N-th step and the last (feat/support_moe main.cc:140); a
    run that printed those is not missing the others."""
    backend = InfiniTrainBackend(build)
    assert backend.expected_steps({"num_iteration": 10, "log_interval": 3}) == [3, 6, 9, 10]
    assert backend.expected_steps({"num_iteration": 10, "log_interval": 1}) == list(range(1, 11))
    assert backend.expected_steps({"num_iteration": 10, "log_interval": 0}) == []


@pytest.mark.subprocess  # asks the stand-in binary for its --helpxml listing
def test_a_run_that_prints_no_step_is_skipped_not_passed(tmp_path):
    backend = InfiniTrainBackend(make_build_dir(tmp_path / "moe", flavour="support_moe"))
    reason = backend.unsupported("tiny_mixtral", {"num_iteration": 10, "log_interval": 0}, 1)
    assert reason.startswith("prints no step line to compare (--log_interval=0: "
                             "feat/support_moe@b7e0760:example/tiny_mixtral/main.cc:34")
