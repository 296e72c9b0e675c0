"""The trainer's step against a plain step in ONE process, on the same model (a diagnostic for
benchmarks/trainer_throughput.py: it separates the loop's own code from process-level effects).

    OMP_NUM_THREADS=1 python benchmarks/engine_step_inprocess.py [--model gpt2] [--rounds 6]

Same model object, optimizer and data stream; per round one step of each, alternating:
`engine` is what harness.trainer.main does per step (StepBatches, SingleDeviceEngine), `plain`
the loop of benchmarks/plain_loop.py. Median tokens/s over rounds, after one warm-up step each.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from tabulate import tabulate

from bench_common import header, median
from harness.assets.generate import ensure_assets
from harness.trainer.data import StepBatches
from harness.trainer.engine import SingleDeviceEngine
from harness.contracts.llmc import read_checkpoint, read_tokens
from harness.trainer.models import build_model, load_weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--preset", default="bench")
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    header(f"engine step vs plain step in one process ({a.model}, {torch.get_num_threads()} "
           "thread(s))")
    assets = ensure_assets(a.preset)
    checkpoint = read_checkpoint(assets.checkpoint(a.model))
    model = build_model(checkpoint.config)
    load_weights(model, checkpoint.tensors)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0)
    tokens = read_tokens(assets.tokens(a.model), vocab_size=checkpoint.config.vocab_size)
    engine = SingleDeviceEngine(model, torch.device("cpu"), torch.float32)
    batches = StepBatches(tokens, 4, 64, 4)

    def engine_step():
        opt.zero_grad(set_to_none=True)
        x, y = batches.next_step()
        engine.forward_backward(torch.from_numpy(x), torch.from_numpy(y))
        opt.step()

    def plain_step():
        opt.zero_grad(set_to_none=True)
        x, y = batches.next_step()
        for xb, yb in zip(torch.from_numpy(x), torch.from_numpy(y)):
            loss = F.cross_entropy(model(xb).float().flatten(0, 1), yb.flatten(0, 1)) / len(x)
            loss.backward()
        opt.step()

    steps = {"engine": engine_step, "plain": plain_step}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for fn in steps.values():
        fn()
    for _ in range(a.rounds):
        for name, fn in steps.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    tps = {k: 4 * 4 * 64 / median(v) for k, v in times.items()}
    print(tabulate([[k, f"{v:.0f}"] for k, v in tps.items()] +
                   [["engine / plain", f"{tps['engine'] / tps['plain']:.3f}"]],
                   headers=["step", "median tok/s"], disable_numparse=True))


if __name__ == "__main__":
    main()
