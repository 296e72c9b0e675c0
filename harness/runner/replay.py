"""The replay stage: a traced one-device step of the subject, every module of the bundled model
run on the subject's own recorded tensors (`python -m harness.trainer replay`, in its own
process), judged module by module against each module's own floor (harness.compare.blame).

It runs where a trace of the subject exists and before its tensors are removed: the baseline's
step-1 module check and a failed case's trace against the PyTorch baseline
(harness.runner.trace). What it cannot replay it says, and the trace's accumulated comparison
stands alone there: a multi-rank subject (a TP rank's slices, a pipeline stage's layers are
not replayed yet), a step after the first (the subject's updated weights are not in its dumps),
a dtype whose floors are not measured.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from harness.compare.blame import REPLAY_THRESHOLDS, judge
from harness.contracts.replay import REPLAY_FILE, ReplayRecordError, read_replay
from harness.launch import run_process, tail

BLAME_STATUSES = ("blamed", "clean", "skipped", "error")


def not_replayed(status: str, reason: str) -> dict:
    return {"status": status, "reason": reason, "line": None, "blamed": None,
            "over": [], "not_replayed": [], "rows": 0, "thresholds": None, "cost": None}


def replay_unavailable(world_size: int, step: int, dtype: str | None) -> str | None:
    if world_size > 1:
        return ("not replayed: a multi-rank subject (its ranks' slices and stages are not "
                "replayed yet); the trace's accumulated comparison stands")
    if step != 1:
        return (f"not replayed: step {step} (the subject's weights after its updates are not "
                f"in its dumps; the replay runs step 1 from the checkpoint)")
    if (dtype or "float32") not in REPLAY_THRESHOLDS:
        return f"not replayed: no measured floors for {dtype} (docs/benchmarks.md#module-replay)"
    return None


def blame_of(trace_folder: Path, out: Path, program: str | None, flags: dict,
             checkpoint: Path, input_bin: Path, timeout_s: float) -> dict:
    """The replay of a one-device trace (`flags`: the bundled trainer's batch flags for the
    case, the baseline's), judged: the record's `blame`."""
    started = time.time()
    dtype = flags.get("dtype", "float32")
    argv = [sys.executable, "-m", "harness.trainer", "replay", "--trace", str(trace_folder),
            "--checkpoint", str(checkpoint), "--input_bin", str(input_bin),
            "--batch_size", str(flags["batch_size"]),
            "--sequence_length", str(flags["sequence_length"]),
            "--total_batch_size", str(flags["total_batch_size"]), "--dtype", dtype,
            "--out", str(out / REPLAY_FILE)] + (["--program", program] if program else [])
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = run_process(argv, env, timeout_s, out / "replay.stdout", out / "replay.stderr")
    if not result.ok:
        why = "timed out" if result.timed_out else f"exit code {result.returncode}"
        return not_replayed("error", f"the replay {why}: {tail(result.stderr, 3)} "
                                     f"(log {result.stderr})")
    try:
        rows = read_replay(out / REPLAY_FILE)
    except ReplayRecordError as error:
        return not_replayed("error", str(error))
    thresholds = REPLAY_THRESHOLDS[dtype]
    blame = judge(rows, thresholds)
    blamed = blame.blamed
    over = [j for j in blame.judged if j.over]
    return {
        "status": "blamed" if blamed is not None else "clean",
        "reason": None,
        "line": blame.summary(),
        "blamed": None if blamed is None else _judged(blamed),
        "over": [_judged(j) for j in over[:10]],
        "not_replayed": [f"{j.row.label}: {j.row.note}" for j in blame.not_replayed][:20],
        "rows": len(rows),
        "thresholds": {"factor": thresholds.factor, "min_relative": thresholds.min_relative,
                       "source": thresholds.source},
        "cost": {"seconds": round(time.time() - started, 3)},
    }


def _judged(judged) -> dict:
    row = judged.row
    return {"module": row.module, "phase": row.phase, "index": row.index,
            "consumers": list(row.consumers), "local_error": row.subject_error,
            "floor": judged.floor, "scale": row.scale, "ratio": judged.ratio,
            "line": judged.describe()}
