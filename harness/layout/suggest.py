"""Suggest a pipeline layout from layer costs or a timing profile.

    python -m harness.layout.suggest --pipeline-parallel 2 --costs 1x8,L:4.5
    python -m harness.layout.suggest --pipeline-parallel 4 --profile run/layers.jsonl
    python -m harness.layout.suggest --pipeline-parallel 2 --virtual-pipeline-parallel 2 \
        --profile run/layers.jsonl --memory-budget-mb 900

With one chunk per stage and no memory budget it prints the --pipeline_layer_partition that
minimizes the slowest stage (exact, solver.py). With --virtual-pipeline-parallel > 1, or with
--memory-budget-mb, it searches chunk layouts (chunk_search.py): the sizes, order and owners of
the chunks with the least simulated step time of the schedule the trainer will run, every
stage's modelled peak memory within the budget, and prints a --pipeline_chunk_layout (or, with
one chunk per stage, a --pipeline_layer_partition). `--front` prints the step-time / peak-memory
front instead, one layout a line.

A profile path the trainer wrote per rank (`--profile_layers run/layers.jsonl` under torchrun
writes run/layers.rank0.jsonl, run/layers.rank1.jsonl, ...) may be given as the name passed to
the trainer: it stands for every rank's file.

stdout gets the ready-to-paste flag only (so `$(...)` works); a summary goes to stderr. `--json`
prints one JSON object to stdout instead. The partition comes from `PipelineLayout.from_costs`,
the very call the trainer makes for --pipeline_layer_costs, so the two always agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from .chunk_search import search_chunks
from .costs import LayerCosts, parse_costs
from .errors import LayoutError
from .layout import PipelineLayout
from .profile import StepProfile, read_profile, read_step_profile
from .schedules import SCHEDULES_FOR_KIND, SIMULATED, chunk_order_kind
from .solver import stage_costs
from .step_model import OPTIMIZER_STATES, Evaluation, StepCosts, StepModel, split_total

MB = 2 ** 20

PROG = "python -m harness.layout.suggest"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block: the message says what is wrong
        raise _Usage(message)


class _Usage(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Suggest the pipeline layer partition that minimizes the slowest stage.")
    p.add_argument("--pipeline-parallel", "--pipeline_parallel", type=int, required=True, metavar="N",
                   help="number of pipeline stages")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--costs", metavar="SPEC", help="per-layer relative costs, e.g. '1x8,L:4.5'")
    source.add_argument("--profile", nargs="+", metavar="FILE",
                        help="timing records: harness.layer_timing/1 JSON lines or InfiniTrain "
                             "PROFILE_MODE text; the path given to the trainer's --profile_layers "
                             "stands for its per-rank files (FILE.rank<r>)")
    p.add_argument("--embedding-cost", "--embedding_cost", type=float, metavar="X",
                   help="cost added to the first stage (replaces a profiled value)")
    p.add_argument("--lm-head-cost", "--lm_head_cost", type=float, metavar="Y",
                   help="cost added to the last stage (replaces a profiled value)")
    p.add_argument("--warmup-samples", "--warmup_samples", type=int, default=1, metavar="K",
                   help="samples dropped at the start of each layer's stream (default 1)")
    p.add_argument("--virtual-pipeline-parallel", "--virtual_pipeline_parallel", type=int, default=1,
                   metavar="V", help="chunks per stage (default 1); > 1 searches chunk layouts")
    p.add_argument("--microbatches", type=int, metavar="M",
                   help="microbatches per step (default: the profile's, else 2 x pp)")
    p.add_argument("--schedule", metavar="NAME",
                   help=f"the --pipeline_schedule the run will use (default: the trainer's choice "
                        f"for each chunk order); simulated: {', '.join(SIMULATED)}")
    p.add_argument("--memory-budget-mb", "--memory_budget_mb", type=float, metavar="MB",
                   help="per-device memory budget: every stage's modelled peak must fit")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_STATES), default="sgd",
                   help="the trainer's --optimizer, for the optimizer state in the peak (default sgd)")
    p.add_argument("--front", action="store_true",
                   help="print the step-time / peak-memory front of the layouts searched")
    p.add_argument("--any-profile-shape", "--any_profile_shape", action="store_true",
                   help="accept a profile recorded with another pp / vpp than asked")
    p.add_argument("--json", action="store_true", help="print a JSON report instead of the flag")
    return p


def suggest(costs: LayerCosts, pp: int) -> dict:
    """The report: the optimal partition and the uniform one, with their modeled stage costs."""
    n = len(costs.layers)
    best = PipelineLayout.from_costs(n, pp, costs)
    partition = list(best.stage_layer_counts())
    report = {"pipeline_parallel": pp, "num_layers": n, "partition": partition,
              "flag": f"--pipeline_layer_partition={','.join(map(str, partition))}",
              **_figures(partition, costs),
              "uniform": {"partition": (u := list(PipelineLayout.uniform(n, pp).stage_layer_counts())),
                          **_figures(u, costs)},
              "costs": {"layers": list(costs.layers), "embedding": costs.embedding, "lm_head": costs.lm_head}}
    slow, uniform_slow = report["slowest_stage"]["cost"], report["uniform"]["slowest_stage"]["cost"]
    # A pipeline step is paced by its slowest stage, so that ratio is the modeled speed-up.
    report["modeled_improvement"] = {
        "speedup": uniform_slow / slow if slow > 0 else None,
        "step_time_reduction": 1 - slow / uniform_slow if uniform_slow > 0 else None}
    return report


def _figures(partition: list[int], costs: LayerCosts) -> dict:
    per_stage = list(stage_costs(partition, costs.layers, costs.embedding, costs.lm_head))
    slowest = max(range(len(per_stage)), key=per_stage.__getitem__)
    return {"stage_costs": per_stage, "slowest_stage": {"stage": slowest, "cost": per_stage[slowest]}}


def _costs(args: argparse.Namespace) -> LayerCosts:
    if args.costs is not None:
        costs = parse_costs(args.costs)
        for flag, tag, value, parsed in (("--embedding-cost", "E", args.embedding_cost, costs.embedding),
                                         ("--lm-head-cost", "L", args.lm_head_cost, costs.lm_head)):
            if value is not None and parsed:
                raise _Usage(f"{flag} {value} and '{tag}:' in --costs {args.costs!r} both set it; give one")
    else:
        if args.warmup_samples < 0:
            raise _Usage(f"--warmup-samples must be >= 0, got {args.warmup_samples}")
        costs = read_profile(expand_profiles(args.profile), args.warmup_samples)
    overrides = {name: value for name, value in (("embedding", args.embedding_cost), ("lm_head", args.lm_head_cost))
                 if value is not None}
    return replace(costs, **overrides)


def expand_profiles(paths: list[str]) -> list[str]:
    """Each path as given, or, when it does not exist, the per-rank files the trainer wrote for
    it (`layers.jsonl` -> layers.rank0.jsonl, layers.rank1.jsonl, ... in rank order)."""
    import re
    from pathlib import Path

    expanded: list[str] = []
    for given in paths:
        path = Path(given)
        if path.exists():
            expanded.append(given)
            continue
        pattern = re.compile(re.escape(path.stem) + r"\.rank(\d+)" + re.escape(path.suffix) + "$")
        ranks = sorted((int(m.group(1)), p) for p in (path.parent.glob(f"{path.stem}.rank*")
                       if path.parent.is_dir() else []) if (m := pattern.match(p.name)))
        expanded += [str(p) for _, p in ranks] if ranks else [given]
    return expanded


def suggest_chunks(costs: StepCosts, pp: int, vpp: int, microbatches: int, schedule: str | None = None,
                   budget_mb: float | None = None, optimizer: str = "sgd") -> dict:
    """The report of the chunk-layout search; raises LayoutError when nothing fits the budget."""
    _check_schedule_shape(schedule, pp, vpp)
    model = StepModel(costs, pp, microbatches, optimizer)
    budget = None if budget_mb is None else budget_mb * MB
    result = search_chunks(model, vpp, schedule, budget)
    if result.best is None:
        t = result.tightest
        stage = max(range(pp), key=t.peaks.__getitem__)
        # The exact search proves nothing fits; the local search only failed to find a fit.
        searched = "no layout fits" if result.exhaustive else "the local search found no layout that fits"
        raise LayoutError(
            f"{searched} --memory-budget-mb {budget_mb:g}: the lowest modelled peak found is "
            f"stage {stage}'s {t.peaks[stage] / MB:.1f} MB (layout {t.chunk_layout}, {t.schedule}); "
            f"expected a budget of at least {t.peaks[stage] / MB:.1f} MB, or more stages or fewer microbatches")
    best = result.best
    default = _default_layout(model, pp, vpp, schedule)
    flag = (f"--pipeline_chunk_layout={best.chunk_layout}" if vpp > 1
            else f"--pipeline_layer_partition={','.join(map(str, best.sizes))}")
    if schedule is not None:
        flag += f" --pipeline_schedule={best.schedule}"
    return {"pipeline_parallel": pp, "virtual_pipeline_parallel": vpp, "num_layers": costs.num_layers,
            "microbatches": microbatches, "optimizer": optimizer, "memory_budget_mb": budget_mb,
            "flag": flag, **_evaluation(best),
            "default": _evaluation(default),
            "modeled_improvement": {"speedup": default.step_time / best.step_time if best.step_time > 0 else None},
            "search": {"exhaustive": result.exhaustive, "evaluated": len(result.evaluated)},
            "front": [_evaluation(e) for e in result.front()]}


def _check_schedule_shape(schedule: str | None, pp: int, vpp: int) -> None:
    """A schedule asked for must fit some chunk order of pp x vpp chunks."""
    if schedule is None:
        return
    kinds = [kind for kind, names in SCHEDULES_FOR_KIND.items() if schedule.lower() in map(str.lower, names)]
    if not kinds:
        raise LayoutError(f"--schedule {schedule!r} is not a schedule the trainer runs; expected one of "
                          f"{', '.join(dict.fromkeys(n for names in SCHEDULES_FOR_KIND.values() for n in names))}")
    needs = {"sequential": (1, "one chunk per stage: --virtual-pipeline-parallel 1"),
             "round-robin": (None, "round-robin chunks: --virtual-pipeline-parallel >= 2"),
             "v-shape": (2, "V-shaped chunks: --virtual-pipeline-parallel 2"),
             "custom": (None, "")}
    if not any(vpp == want if want else vpp >= 2 for want, _ in (needs[k] for k in kinds)):
        wanted = " or ".join(needs[k][1] for k in kinds if needs[k][1])
        raise LayoutError(f"--schedule {schedule} runs {wanted}, but --virtual-pipeline-parallel is {vpp}; "
                          f"expected a --virtual-pipeline-parallel that schedule runs")


def _default_layout(model: StepModel, pp: int, vpp: int, schedule: str | None) -> Evaluation:
    """The trainer's default for this shape: the uniform round-robin layout."""
    uniform = PipelineLayout.uniform(model.costs.num_layers, pp, vpp)
    stages = tuple(s for s, _, _ in uniform.chunks)
    fitting = SCHEDULES_FOR_KIND[chunk_order_kind(stages, pp)]
    name = next((n for n in fitting if schedule and n.lower() == schedule.lower()), fitting[0])
    return model.evaluate([b - a for _, a, b in uniform.chunks], stages, name)


