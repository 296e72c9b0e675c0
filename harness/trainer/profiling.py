"""Per-layer forward and backward timings, for the layout suggestion tool.

`--profile_layers FILE` attaches hooks to each local model part and writes, after every step,
one record per layer (and for `embedding` / `lm_head` where the part holds them), in the JSON-lines
format `harness.layout.profile` reads. Times are summed over the step's microbatches. With more
than one process each rank writes its own file (`FILE` with `.rank<r>` before the suffix); the
suggestion tool takes them all.

What is timed: a block from its forward pre-hook to its forward hook, and from its backward
pre-hook (gradient of its output ready) to its backward hook (gradient of its input ready);
`embedding` is the token (and position) lookup forward and the embedding's backward up to the
moment its weight gradient is accumulated; `lm_head` is the final norm, the head projection and
the loss (the engine's `loss_fn`, wrapped by `timed_loss`: its forward, and its backward from
the loss's gradient to the logits' gradient), both directions. The loss is computed outside the
model, but it runs wherever the head runs and over a large vocabulary its softmax is a real part
of that stage's time, so a layout suggestion must see it. On CUDA every hook synchronizes,
which slows the profiled run but makes the times those of the layer.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

from harness.layout.profile import RECORD_FORMAT



def profile_path(path: str | Path, rank: int, world_size: int) -> Path:
    path = Path(path)
    if world_size == 1:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


class LayerProfiler:
    def __init__(self, parts: Iterable[nn.Module], device: torch.device, rank: int) -> None:
        self.rank = rank
        self._sync: Callable[[], None] = (
            torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        )
        self.forward_ms: dict = defaultdict(float)
        self.backward_ms: dict = defaultdict(float)
        self._handles: list = []
        for part in parts:
            self._attach(part)

    def _now(self) -> float:
        self._sync()
        return time.perf_counter()

    # -- hooks -----------------------------------------------------------------------------
    def _time_module(self, module: nn.Module, key) -> None:
        starts: list[float] = []
        backward_starts: list[float] = []

        def forward_pre(_module, _args):
            starts.append(self._now())

        def forward_post(_module, _args, _output):
            self.forward_ms[key] += (self._now() - starts.pop()) * 1e3

        def backward_pre(_module, _grad_output):
            backward_starts.append(self._now())

        def backward_post(_module, _grad_input, _grad_output):
            if backward_starts:
                self.backward_ms[key] += (self._now() - backward_starts.pop()) * 1e3

        self._handles += [
            module.register_forward_pre_hook(forward_pre),
            module.register_forward_hook(forward_post),
            module.register_full_backward_pre_hook(backward_pre),
            module.register_full_backward_hook(backward_post),
        ]

    def _time_embedding(self, part: nn.Module) -> None:
        # The lookup's input is token ids, so module backward hooks cannot see it: its backward
        # runs from the moment its output's gradient is ready to the weight's accumulation.
        embedding = part.wte
        pending: list[float] = []
        starts: list[float] = []

        def forward_pre(_module, _args):
            starts.append(self._now())

        def forward_post(_module, _args, output):
            self.forward_ms["embedding"] += (self._now() - starts.pop()) * 1e3
            if output.requires_grad:
                output.register_hook(lambda grad: pending.append(self._now()))

        def accumulated(_parameter):
            if pending:
                self.backward_ms["embedding"] += (self._now() - pending.pop()) * 1e3

        self._handles += [
            embedding.register_forward_pre_hook(forward_pre),
            embedding.register_forward_hook(forward_post),
            embedding.weight.register_post_accumulate_grad_hook(accumulated),
        ]

    def _time_head(self, part: nn.Module) -> None:
        # From the final norm's input to the part's output, both directions.
        starts: list[float] = []
        backward_starts: list[float] = []

        def norm_pre(_module, args):
            starts.append(self._now())
            hidden = args[0]
            if hidden.requires_grad:
                hidden.register_hook(self._close(backward_starts, "lm_head"))

        def part_post(_module, _args, output):
            if starts:
                self.forward_ms["lm_head"] += (self._now() - starts.pop()) * 1e3
            if output.requires_grad:
                output.register_hook(lambda grad: backward_starts.append(self._now()))

        self._handles += [
            part.ln_f.register_forward_pre_hook(norm_pre),
            part.register_forward_hook(part_post),
        ]

    def timed_loss(self, loss_fn: Callable) -> Callable:
        """`loss_fn` (logits, targets) -> loss, its forward and backward added to `lm_head`."""

        def timed(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            start = self._now()
            loss = loss_fn(logits, targets)
            self.forward_ms["lm_head"] += (self._now() - start) * 1e3
            if loss.requires_grad and logits.requires_grad:
                backward_starts: list[float] = []
                loss.register_hook(lambda grad: backward_starts.append(self._now()))
                logits.register_hook(self._close(backward_starts, "lm_head"))
            return loss

        return timed

    def _close(self, starts: list[float], key: str):
        def hook(_grad):
            if starts:
                self.backward_ms[key] += (self._now() - starts.pop()) * 1e3

        return hook

    def _attach(self, part: nn.Module) -> None:
        for index, block in getattr(part, "h", {}).items():
            self._time_module(block, int(index))
        if getattr(part, "wte", None) is not None:
            self._time_embedding(part)
        if getattr(part, "ln_f", None) is not None:
            self._time_head(part)

    # -- records ---------------------------------------------------------------------------
    def take_records(self, step: int) -> list[dict]:
        """The records of the step just run; the counters start again from zero."""
        keys = sorted(set(self.forward_ms) | set(self.backward_ms), key=_order)
        records = [
            {
                "format": RECORD_FORMAT,
                "step": step,
                "layer": key,
                "forward_ms": self.forward_ms.get(key, 0.0),
                "backward_ms": self.backward_ms.get(key, 0.0),
                "rank": self.rank,
            }
            for key in keys
        ]
        self.forward_ms.clear()
        self.backward_ms.clear()
        return records

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _order(key) -> tuple:
    if key == "embedding":
        return (0, 0)
    if key == "lm_head":
        return (2, 0)
    return (1, key)


def append_records(path: Path, records: list[dict]) -> None:
    with open(path, "a") as stream:
        for record in records:
            stream.write(json.dumps(record) + "\n")
