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

Each layer record names the pipeline `schedule` it was timed under (null on one device). Under a
zero-bubble schedule (ZBVZeroBubble, InterleavedZeroBubble, DualPipeV) torch splits each
backward into an input pass and a weight pass, and the weight pass computes the weights'
gradients from saved intermediate nodes, past the module hooks: a layer's `backward_ms` is then
its input pass only (measured: about half). The suggestion tool refuses such a profile's times
(its memory figures stand).

Memory, for the memory-aware layout search (docs/pipeline_layout_guide.md). Each layer record
also carries `microbatches` (forward calls in the step), `activation_bytes` (per microbatch: the
bytes of the tensors autograd saved for the backward while that layer's forward ran, each storage
counted once, parameters not counted: what the layer keeps alive until its backward) and
`parameter_bytes`, plus `chunk` / `chunks` (the part's local chunk index and the rank's chunk
count). They are read through `torch.autograd.graph.saved_tensors_hooks`, on CPU and CUDA alike:
the exact tensors that stay in flight, at the cost of one Python call per saved tensor (the
profiler's memory events would add a record per allocation and slow small ops more than big
ones, skewing the very layer times recorded beside them). GPT-2's head tied to `wte` on one part
is counted as a head of its own, the copy a separate last stage holds.

After the layer records, one `harness.stage_memory/1` record per step and rank gives what was
measured on the whole stage: `peak_activation_bytes` (the most saved-tensor bytes alive at once
during the step, across all microbatches in flight; `held_activation_bytes` those still held
after it), `parameter_bytes`, `gradient_bytes` and
`optimizer_bytes` (the optimizer's state tensors, counted after its step), and on CUDA
`allocator_peak_bytes` (torch.cuda.max_memory_allocated over the step, reset after each).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

from harness.layout.profile import MEMORY_FORMAT, RECORD_FORMAT


def profile_path(path: str | Path, rank: int, world_size: int) -> Path:
    path = Path(path)
    if world_size == 1:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


class _Saved:
    """A tensor autograd saved for the backward; when autograd drops it, its bytes are freed."""

    __slots__ = ("tensor", "_release")

    def __init__(self, tensor: torch.Tensor, release: Callable[[], None]) -> None:
        self.tensor, self._release = tensor, release

    def __del__(self) -> None:
        self._release()


class SavedTensorMeter:
    """Bytes of saved-for-backward tensors: alive now, the step's peak, and new ones per key."""

    def __init__(self, parameters: Iterable[nn.Parameter]) -> None:
        self._parameter_storages = {p.untyped_storage().data_ptr() for p in parameters}
        self._refs: dict[int, int] = {}  # storage pointer -> saved tensors holding it
        self._sizes: dict[int, int] = {}
        self.live = 0
        self.peak = 0
        self.key = None  # the layer whose forward is running
        self.new_bytes: dict = defaultdict(int)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._depth = 0

    def enter(self) -> None:
        if self._depth == 0:
            self._hooks.__enter__()
        self._depth += 1

    def exit(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._hooks.__exit__(None, None, None)

    def _pack(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer in self._parameter_storages or storage.nbytes() == 0:
            return tensor
        if pointer not in self._refs:
            self._refs[pointer] = 0
            self._sizes[pointer] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            if self.key is not None:
                self.new_bytes[self.key] += storage.nbytes()
        self._refs[pointer] += 1
        # Detached: the wrapper must not hold the tensor's grad_fn, which holds the wrapper (a
        # saved output would close a cycle that outlives the backward).
        return _Saved(tensor.detach(), lambda: self._release(pointer))

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _release(self, pointer: int) -> None:
        self._refs[pointer] -= 1
        if self._refs[pointer] == 0:
            del self._refs[pointer]
            self.live -= self._sizes.pop(pointer)

    def take_peak(self) -> int:
        peak, self.peak = self.peak, self.live
        return peak


class LayerProfiler:
    def __init__(self, parts: Iterable[nn.Module], device: torch.device, rank: int,
                 optimizer: torch.optim.Optimizer | None = None, schedule: str | None = None) -> None:
        self.rank = rank
        self.schedule = schedule  # the pipeline schedule's name; None on one device
        self.device = device
        self.parts = list(parts)
        self.optimizer = optimizer
        self._sync: Callable[[], None] = (
            torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        )
        self.forward_ms: dict = defaultdict(float)
        self.backward_ms: dict = defaultdict(float)
        self.forward_calls: dict = defaultdict(int)
        self.parameter_bytes: dict = {}
        self.chunk_of: dict = {}
        self.meter = SavedTensorMeter(p for part in self.parts for p in part.parameters())
        self._handles: list = []
        for index, part in enumerate(self.parts):
            self._attach(part, index)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def _now(self) -> float:
        self._sync()
        return time.perf_counter()

    # -- hooks -----------------------------------------------------------------------------
    def _time_module(self, module: nn.Module, key) -> None:
        starts: list[float] = []
        backward_starts: list[float] = []

        def forward_pre(_module, _args):
            self.meter.key = key
            self.forward_calls[key] += 1
            starts.append(self._now())

        def forward_post(_module, _args, _output):
            self.forward_ms[key] += (self._now() - starts.pop()) * 1e3
            self.meter.key = None

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
            self.meter.key = "embedding"  # until the first block: the lookups and their sum
            self.forward_calls["embedding"] += 1
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
            self.meter.key = "lm_head"
            self.forward_calls["lm_head"] += 1
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
            self.meter.enter()
            self.meter.key = "lm_head"
            start = self._now()
            try:
                loss = loss_fn(logits, targets)
            finally:
                self.meter.key = None
                self.meter.exit()
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

    def _attach(self, part: nn.Module, chunk: int) -> None:
        for index, block in part.h.items():
            self._time_module(block, int(index))
        if part.has_embedding:
            self._time_embedding(part)
        if part.has_final_norm:
            self._time_head(part)
        keys = [int(i) for i in part.h] + ["embedding"] * part.has_embedding + ["lm_head"] * part.has_final_norm
        self.chunk_of.update((key, chunk) for key in keys)
        self.parameter_bytes.update(_parameter_bytes(part))

        def enter(_module, _args):
            self.meter.enter()

        def leave(_module, _args, output):
            self.meter.key = None
            self.meter.exit()
            # The blocks' backward hooks hand their outputs on as views, and torch's zero-bubble
            # backward detaches a stage's output in place, which a view refuses: give it a copy.
            if isinstance(output, torch.Tensor) and output._is_view():
                return output.clone()
            return None

        self._handles += [part.register_forward_pre_hook(enter), part.register_forward_hook(leave)]

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
                "microbatches": self.forward_calls.get(key, 0),
                "activation_bytes": self.meter.new_bytes.get(key, 0) / max(1, self.forward_calls.get(key, 0)),
                "parameter_bytes": self.parameter_bytes.get(key, 0),
                "chunk": self.chunk_of.get(key, 0),
                "chunks": len(self.parts),
                "schedule": self.schedule,
            }
            for key in keys
        ]
        records.append(self._stage_record(step))
        self.forward_ms.clear()
        self.backward_ms.clear()
        self.forward_calls.clear()
        self.meter.new_bytes.clear()
        return records

    def _stage_record(self, step: int) -> dict:
        parameters = [p for part in self.parts for p in part.parameters()]
        state = self.optimizer.state.values() if self.optimizer is not None else []
        allocator = None
        if self.device.type == "cuda":
            allocator = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        return {
            "format": MEMORY_FORMAT,
            "step": step,
            "rank": self.rank,
            "device": self.device.type,
            "peak_activation_bytes": self.meter.take_peak(),
            # Saved tensors still held after the step (none, unless a graph outlives its backward).
            "held_activation_bytes": self.meter.live,
            "parameter_bytes": sum(_nbytes(p) for p in parameters),
            "gradient_bytes": sum(_nbytes(p.grad) for p in parameters if p.grad is not None),
            "optimizer_bytes": (None if self.optimizer is None else
                                sum(_nbytes(v) for entry in state for v in entry.values()
                                    if isinstance(v, torch.Tensor))),
            "allocator_peak_bytes": allocator,
        }

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _parameter_bytes(part: nn.Module) -> dict:
    """Parameter bytes per layer key, from the parameters' names (h.<i>., ln_f., lm_head., the
    rest the embedding). A head tied to wte on this part counts wte: a last stage of its own
    holds that copy."""
    sizes: dict = defaultdict(int)
    head_weight = False
    for name, p in part.named_parameters():
        first = name.split(".")[0]
        if first == "h":
            sizes[int(name.split(".")[1])] += _nbytes(p)
        elif first in ("ln_f", "lm_head"):
            sizes["lm_head"] += _nbytes(p)
            head_weight |= first == "lm_head"
        else:
            sizes["embedding"] += _nbytes(p)
    if part.has_lm_head and not head_weight and part.has_embedding:
        sizes["lm_head"] += _nbytes(part.wte.weight)
    return dict(sizes)


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
