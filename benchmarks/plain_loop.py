"""A plain PyTorch training loop, the baseline of benchmarks/trainer_throughput.py.

    python benchmarks/plain_loop.py --llmc_filepath F --input_bin F --batch_size B \
        --sequence_length T --total_batch_size N --num_iteration K [--device cuda] \
        [--dtype bfloat16] [--optimizer adamw] [--learning_rate LR]

The same model class as the trainer (harness.trainer.models, built and loaded once, before the
loop) and the same step: microbatches in file order, autocast when bf16, float32 cross-entropy,
loss / microbatches accumulated, AdamW with llm.c's settings (or SGD). Nothing else of the
harness: no engine, no step records, no flags module, no data loader class. Prints one JSON
line per step: {"step", "step_time_ms", "tokens_per_s", "loss"}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

from harness.contracts.llmc import read_checkpoint
from harness.trainer.models import build_model, load_weights


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--llmc_filepath", required=True)
    p.add_argument("--input_bin", required=True)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--sequence_length", type=int, default=64)
    p.add_argument("--total_batch_size", type=int, required=True)
    p.add_argument("--num_iteration", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args()

    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    checkpoint = read_checkpoint(a.llmc_filepath)
    model = build_model(checkpoint.config)
    load_weights(model, checkpoint.tensors)
    model.to(device)
    del checkpoint
    if a.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=a.learning_rate, betas=(0.9, 0.95),
                                eps=1e-8, weight_decay=0.0)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.learning_rate)

    header = np.fromfile(a.input_bin, dtype="<i4", count=256)
    dtype = "<u2" if int(header[0]) == 20240520 else "<u4"
    tokens = np.memmap(a.input_bin, dtype=dtype, mode="r", offset=1024, shape=(int(header[2]),))
    B, T = a.batch_size, a.sequence_length
    micro = a.total_batch_size // (B * T)
    cast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16)
            if a.dtype == "bfloat16" else contextlib.nullcontext())
    pos = 0
    for step in range(1, a.num_iteration + 1):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(micro):
            if pos + B * T + 1 > len(tokens):
                pos = 0
            buf = torch.from_numpy(np.asarray(tokens[pos:pos + B * T + 1], dtype=np.int64))
            pos += B * T
            x = buf[:-1].view(B, T).to(device)
            y = buf[1:].view(B, T).to(device)
            with cast:
                logits = model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(0, 1)) / micro
            loss.backward()
            total += loss.detach()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        print(json.dumps({"step": step, "step_time_ms": elapsed * 1e3,
                          "tokens_per_s": a.total_batch_size / elapsed, "loss": float(total)}),
              flush=True)


if __name__ == "__main__":
    main()
