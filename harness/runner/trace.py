"""The trace stage: a case's step rerun with every module's output and gradient dumped, beside
its partner's, and compared module by module (harness.compare.trace).

Two uses:

- **Locating** (`--harness-trace failed|all|none`, default failed): a case that failed (or
  every case, under `all`) is rerun to its first diverging step N (the loss's; 1 where only the
  first step's gradients differed) with InfiniTrain's `--precision_check`, and so is its
  partner: the single-device reference when the self-check failed, the PyTorch baseline when
  only the baseline did. The record's `trace` and the failure text then name the first module
  whose numbers part.
- **Judging** (`--harness-baseline pytorch`): a module-level comparison of step 1 with the
  PyTorch baseline is part of the baseline check (`baseline.trace`), so a kernel bug too small
  to move the loss past its threshold still fails, at its module. `--harness-trace none`
  turns this off too (a LLaMA 3 trace is hundreds of MB: the logits over a 128,256 vocabulary).

A trace rerun drops the case's own output paths and its checkpoint and resume flags (it must
not write where a resumed case reads), and pins a schedule that spans `num_iteration` to the
case's own length, so cutting the run at step N leaves steps 1..N as they were. The tensors
are removed once compared, but for the first diverging pair and the last matched one where
`--harness-keep-dumps` keeps a failed case's dumps.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from harness.baseline.live import BaselineCheck, with_module_check
from harness.compare.dumps import keeps
from harness.compare.trace import Naming, TraceThresholds, compare_traces, not_traced
from harness.contracts.trace import TraceError, trace_flags
from harness.reference import ReferenceError

from .replay import blame_of, not_replayed, replay_unavailable
from .stages import Collected, Judged, RunTarget, CasePlan

TRACE_POLICIES = ("failed", "all", "none")
REFERENCE, BASELINE = "reference", "pytorch baseline"

# Per-tensor thresholds: max |d| <= atol + rtol * max |partner|, ten times the noise measured
# between the two sides at step 1 (docs/benchmarks.md#module-traces): InfiniTrain
# master's CPU build against the bundled PyTorch trainer on the infinitrain preset, every
# module of gpt2 and llama3 basic/1, worst |d| / (1e-6 + 1e-4 max |partner|) 0.55 (llama3
# h.2.attn.c_proj forward, 1.2e-6 absolute, 1.05e-4 of its largest value; gpt2 0.005). A
# kernel bug the loss hides is far above: GELU's constant x10 is 3.4e-2 of its output.
# bfloat16 is not measured (no bf16 CPU build): its 8-bit mantissa (2^-8 = 3.9e-3 per
# rounding), compounded over a block.
TRACE_THRESHOLDS = {
    "float32": TraceThresholds(1e-5, 1e-3, "docs/benchmarks.md#module-traces: 10x the float32 "
                               "noise between InfiniTrain master (CPU) and PyTorch at step 1"),
    "bfloat16": TraceThresholds(1e-3, 5e-2, "not measured: bfloat16's 2^-8 rounding, "
                                "compounded over a block"),
}


# Against its own reference the trainer differs only by reduction order: the bundled trainer's
# TP=2 traces are within 5e-7 of single-device (relative to each tensor's largest value),
# LLaMA 3's within 2.4e-7, PP=2 bit for bit (tests/trainer/test_precision_check.py's runs,
# docs/benchmarks.md#trace-thresholds). Twenty times that: a 1e-3 scale on one rank's all-reduce is
# caught there (the PyTorch-vs-InfiniTrain threshold above would let it through).
SELF_CHECK_THRESHOLDS = TraceThresholds(
    1e-9, 1e-5, "docs/benchmarks.md#module-traces: 20x the noise between the bundled trainer's "
    "TP=2 / PP=2 traces and single-device (5e-7)")


def thresholds_for(dtype: str | None, partner: str = BASELINE) -> TraceThresholds:
    """The per-tensor thresholds: the same trainer's reference is held closer than another
    implementation (the PyTorch baseline), float32 only; bfloat16 is one threshold."""
    if partner == REFERENCE and (dtype or "float32") == "float32":
        return SELF_CHECK_THRESHOLDS
    return TRACE_THRESHOLDS.get(dtype or "float32", TRACE_THRESHOLDS["float32"])


def first_failing_step(judged: Judged | None, baseline: BaselineCheck | None,
                       partner: str) -> int:
    """The step to trace: the loss's first diverging step against that partner; 1 where the
    loss agreed (the first step's gradients are what differed)."""
    if partner == REFERENCE and judged is not None and judged.verdict.loss is not None:
        first = judged.verdict.loss.first
        return int(first[0]) if first is not None else 1
    if partner == BASELINE and baseline is not None and baseline.verdict is not None:
        return int(baseline.verdict.first_diverging_step or 1)
    return 1


def stage_layers(layout: dict | None, world_size: int, pp: int) -> dict[int, tuple[int, ...]]:
    """Each rank's stage's global layers, sorted, for a trainer that numbers a stage's layers
    from 0 (InfiniTrain). The pipeline axis is the slowest of the rank layout, TP then DP
    inside it (InfiniTrain master@b24d92f:infini_train/include/nn/parallel/global.h:17
    order {TP, DP, PP}; the bundled trainer's world.py alike)."""
    if pp <= 1 or not isinstance(layout, dict) or not layout.get("chunks"):
        return {}
    per_stage = world_size // pp
    layers: dict[int, list[int]] = {}
    for stage, start, end in layout["chunks"]:
        layers.setdefault(int(stage), []).extend(range(int(start), int(end)))
    return {rank: tuple(sorted(layers.get(rank // per_stage, [])))
            for rank in range(world_size)}


def trace_lines(trace: dict | None) -> list[str]:
    """The failure text's trace part: where the numbers part, or why no trace says so."""
    if trace is None:
        return []
    if trace["status"] in ("diverged", "matched"):
        return [f"trace of step {trace['step']} against the {trace['partner']}: "
                f"{trace['line']}", *blame_lines(trace)]
    return [f"trace of step {trace['step']} against the {trace['partner']}: "
            f"{trace['status']}: {trace['reason']}"]


def blame_lines(trace: dict) -> list[str]:
    """The failure text's replay part: the module blamed on its own inputs, or why none was."""
    blame = trace.get("blame")
    if not blame:
        return []
    if blame["status"] in ("skipped", "error"):
        return [f"module replay: {blame['status']}: {blame['reason']}"]
    return [f"module replay (each module on the subject's own inputs): {blame['line']}"]


class Tracer:
    """Takes a case's traces through the case runner's own stages (lease, launch, collect):
    `runner` is the CaseRunner (its backend, settings, run_target, live baseline)."""

    def __init__(self, runner) -> None:
        self.runner = runner

    # ----------------------------------------------------------------- the baseline's check

    def baseline_module_check(self, planned: CasePlan, collected: Collected,
                              check: BaselineCheck) -> BaselineCheck:
        """Step 1, module by module, against the PyTorch baseline: part of the baseline
        check where both sides can be traced; a reason in `baseline.trace` where not."""
        runner, case = self.runner, planned.case
        if check.status in ("skipped", "error") or check.source.split()[0] != "pytorch":
            return check
        if runner.settings.trace == "none":  # no traces at all: the cost is the user's call
            return with_module_check(check, not_traced(
                "skipped", "not traced: --harness-trace none", 1, BASELINE))
        why = runner.backend.trace_unavailable(case.model, planned.flags)
        if why is None and case.world_size > 1:
            why = ("not traced: the baseline's module check runs on one-device cases (a "
                   "multi-rank case is traced against its reference when it fails)")
        if why is not None:
            return with_module_check(check, not_traced("skipped", why, 1, BASELINE))
        trace = self._pair(planned, 1, BASELINE, "baseline-trace",
                           failed=check.status == "failed")
        return with_module_check(check, trace)

    # ------------------------------------------------------------------------- locating

    def locate(self, planned: CasePlan, collected: Collected, judged: Judged,
               baseline: BaselineCheck | None) -> dict | None:
        """The case's trace under `--harness-trace`, or None where none is due."""
        runner, case = self.runner, planned.case
        policy = runner.settings.trace
        self_failed = not judged.verdict.ok
        base_failed = baseline is not None and baseline.status == "failed"
        if policy == "none" or (policy == "failed" and not (self_failed or base_failed)):
            return None
        partner = BASELINE if base_failed and not self_failed else REFERENCE
        step = first_failing_step(judged, baseline, partner)
        if partner == BASELINE and step == 1 and baseline.trace is not None and (
                baseline.trace.get("status") == "diverged"
                or (baseline.trace.get("blame") or {}).get("status") == "blamed"):
            return None  # the baseline's own module check at step 1 located it
        why = runner.backend.trace_unavailable(case.model, planned.flags)
        if why is None and case.dp > 1 and partner == REFERENCE:
            # a wrong location is worse than none: data-parallel rank r takes every dp-th
            # microbatch (harness/trainer/data.py:54), so its call k is the reference's call
            # r + k * dp, and pieces are paired by call
            why = ("not traced: a data-parallel rank's microbatches are every dp-th of the "
                   "reference's, and pairing them call by call is not built")
        if why is not None:
            return not_traced("skipped", why, step, partner)
        return self._pair(planned, step, partner, "trace", failed=self_failed or base_failed,
                          layout=collected.layout)

    # ---------------------------------------------------------------------------- shared

    def _pair(self, planned: CasePlan, step: int, partner: str, name: str, failed: bool,
              layout: dict | None = None) -> dict:
        """Both sides run to `step` with their traces (in the case's folder `name`), then
        compared."""
        runner, case = self.runner, planned.case
        folder = planned.out / name
        seconds: dict[str, float] = {}
        if folder.exists():
            shutil.rmtree(folder)
        run_flags = trace_flags(planned.flags, step, folder / "run" / "dump")
        run = RunTarget(f"{case.name}-trace", case.model, run_flags, case.world_size,
                        planned.checkpoint, planned.input_bin, folder / "run",
                        gradients=False, port=case.world_size > 1,
                        launcher_processes=case.launcher_processes)
        pairing = runner.backend.trace_pairing(case.model)
        # a trainer that numbers a stage's layers from 0: each run rank's global layers
        layers = stage_layers(layout, case.world_size, case.pp) \
            if pairing is not None and pairing.stage_local_layers else {}
        if partner == REFERENCE:
            ref_flags = trace_flags(runner.run_flags(case, reference=True), step,
                                    folder / "partner" / "dump")
            world = case.reference_world_size
            target = RunTarget("reference-trace", case.model, ref_flags, world,
                               planned.checkpoint, planned.input_bin, folder / "partner",
                               gradients=False, port=world > 1)
            backend = runner.backend
            # same trainer on both sides: names as they are, a stage's layers made global
            naming = Naming(None, layers)
        else:  # the PyTorch baseline's trace, cached as its runs are
            started = time.time()
            try:
                partner_dump = runner.live_baseline().trace_dump(
                    runner.backend, case.model, case.args, planned.checkpoint,
                    planned.input_bin, step)
            except ValueError as error:  # BaselineUnmatched: no flags compute the case
                return not_traced("skipped", f"not traced: {error}", step, partner)
            except ReferenceError as error:
                return not_traced("error", str(error).splitlines()[0], step, partner)
            naming = Naming(pairing, layers)
            seconds["partner_s"] = time.time() - started  # ~0 where the cache had it
        runs = [("the case's", run, runner.backend)]
        if partner == REFERENCE:
            runs.append((f"the {partner}'s", target, backend))
            partner_dump = folder / "partner" / "dump"
        for (name, target_, backend_), key in zip(runs, ("run_s", "partner_s")):
            started = time.time()
            ran = runner.run_target(target_, backend_)
            seconds[key] = time.time() - started
            if ran.failed:
                result = ran.launched.result
                return not_traced("error", f"{name} traced run to step {step} failed: "
                                  f"{ran.outputs.problem or f'exit code {result.returncode}'}"
                                  f" (log {result.stderr})", step, partner)
        # the replay reads the subject's tensors, which the comparison below removes
        blame = self._blame(planned, step, folder) if partner == BASELINE else None
        try:
            # a cached baseline trace stays for the next case and session
            diff = compare_traces(folder / "run" / "dump", partner_dump, naming,
                                  thresholds_for(case.flags.get("dtype"), partner), step=step,
                                  partner=partner, remove_partner=partner == REFERENCE,
                                  keep_first=keeps(runner.settings.keep_dumps, not failed))
        except TraceError as error:
            return not_traced("error", f"trace unreadable: {error}", step, partner)
        record = diff.to_dict()
        # the traced runs' wall time beside the comparison's (cost.seconds)
        record["cost"].update({k: round(v, 3) for k, v in seconds.items()})
        if blame is not None:
            record["blame"] = blame
        return record

    def _blame(self, planned: CasePlan, step: int, folder: Path) -> dict:
        """The subject's traced step replayed module by module (harness.runner.replay)."""
        runner, case = self.runner, planned.case
        why = replay_unavailable(case.world_size, step, case.flags.get("dtype"))
        if why is not None:
            return not_replayed("skipped", why)
        try:
            flags = runner.backend.baseline_flags(case.model, case.args)
        except ValueError as error:  # no bundled flags compute the case
            return not_replayed("skipped", f"not replayed: {error}")
        program = case.model if runner.backend.trace_pairing(case.model) is not None else None
        return blame_of(folder / "run" / "dump", folder / "replay", program, flags,
                        planned.checkpoint, planned.input_bin, runner.settings.timeout_s)
