"""Test-only driver: many parallel cases in ONE torchrun launch, each compared in-process with
the single-device engine on the same weights, tokens and flags.

    torchrun --nproc-per-node 2 -m tests.trainer.parallel.driver --world 2 --out result.json

Every rank builds the same tiny model weights and token stream from fixed seeds, runs the
single-device reference (SingleDeviceEngine, SGD) itself, then for each case of this world size
builds a ParallelEngine over the layout and runs the same steps. Rank 0 gathers every rank's
gradient dump (ParallelEngine.gradients) and losses and writes, per case: max |loss diff| over
the steps, max |grad diff| over the first step's gradients, and whether the dump names matched
(each parameter exactly once, same shapes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from harness.layout import resolve_layout
from harness.trainer.engine import SingleDeviceEngine
from harness.trainer.flags import TrainerFlags
from harness.trainer.models import build_model
from harness.trainer.models.configs import GPT2Config, LLaMA3Config, MixtralConfig, Qwen3Config
from harness.trainer.parallel.build import build_parallel_engine
from harness.trainer.parallel.validate import plan_parallel
from harness.trainer.parallel.world import init_distributed

STEPS = 2
LR = 0.5  # large, so a wrong step-1 update shows in step 2's loss

CONFIGS = {
    "gpt2": GPT2Config(block_size=32, vocab_size=64, n_layer=4, n_head=4, n_embd=32,
                       padded_vocab_size=80),
    "llama3": LLaMA3Config(block_size=32, vocab_size=64, n_layer=4, n_head=4, n_kv_head=2,
                           n_embd=32, ffn_dim_multiplier=1.0, multiple_of=32, norm_eps=1e-5,
                           rope_theta=10000.0, use_scaled_rope=True),
    "qwen3": Qwen3Config(block_size=32, vocab_size=64, n_layer=4, n_head=4, n_kv_head=2,
                         n_embd=32),
    "mixtral": MixtralConfig(block_size=32, vocab_size=64, n_layer=4, n_head=4, n_kv_head=2,
                             n_embd=32, num_experts=4, router_topk=2, moe_ffn_hidden_size=32),
}

# name, model, world size, flag overrides. batch 2 x seq 16; total_batch_size sets microbatches.
CASES = [
    ("pp2_partition", "gpt2", 2, dict(pipeline_parallel=2, pipeline_layer_partition="1,3")),
    ("pp2_partition", "llama3", 2, dict(pipeline_parallel=2, pipeline_layer_partition="3,1",
                                          pipeline_schedule="GPipe")),
    ("pp2_costs_L", "gpt2", 2, dict(pipeline_parallel=2, pipeline_layer_costs="1x4,L:2.5")),
    ("pp2_costs_L", "llama3", 2, dict(pipeline_parallel=2, pipeline_layer_costs="1x4,L:2.5")),
    ("pp2_megatron_empty", "gpt2", 2,
     dict(pipeline_parallel=2, pipeline_model_parallel_layout="Et*2|t||t*1NL")),
    ("pp2_megatron_empty", "llama3", 2,
     dict(pipeline_parallel=2, pipeline_model_parallel_layout="Et|t*2||tNL",
          pipeline_schedule="LoopedBFS")),
    ("pp2_vshape_zbv", "gpt2", 2, dict(pipeline_parallel=2, pipeline_chunk_layout="0:1,1:1,1:1,0:1")),
    ("pp2_vshape_dualpipev", "llama3", 2,
     dict(pipeline_parallel=2, pipeline_chunk_layout="0:2,1:1,1:0,0:1",
          pipeline_schedule="DualPipeV")),
    ("pp2_custom_order", "gpt2", 2, dict(pipeline_parallel=2, pipeline_chunk_layout="0:1,0:1,1:1,1:1")),
    ("pp2_interleaved_zb", "llama3", 2,
     dict(pipeline_parallel=2, virtual_pipeline_parallel=2, pipeline_schedule="InterleavedZeroBubble")),
    ("dp2", "gpt2", 2, dict()),
    ("dp2", "llama3", 2, dict()),
    ("tp2", "gpt2", 2, dict(tensor_parallel=2)),
    ("tp2", "llama3", 2, dict(tensor_parallel=2)),
    ("tp2_sp", "gpt2", 2, dict(tensor_parallel=2, sequence_parallel=True)),
    ("tp2_sp", "llama3", 2, dict(tensor_parallel=2, sequence_parallel=True)),
    ("dp2_pp2", "gpt2", 4, dict(pipeline_parallel=2, pipeline_schedule="GPipe")),
    ("dp2_pp2", "llama3", 4, dict(pipeline_parallel=2, virtual_pipeline_parallel=2)),
    ("tp2_pp2", "gpt2", 4, dict(pipeline_parallel=2, tensor_parallel=2,
                                 pipeline_chunk_layout="0:1,1:2,1:0,0:1")),
    ("tp2_pp2", "llama3", 4, dict(pipeline_parallel=2, tensor_parallel=2)),
    ("tp2_sp_pp2", "gpt2", 4, dict(pipeline_parallel=2, tensor_parallel=2, sequence_parallel=True,
                                    pipeline_model_parallel_layout="Et*2|t||tNL")),
    ("tp2_sp_pp2", "llama3", 4, dict(pipeline_parallel=2, tensor_parallel=2, sequence_parallel=True,
                                      pipeline_chunk_layout="0:1,1:2,1:0,0:1")),
    # Qwen3: each parallelism once (its q / k norms' gradients summed over TP: reductions.py),
    # and a V-shaped schedule
    ("pp2_partition", "qwen3", 2, dict(pipeline_parallel=2, pipeline_layer_partition="1,3")),
    ("pp2_vshape_dualpipev", "qwen3", 2,
     dict(pipeline_parallel=2, pipeline_chunk_layout="0:2,1:1,1:0,0:1",
          pipeline_schedule="DualPipeV")),
    ("dp2", "qwen3", 2, dict()),
    ("tp2", "qwen3", 2, dict(tensor_parallel=2)),
    ("tp2_sp", "qwen3", 2, dict(tensor_parallel=2, sequence_parallel=True)),
    ("dp2_tp2", "qwen3", 4, dict(tensor_parallel=2)),
    ("tp2_pp2", "qwen3", 4, dict(pipeline_parallel=2, tensor_parallel=2)),
    ("tp2_sp_pp2", "qwen3", 4, dict(pipeline_parallel=2, tensor_parallel=2, sequence_parallel=True,
                                     pipeline_model_parallel_layout="Et*2|t||tNL")),
    # tiny Mixtral: each parallelism once, and a zero-bubble schedule (split backward)
    ("pp2_partition", "mixtral", 2, dict(pipeline_parallel=2, pipeline_layer_partition="1,3")),
    ("pp2_interleaved_zb", "mixtral", 2,
     dict(pipeline_parallel=2, virtual_pipeline_parallel=2, pipeline_schedule="InterleavedZeroBubble")),
    ("dp2", "mixtral", 2, dict()),
    ("dp2_idle_experts", "mixtral", 2, dict()),  # CONFIG_CHANGES: 32 experts
    ("tp2", "mixtral", 2, dict(tensor_parallel=2)),
    ("tp2_sp", "mixtral", 2, dict(tensor_parallel=2, sequence_parallel=True)),
    ("dp2_pp2", "mixtral", 4, dict(pipeline_parallel=2, pipeline_schedule="GPipe")),
    ("tp2_pp2", "mixtral", 4, dict(pipeline_parallel=2, tensor_parallel=2)),
    ("tp2_sp_pp2", "mixtral", 4, dict(pipeline_parallel=2, tensor_parallel=2, sequence_parallel=True,
                                       pipeline_model_parallel_layout="Et*2|t||tNL")),
]

# A case's own model shape. 32 experts, top 2, over a dp rank's 64 tokens a step: some expert is
# chosen on one dp rank and not on the other (measured: the dp all-reduce then got different
# tensors on the two ranks and the world crashed, before reductions.py agreed on them first).
CONFIG_CHANGES = {"dp2_idle_experts": dict(num_experts=32, moe_ffn_hidden_size=8)}

BASE = dict(batch_size=2, sequence_length=16, total_batch_size=2 * 16 * 4, learning_rate=LR)


def make_checkpoint(model: str, case: str = ""):
    config = replace(CONFIGS[model], **CONFIG_CHANGES.get(case, {}))
    whole = build_model(config)
    whole.init_weights(seed=1234)
    with torch.no_grad():  # GPT-2's 0.02 init gives near-uniform logits: make the test bite
        g = torch.Generator().manual_seed(99)
        for p in whole.parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.1))
    tensors = {name: p.detach().numpy().copy() for name, p in whole.named_parameters()}
    return SimpleNamespace(config=config, tensors=tensors, model=model)


def make_steps(config, flags: TrainerFlags):
    g = np.random.default_rng(7)
    microbatches = flags.step_tokens // flags.tokens_per_microbatch
    shape = (STEPS, microbatches, flags.batch_size, flags.sequence_length + 1)
    tokens = g.integers(0, config.vocab_size, size=shape)
    return [(torch.from_numpy(t[..., :-1].copy()), torch.from_numpy(t[..., 1:].copy())) for t in tokens]


def run_engine(engine, steps):
    params = [p for part in engine.parts for p in part.parameters()]
    optimizer = torch.optim.SGD(params, lr=LR)
    losses, grads = [], None
    for i, (x, y) in enumerate(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = engine.forward_backward(x, y)
        losses.append(loss)
        if i == 0:
            grads = {name: g.detach().float().cpu().numpy().copy() for name, g in engine.gradients()}
        optimizer.step()
    return losses, grads


_REFERENCE: dict = {}


def reference(model: str, flags: TrainerFlags, checkpoint, steps):
    key = (model, flags.step_tokens, checkpoint.config)
    if key not in _REFERENCE:
        from harness.trainer.models import load_weights

        whole = build_model(checkpoint.config)
        load_weights(whole, checkpoint.tensors)
        engine = SingleDeviceEngine(whole, torch.device("cpu"), torch.float32)
        _REFERENCE[key] = run_engine(engine, steps)
    return _REFERENCE[key]


def run_case(name, model, overrides, world):
    flags = replace(TrainerFlags(**BASE), model=model, **overrides)
    checkpoint = make_checkpoint(model, name)
    steps = make_steps(checkpoint.config, flags)
    ref_losses, ref_grads = reference(model, flags, checkpoint, steps)
    layout = resolve_layout(
        checkpoint.config.n_layer, flags.pipeline_parallel, flags.virtual_pipeline_parallel,
        partition=flags.pipeline_layer_partition, costs=flags.pipeline_layer_costs,
        chunk_layout=flags.pipeline_chunk_layout, megatron_layout=flags.pipeline_model_parallel_layout,
    )
    started = time.perf_counter()
    plan = plan_parallel(flags, checkpoint.config, layout, world.world_size)
    engine = build_parallel_engine(flags, plan, checkpoint, layout, world)
    losses, grads = run_engine(engine, steps)
    elapsed = time.perf_counter() - started
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (losses, grads))
    if dist.get_rank() != 0:
        return None
    reported = [l for l, _ in gathered if l[0] is not None]
    names: list[str] = [n for _, g in gathered for n in g]
    merged = {n: a for _, g in gathered for n, a in g.items()}
    result = {
        "case": name, "model": model, "layout": [list(c) for c in layout.chunks],
        "schedule": engine.plan.schedule, "kind": engine.plan.kind,
        "reporting_ranks": len(reported), "seconds": round(elapsed, 2),
        "names_ok": sorted(names) == sorted(ref_grads) and len(names) == len(set(names)),
        "missing": sorted(set(ref_grads) - set(names)), "extra": sorted(set(names) - set(ref_grads)),
    }
    if len(reported) == 1:
        result["max_loss_diff"] = max(abs(a - b) for a, b in zip(reported[0], ref_losses))
        result["losses"] = reported[0]
    diffs = {
        n: float(np.max(np.abs(merged[n] - ref_grads[n])))
        for n in ref_grads
        if n in merged and merged[n].shape == ref_grads[n].shape
    }
    result["shape_mismatch"] = [n for n in ref_grads if n in merged and merged[n].shape != ref_grads[n].shape]
    result["max_grad_diff"] = max(diffs.values()) if diffs else None
    result["max_grad"] = max(float(np.max(np.abs(a))) for a in ref_grads.values())
    result["worst_grad"] = max(diffs, key=diffs.get) if diffs else None
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default=None, help="comma-separated case names")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    results = []
    for name, model, world_size, overrides in CASES:
        if world_size != args.world or (args.only and name not in args.only.split(",")):
            continue
        flags = replace(TrainerFlags(**BASE), **overrides)
        world = init_distributed(flags)
        try:
            result = run_case(name, model, overrides, world)
        except Exception as error:  # noqa: BLE001 - report and stop: the group may be broken
            traceback.print_exc()
            result = {"case": name, "model": model, "error": f"{type(error).__name__}: {error}"}
            if dist.get_rank() == 0:
                results.append(result)
            break
        if result is not None:
            results.append(result)
            print(json.dumps(result), flush=True)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
