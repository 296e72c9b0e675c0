"""Does a measured, balanced pipeline layout pay? PP=2 on CPU, one process per core.

    python benchmarks/layout_payoff.py [--vocab 16384] [--layers 8] [--width 256] [--rounds 3]

A GPT-2 whose lm head is heavy (a large vocabulary against few, narrow layers), generated here
with the project's own llm.c writer. Every contiguous 2-stage split of its layers is trained for
a few steps under `torchrun --nproc-per-node 2 -m harness.trainer --pipeline_parallel 2`
(gloo, one process per core, 1F1B), configurations alternating within each round (the order
rotates and reverses between rounds), tokens/s read from each run's steps.jsonl, warm-up steps
dropped, the median over all kept steps of all rounds reported. Labelled among them:

- uniform: the default split;
- params (L): costs from parameter counts, a layer's parameters per layer and `L:` = the head's
  parameters / a layer's (what a parameter-counting balancer does);
- params (E+L): the same with `E:` = the embedding's parameters / a layer's too: GPT-2's tied
  embedding has as many parameters as the head, so by parameter count the embedding is heavy;
- suggested: our workflow, a PP=2 run of the uniform split with `--profile_layers`, then
  `python -m harness.layout.suggest --pipeline-parallel 2 --profile FILES --json`;
- suggested (1 device): the same from a single-process profile (one thread).

Targets: suggested >= 0.97 x the best split of the sweep, and >= 1.10 x uniform.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from tabulate import tabulate

from bench_common import PYTHON, REPO, header, median
from harness.layout import PipelineLayout


def make_model(out: Path, vocab: int, layers: int, width: int, block: int) -> tuple[Path, Path]:
    from harness.assets.generate import init_weights, token_stream
    from harness.spec.llmc import write_checkpoint, write_tokens
    from harness.trainer.models.configs import GPT2Config

    config = GPT2Config(block_size=block, vocab_size=vocab, n_layer=layers, n_head=width // 32,
                        n_embd=width, padded_vocab_size=-(-vocab // 128) * 128)
    checkpoint, tokens = out / "gpt2_heavy_head.bin", out / "tokens_train.bin"
    write_checkpoint(checkpoint, config, init_weights(config, seed=0))
    write_tokens(tokens, token_stream(256 * 1024, 0, "train"), kind="gpt2")
    return checkpoint, tokens


def param_costs(vocab: int, layers: int, width: int, block: int) -> tuple[float, float]:
    """(E, L) in units of one layer's parameter count."""
    c, v = width, -(-vocab // 128) * 128
    layer = 12 * c * c + 13 * c  # c_attn, c_proj, c_fc, mlp.c_proj weights + biases, 2 LayerNorms
    head = v * c + 2 * c  # lm head (tied wte) + ln_f
    embedding = (v + block) * c  # wte + wpe
    return embedding / layer, head / layer


def trainer_args(a, checkpoint: Path, tokens: Path, steps: int) -> list[str]:
    return ["--model", "gpt2", "--llmc_filepath", str(checkpoint), "--input_bin", str(tokens),
            "--batch_size", str(a.batch_size), "--sequence_length", str(a.sequence_length),
            "--total_batch_size", str(a.batch_size * a.sequence_length * a.microbatches),
            "--num_iteration", str(steps), "--optimizer", "adamw", "--learning_rate", "1e-4"]


def torchrun(args: list[str]) -> None:
    cmd = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(29500 + os.getpid() % 1000), "-m", "harness.trainer", *args]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")