def _evaluation(e: Evaluation) -> dict:
    return {"chunk_layout": e.chunk_layout, "sizes": list(e.sizes), "schedule": e.schedule,
            "predicted_step_time": e.step_time,
            "stage_peaks_mb": None if e.peaks is None else [p / MB for p in e.peaks]}


def _step_costs(args: argparse.Namespace) -> tuple[StepCosts, int]:
    """Per-microbatch costs and the microbatch count, checked against the asked shape."""
    pp = args.pipeline_parallel
    if args.costs is not None:
        totals = _costs(args)
        totals.check_layers(len(totals.layers))
        if args.memory_budget_mb is not None:
            raise _Usage(f"--memory-budget-mb {args.memory_budget_mb:g} needs per-layer memory figures, "
                         f"which --costs {args.costs!r} does not give; expected --profile files written "
                         f"by the trainer's --profile_layers")
        return StepCosts.from_layer_costs(totals), args.microbatches or 2 * pp
    if args.warmup_samples < 0:
        raise _Usage(f"--warmup-samples must be >= 0, got {args.warmup_samples}")
    profile = _checked_profile(args)
    if args.memory_budget_mb is not None and profile.memory_missing:
        raise _Usage(f"--memory-budget-mb {args.memory_budget_mb:g}: {profile.memory_missing}")
    costs = profile.costs
    overrides = {name: split_total(value) for name, value in (("embedding", args.embedding_cost), ("lm_head", args.lm_head_cost))
                 if value is not None}
    return replace(costs, **overrides), args.microbatches or profile.microbatches or 2 * pp


