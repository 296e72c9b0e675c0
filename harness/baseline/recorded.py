"""The baseline check against recorded logs (`--harness-baseline DIR`): PyTorch result logs,
Megatron logs, InfiniTrain run folders or harness session folders (read by harness.logs), paired
with a case by model and case id, judged as the live baseline is (harness.compare.baseline).

No partner is a skipped baseline saying so; two logs for one case, or a log of the case that
could not be read, an error naming the files: never a quiet pass.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from harness.compare.baseline import bad_pairing
from harness.logs.pairing import resolved
from harness.logs.readers import Reading, read_paths

from .live import BaselineCheck, judged


@lru_cache(maxsize=8)
def _reading(folder: Path) -> Reading:
    """The folder's runs, descriptive section names paired by harness.logs' cited table (never
    guessed), once per process: every case of the session asks."""
    return resolved(read_paths([folder]), {})


def recorded_check(folder: Path, case, run_steps: list[dict], first_step: int) -> BaselineCheck:
    """The case's check against its recorded baseline under `folder`."""
    where = str(folder)
    try:
        reading = _reading(folder.resolve())
    except FileNotFoundError as error:
        return BaselineCheck(where, "error", reason=str(error))
    runs = [r for r in reading.runs if r.key == (case.model, case.case_id)
            and (r.tag is None or r.tag == case.tag)]
    bad = [b for b in reading.bad if (b.model, b.case) == (case.model, case.case_id)]
    if bad:
        return BaselineCheck(where, "error", reason=bad[0].message)
    if not runs:
        return BaselineCheck(where, "skipped", reason=f"no recorded baseline of "
                             f"{case.model}/{case.case_id} in {folder}")
    if len(runs) > 1:
        return BaselineCheck(where, "error", reason=(
            f"{len(runs)} recorded baselines of {case.model}/{case.case_id}: "
            f"{'; '.join(r.source for r in runs)}; expected one"))
    run = runs[0]
    dtype = str(case.args.get("dtype", "float32"))
    if run.dtype != dtype:
        verdict = bad_pairing(dtype, f"{run.source}: a {run.dtype} baseline for a {dtype} "
                                     f"case; expected {dtype}")
        return BaselineCheck(run.source, "failed", reason=verdict.problem, verdict=verdict)
    return judged(run.source, run_steps, list(run.steps), list(run.losses), dtype, first_step,
                  note=run.note, base_lrs=list(run.lrs) or None,  # a log without lrs: none
                  base_lr_resolutions=list(run.lr_resolutions) or None)
