"""Logs of InfiniTrain's nightly runs in their real shape, written by tests: the glog prefix, the
[LAST_CMAKE] / [COMMAND] lines, a run_metadata.log, the step line's placement fields (as
infinitrain/logs/g3025/20260710/master_8779b98 in InfiniTensor/InfiniTrain-Test has them)."""

from pathlib import Path

# The losses of InfiniTrain-Test's g3025 basic/gpt2/2 (20260710, master_8779b98), 10 steps.
LOSSES = (5.219541, 5.110952, 5.023426, 4.939476, 4.858634, 4.780859, 4.706160, 4.634568,
          4.566088, 4.500651)
BASE = "--device cuda --dtype {dtype} --num_iteration 10"
ONE = BASE + " --batch_size 80 --total_batch_size 5120"
DP8 = BASE + " --nthread_per_process 8 --batch_size 10 --total_batch_size 5120"
TP4_SP = BASE + (" --nthread_per_process 8 --batch_size 40 --total_batch_size 5120 "
                 "--tensor_parallel 4 --sequence_parallel true")
PP4_VPP2 = BASE + (" --nthread_per_process 4 --batch_size 10 --total_batch_size 5120 "
                   "--pipeline_parallel 4 --virtual_pipeline_parallel 2")


def write_log(run: Path, name: str, flags: str | None, losses=LOSSES, dtype="float32",
              program="gpt2", tag="basic", planned=10, placement="DP=1, TP=1, SP=0, PP=1",
              stdout=False, metadata=True, day="20260710"):
    """One case's log as InfiniTrain's runner writes it (run_models_and_profile.bash)."""
    folder = run / "logs" / tag if tag else run / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    if metadata:
        (run / "logs" / "run_metadata.log").write_text(
            f"[RUN_STARTED_AT] {day[:4]}-{day[4:6]}-{day[6:]} 06:18:11\n"
            f"[GIT_BRANCH] {run.name.rsplit('_', 1)[0]}\n"
            f"[GIT_COMMIT] {run.name.rsplit('_', 1)[1]}\n[CONFIG_FILE] test_config.json\n")
    lines = ["[LAST_CMAKE] cmake -DUSE_CUDA=ON -DUSE_NCCL=ON .. && make -j"]
    if flags is not None:
        lines.append(f"[COMMAND] ./{program} --input_bin ../data/train.bin --llmc_filepath "
                     f"../data/{program}.bin " + flags.format(dtype=dtype))
    for step, loss in enumerate(losses, 1):
        line = (f"step {step:4d}/{planned} | train loss {loss:.6f} | lr 1.00e-04 | "
                f"(140.06 ms | 36555 tok/s | peak used:  1775 MB | peak reserved:  1856 MB"
                + (")" if stdout else f", {placement})"))
        lines.append(line if stdout else
                     f"E{day} 06:27:07.{step:06d} 140524082143232 main.cc:521] {line}")
    (folder / f"{program}_{name}.log").write_text("\n".join(lines) + "\n")


def off_from(step: int, by: float, losses=LOSSES):
    """The losses with every step from `step` on moved by `by`."""
    return tuple(x + (by if i + 1 >= step else 0.0) for i, x in enumerate(losses))


def night(root: Path, machine="g3025", day="20260710", build="master_8779b98") -> Path:
    """A run folder at the archive's own path."""
    return root / "infinitrain" / "logs" / machine / day / build