def _checked_profile(args: argparse.Namespace) -> StepProfile:
    """The --profile files read, refused when their times are not whole layers' (a zero-bubble
    schedule) or their shape is not the one asked."""
    profile = read_step_profile(expand_profiles(args.profile), args.warmup_samples)
    if profile.times_refused:
        raise _Usage(profile.times_refused)
    _check_profile_shape(profile.shape, profile.files, args)
    return profile


def _check_profile_shape(shape: tuple[int, int] | None, files: tuple[str, ...], args) -> None:
    asked = (args.pipeline_parallel, args.virtual_pipeline_parallel)
    if shape is None or shape == asked or args.any_profile_shape:
        return
    raise _Usage(f"{files[0]}{' ...' if len(files) > 1 else ''}: the profile was recorded with "
                 f"--pipeline_parallel {shape[0]} --virtual_pipeline_parallel {shape[1]}, but the "
                 f"suggestion is asked for --pipeline-parallel {asked[0]} --virtual-pipeline-parallel "
                 f"{asked[1]}; expected a profile of that shape (profile its uniform layout), or "
                 f"--any-profile-shape to use these times anyway")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.pipeline_parallel < 1:
            raise _Usage(f"--pipeline-parallel must be >= 1, got {args.pipeline_parallel}")
        if args.virtual_pipeline_parallel < 1:
            raise _Usage(f"--virtual-pipeline-parallel must be >= 1, got {args.virtual_pipeline_parallel}")
        if args.microbatches is not None and args.microbatches < 1:
            raise _Usage(f"--microbatches must be >= 1, got {args.microbatches}")
        if args.memory_budget_mb is not None and not args.memory_budget_mb > 0:
            raise _Usage(f"--memory-budget-mb must be > 0, got {args.memory_budget_mb:g}")
        chunked = (args.virtual_pipeline_parallel > 1 or args.memory_budget_mb is not None or args.front
                   or args.schedule is not None)
        if chunked:
            _check_schedule_shape(args.schedule, args.pipeline_parallel, args.virtual_pipeline_parallel)
            costs, microbatches = _step_costs(args)
            report = suggest_chunks(costs, args.pipeline_parallel, args.virtual_pipeline_parallel, microbatches,
                                    args.schedule, args.memory_budget_mb, args.optimizer)
        else:
            if args.profile is not None and args.warmup_samples >= 0:
                _checked_profile(args)
            report = suggest(_costs(args), args.pipeline_parallel)
    except (_Usage, LayoutError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    if chunked:
        return _print_chunks(report, args)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(report["flag"], flush=True)
    u, imp = report["uniform"], report["modeled_improvement"]
    print(f"# stage costs {_fmt(report['stage_costs'])}, slowest {report['slowest_stage']['cost']:.6g} "
          f"(stage {report['slowest_stage']['stage']}); uniform {','.join(map(str, u['partition']))}: "
          f"{_fmt(u['stage_costs'])}, slowest {u['slowest_stage']['cost']:.6g}"
          + (f"; modeled speed-up {imp['speedup']:.3f}x" if imp["speedup"] is not None else ""),
          file=sys.stderr)
    return 0


def _print_chunks(report: dict, args) -> int:
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if args.front:
        print("# predicted step time, max stage peak MB, schedule, --pipeline_chunk_layout")
        for e in report["front"]:
            peak = "-" if e["stage_peaks_mb"] is None else f"{max(e['stage_peaks_mb']):.1f}"
            print(f"{e['predicted_step_time']:.6g} {peak} {e['schedule']} {e['chunk_layout']}")
        return 0
    print(report["flag"], flush=True)
    d, speedup = report["default"], report["modeled_improvement"]["speedup"]
    peaks = report["stage_peaks_mb"]
    print(f"# {report['schedule']}, {report['microbatches']} microbatches: predicted step "
          f"{report['predicted_step_time']:.6g}"
          + (f", stage peaks {_fmt(peaks)} MB" if peaks else "")
          + f"; default {d['chunk_layout']} ({d['schedule']}): {d['predicted_step_time']:.6g}"
          + (f"; modeled speed-up {speedup:.3f}x" if speedup else "")
          + f"; {'exact' if report['search']['exhaustive'] else 'local'} search over "
            f"{report['search']['evaluated']} layouts", file=sys.stderr)
    return 0


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


if __name__ == "__main__":
    sys.exit(main())
