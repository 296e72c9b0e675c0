"""Suggest a --pipeline_layer_partition from layer costs or a timing profile.

    python -m harness.layout.suggest --pipeline-parallel 2 --costs 1x8,L:4.5
    python -m harness.layout.suggest --pipeline-parallel 4 --profile run/layers.jsonl

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

from .costs import LayerCosts, parse_costs
from .errors import LayoutError
from .layout import PipelineLayout
from .profile import read_profile
from .solver import stage_costs

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


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.pipeline_parallel < 1:
            raise _Usage(f"--pipeline-parallel must be >= 1, got {args.pipeline_parallel}")
        report = suggest(_costs(args), args.pipeline_parallel)
    except (_Usage, LayoutError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
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


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


if __name__ == "__main__":
    sys.exit(main())