def suggest(files: list[Path]) -> dict:
    done = subprocess.run([PYTHON, "-m", "harness.layout.suggest", "--pipeline-parallel", "2",
                           "--profile", *map(str, files), "--json"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--sequence_length", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile_steps", type=int, default=6)
    a = p.parse_args()
    n = a.layers
    header(f"layout payoff: GPT-2 {n} layers, width {a.width}, vocab {a.vocab}, PP=2 on CPU")
    tmp = Path(tempfile.mkdtemp(prefix="layout_payoff_"))
    checkpoint, tokens = make_model(tmp, a.vocab, n, a.width, a.sequence_length)

    # Our workflow: profile the uniform split at PP=2 (and, for comparison, on one device).
    prof = tmp / "profile" / "layers.jsonl"
    torchrun([*trainer_args(a, checkpoint, tokens, a.profile_steps), "--pipeline_parallel", "2",
              "--profile_layers", str(prof), "--output_dir", str(tmp / "profile")])
    pp_suggestion = suggest(sorted(prof.parent.glob("layers.rank*.jsonl")))
    single = tmp / "profile1" / "layers.jsonl"
    # One thread, as torchrun gives each rank: a 2-thread process on a shared 2-core machine
    # stalls whenever another job takes a core, and its layer times with it.
    subprocess.run([PYTHON, "-m", "harness.trainer",
                    *trainer_args(a, checkpoint, tokens, a.profile_steps),
                    "--profile_layers", str(single)], cwd=REPO, check=True, capture_output=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    one_suggestion = suggest([single])
    e, l = param_costs(a.vocab, n, a.width, a.sequence_length)
    labels: dict[tuple, list[str]] = {}

    def label(counts, name):
        labels.setdefault(tuple(counts), []).append(name)

    label(PipelineLayout.uniform(n, 2).stage_layer_counts(), "uniform")
    label(PipelineLayout.from_costs(n, 2, f"1x{n},L:{l:.3f}").stage_layer_counts(),
          f"params (L:{l:.2f})")
    label(PipelineLayout.from_costs(n, 2, f"1x{n},E:{e:.3f},L:{l:.3f}").stage_layer_counts(),
          f"params (E:{e:.2f},L:{l:.2f})")
    label(pp_suggestion["partition"], "suggested")
    label(one_suggestion["partition"], "suggested (1 device)")
    for name, s in (("PP=2 profile", pp_suggestion), ("1-device profile", one_suggestion)):
        costs = s["costs"]
        print(f"# {name}: layer costs (ms) {', '.join(f'{c:.0f}' for c in costs['layers'])}; "
              f"E {costs['embedding']:.0f}, L {costs['lm_head']:.0f} "
              f"(L = {costs['lm_head'] / median(costs['layers']):.2f} layers) "
              f"-> {s['flag']}", flush=True)

    splits = [(k, n - k) for k in range(1, n)]
    samples: dict[tuple, list[float]] = {s: [] for s in splits}
    per_round: dict[tuple, list[float]] = {s: [] for s in splits}
    for r in range(a.rounds):
        order = splits[r % len(splits):] + splits[:r % len(splits)]
        if r % 2:
            order.reverse()
        for split in order:
            out = tmp / f"run-{split[0]}-{split[1]}-{r}"
            torchrun([*trainer_args(a, checkpoint, tokens, a.steps), "--pipeline_parallel", "2",
                      "--pipeline_layer_partition", f"{split[0]},{split[1]}",
                      "--output_dir", str(out)])
            steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x]
            kept = [s["tokens_per_s"] for s in steps[a.warmup:]]
            samples[split] += kept
            per_round[split].append(median(kept))
        print(f"  round {r + 1}: " + ", ".join(f"{s[0]},{s[1]} {per_round[s][-1]:.0f}"
                                              for s in splits), flush=True)

    tps = {s: median(v) for s, v in samples.items()}
    top = {s: max(v) for s, v in samples.items()}  # the least disturbed step of all rounds
    ranking = sorted(splits, key=lambda s: -tps[s])
    top_ranking = sorted(splits, key=lambda s: -top[s])
    uni = tuple(PipelineLayout.uniform(n, 2).stage_layer_counts())
    best, uniform = tps[ranking[0]], tps[uni]
    rows = []
    for split in ranking:
        rows.append([f"{split[0]},{split[1]}", ", ".join(labels.get(split, [])),
                     f"{tps[split]:.0f}", " ".join(f"{x:.0f}" for x in per_round[split]),
                     f"{tps[split] / uniform:.3f}", f"{tps[split] / best:.3f}",
                     ranking.index(split) + 1, f"{top[split]:.0f}",
                     f"{top[split] / top[uni]:.3f}", top_ranking.index(split) + 1])
    print()
    print(tabulate(rows, headers=["split", "chosen by", "median tok/s", "per-round medians",
                                  "vs uniform", "vs best", "rank", "best step tok/s",
                                  "best step vs uniform", "rank by best step"],
                   disable_numparse=True))
    chosen = tuple(pp_suggestion["partition"])
    vs_best = [per_round[chosen][r] / max(per_round[s][r] for s in splits)
               for r in range(a.rounds)]
    vs_uniform = [per_round[chosen][r] / per_round[uni][r] for r in range(a.rounds)]
    print("\nper round, suggested / best of the round: "
          + " ".join(f"{x:.3f}" for x in vs_best) + f" (median {median(vs_best):.3f}); "
          "suggested / uniform: " + " ".join(f"{x:.3f}" for x in vs_uniform)
          + f" (median {median(vs_uniform):.3f})")
    print(f"suggested {chosen[0]},{chosen[1]}: rank {ranking.index(chosen) + 1} of "
          f"{len(splits)}; {tps[chosen] / best:.3f} x best (target >= 0.97: "
          f"{'met' if tps[chosen] / best >= 0.97 else 'MISSED'}), {tps[chosen] / uniform:.3f} x "
          f"uniform (target >= 1.10: {'met' if tps[chosen] / uniform >= 1.10 else 'MISSED'})")


if __name__ == "__main__":
    main()
