"""`--precision_check "level=1,save_tensors=true,path=DIR"`: InfiniTrain's module-level trace,
written by the bundled trainer in InfiniTrain's own format.

Why: when a case's numbers part from its partner's (the single-device reference, or InfiniTrain
against the PyTorch baseline), the harness reruns both sides with a trace and names the first
module whose output or output gradient differs. One reader (harness.contracts.trace) serves
both sides only if the bundled trainer writes exactly what InfiniTrain master (b24d92f) writes:

    DIR/<YYYYMMDD_HHMMSS>/precision_check_rank_<R>.log
    DIR/<YYYYMMDD_HHMMSS>/rank_<R>/<name>[_<idx>]_<forward|backward>.npy   (float32)

What is mirrored, with InfiniTrain's source (infini_train/src/...):
- the option string `key=value,...` (utils/precision_check_config.cc:17-48); level 0 is off,
  level 1 hooks modules; level 2 (autograd functions) is refused here;
- one timestamp folder per run (precision_check_config.cc:58-73). InfiniTrain's ranks are
  threads of one process; ours are processes, so rank 0 names the folder and broadcasts it;
- every named submodule's forward output (module.cc:219) and, in the backward, the gradient
  with respect to that output, taken when the backward of the node that produced the output
  has run (module.cc:222-262: a post hook on the output's grad_fn, `GradOutputs`). Hooking
  the node, not `register_full_backward_hook`, keeps InfiniTrain's order: modules sharing one
  output node (`mlp.c_proj` and `mlp`) fire in the order their forwards ended, innermost first,
  where torch's full backward hook fires a container only after all its children;
- `idx` = how often (name, phase) was written before in this iteration; the counters restart
  every iteration (`reset`, gpt2/main.cc:393) so the files of the last iteration remain; the
  log is opened once and keeps every iteration's lines (precision_checker.cc:166-190);
- the log line (precision_checker.cc:352-371): `[GAS-0] [L-0] <name>[_idx]_<phase>
  tensor[i]: dtype=... shape=(...) min=... max=... mean=... [6 values, ...] [NaN:n Inf:m]`,
  numbers as C++'s default ostream prints a float (`%g`, 6 significant digits). InfiniTrain
  never sets the GAS / layer context, so it is always `[GAS-0] [L-0]`.

Names are the part's `named_modules()` names (`h.3.attn.c_attn`: the global layer index on every
pipeline stage; no `transformer.` prefix and no root or container types: the pairing facts of
harness.contracts.trace map them onto InfiniTrain's). Under tensor parallelism a DTensor is
written as this rank's local tensor, as InfiniTrain writes a column-parallel output's slice.
Under torch's pipelining (built with scale_grads=True: each microbatch's backward starts from
its own mean loss, the parameters' gradients divided by the microbatch count afterwards) the
recorded gradients are divided by that count, so they are the gradient of the step's loss, as
the single-device engine's `loss / microbatches` and InfiniTrain's pipeline
(pipeline_schedule.cc:256) give.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn

from harness.contracts.flags import FlagError

FLAG = "--precision_check"
LEVEL_OFF, LEVEL_MODULE, LEVEL_FUNCTION = 0, 1, 2
FORMATS = ("simple", "md5")
DEFAULT_PATH = "./log_precision_check"  # precision_check_config.h's default output_path
_PRINTED_VALUES = 6  # precision_checker.cc:361: the first six values of each tensor
_FLOAT_MAX = float(np.finfo(np.float32).max)  # ComputeStats' start values, kept for no finite


@dataclass(frozen=True)
class PrecisionCheckConfig:
    """The parsed option string (InfiniTrain's PrecisionCheckConfig)."""

    level: int = LEVEL_OFF
    path: str = DEFAULT_PATH
    format: str = "simple"
    save_tensors: bool = False
    md5_tolerance: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.level != LEVEL_OFF


def _bool_value(key: str, text: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise FlagError(f"{FLAG}={text!r}: {key}={value!r}; expected true, false, 1 or 0")


def parse_precision_check(text: str | None) -> PrecisionCheckConfig:
    """The option string's config; FlagError naming the flag, the item and what was expected.
    An empty or missing string is level 0 (off), as InfiniTrain's Parse."""
    if not text:
        return PrecisionCheckConfig()
    values: dict = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise FlagError(f"{FLAG}={text!r}: item {item!r} is not key=value; expected "
                            "level=N,path=DIR,save_tensors=true|false,format=simple|md5")
        if key == "level":
            if value not in ("0", "1", "2"):
                raise FlagError(f"{FLAG}={text!r}: level={value!r}; expected 0 (off) or 1 "
                                "(modules)")
            if int(value) == LEVEL_FUNCTION:
                raise FlagError(f"{FLAG}={text!r}: level=2 (autograd functions) is not "
                                "supported by the bundled trainer; expected level 0 or 1")
            values["level"] = int(value)
        elif key == "path":
            if not value:
                raise FlagError(f"{FLAG}={text!r}: path is empty; expected a folder")
            values["path"] = value
        elif key == "format":
            if value not in FORMATS:
                raise FlagError(f"{FLAG}={text!r}: format={value!r}; expected one of "
                                f"{', '.join(FORMATS)}")
            values["format"] = value
        elif key == "save_tensors":
            values["save_tensors"] = _bool_value(key, text, value)
        elif key == "md5_tolerance":
            try:
                tolerance = float(value)
            except ValueError:
                tolerance = -1.0
            if not tolerance >= 0:
                raise FlagError(f"{FLAG}={text!r}: md5_tolerance={value!r}; expected a "
                                "number >= 0")
            values["md5_tolerance"] = tolerance
        else:
            raise FlagError(f"{FLAG}={text!r}: unknown key {key!r}; expected level, path, "
                            "format, save_tensors or md5_tolerance")
    return PrecisionCheckConfig(**values)


def timestamp_folder(path: str) -> Path:
    """`path/<YYYYMMDD_HHMMSS>` of now (local time, as InfiniTrain's strftime), created."""
    folder = Path(path) / time.strftime("%Y%m%d_%H%M%S", time.localtime())
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shared_folder(path: str, rank: int, distributed: bool) -> Path:
    """One timestamp folder for every rank of the run: rank 0 names it, the others receive it
    over the default process group (two ranks reading the clock could straddle a second)."""
    if not distributed:
        return timestamp_folder(path)
    import torch.distributed as dist

    box = [str(timestamp_folder(path)) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    folder = Path(box[0])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _g(value: float) -> str:
    """A float as C++'s default `ostream << float` prints it: %g, 6 significant digits."""
    if math.isnan(value):
        return "nan" if math.copysign(1.0, value) > 0 else "-nan"
    return f"{value:g}"


def format_line(logged: str, index: int, data: np.ndarray, dtype: str, config:
                PrecisionCheckConfig) -> str:
    """One log line for tensor `index` of `logged` (`<name>[_idx]_<phase>`), float32 `data`."""
    shape = "(" + ",".join(str(d) for d in data.shape) + ")"
    head = f"[GAS-0] [L-0] {logged} tensor[{index}]: dtype={dtype} shape={shape}"
    flat = data.reshape(-1)
    if config.format == "md5":
        if config.md5_tolerance > 0:
            # precision_checker.cc:245-252: std::round (half away from zero) in double
            scaled = flat.astype(np.float64) / config.md5_tolerance
            rounded = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)
            flat = (rounded * config.md5_tolerance).astype(np.float32)
        return f"{head} md5={hashlib.md5(np.ascontiguousarray(flat).tobytes()).hexdigest()}"
    nan = int(np.isnan(flat).sum())
    inf = int(np.isinf(flat).sum())
    finite = flat[np.isfinite(flat)]
    if flat.size == 0:
        low = high = mean = 0.0
    elif finite.size == 0:
        low, high, mean = _FLOAT_MAX, -_FLOAT_MAX, 0.0
    else:
        low, high = float(finite.min()), float(finite.max())
        mean = float(np.float32(finite.astype(np.float64).sum() / finite.size))
    values = ", ".join(_g(float(v)) for v in flat[:_PRINTED_VALUES])
    if flat.size > _PRINTED_VALUES:
        values += ", ..."
    error = " <- ERROR" if nan or inf else ""
    return (f"{head} min={_g(low)} max={_g(high)} mean={_g(mean)} [{values}] "
            f"[NaN:{nan} Inf:{inf}]{error}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class PrecisionChecker:
    """Hooks on every named submodule of this rank's model parts; writes the trace."""

    def __init__(self, config: PrecisionCheckConfig, folder: Path, rank: int,
                 parts: Iterable[nn.Module], backward_scale: float = 1.0) -> None:
        self.config = config
        self.folder = folder
        self.rank = rank
        self.backward_scale = backward_scale
        self.tensors = folder / f"rank_{rank}"
        self.log_path = folder / f"precision_check_rank_{rank}.log"
        self.counters: dict[str, int] = {}
        self._log = None
        self._quiet = False  # inside torch's pipeline metadata inference: nothing is recorded
        self._dtensor = _dtensor_type()
        self.handles = []
        for part in parts:
            for name, module in part.named_modules():
                if name:  # the root is the part itself: InfiniTrain names only submodules
                    self.handles.append(module.register_forward_hook(self._forward_hook(name)))

    # -- the iteration -------------------------------------------------------------------------
    def reset(self) -> None:
        """At the start of every iteration: the counters restart, so this iteration's files
        overwrite the last one's."""
        self.counters.clear()

    def skip_metadata_inference(self, stages: Iterable) -> None:
        """torch's PipelineStage (2.13) runs the first microbatch through each stage once, and
        back, before the schedule's first real forward, to learn the shapes it sends
        (`_prepare_forward_infra` / `_prepare_backward_infra`, pipelining/stage.py:2128-2227).
        That pass is not training: recording it would shift every idx of the first step by
        one. So the checker is quiet while those run (the methods wrapped on these stages)."""
        for stage in stages:
            stage._prepare_forward_infra = self._quietly(stage._prepare_forward_infra)
            stage._prepare_backward_infra = self._quietly(stage._prepare_backward_infra)

    def _quietly(self, function):
        def run(*args, **kwargs):
            self._quiet = True
            try:
                return function(*args, **kwargs)
            finally:
                self._quiet = False
        return run

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- the hooks ------------------------------------------------------------------------------
    def _forward_hook(self, name: str):
        def hook(_module, _args, output):
            if self._quiet:
                return
            outputs = _tensors(output)
            # torch's pipelining infers shapes on meta tensors: nothing was computed, nothing
            # is written, no call counted
            if any(t.is_meta for t in outputs):
                return
            self.check(name, "forward", outputs)
            for out in outputs:
                # module.cc:227: the node whose first output the tensor is (a later output of
                # a multi-output node is the node of another module in InfiniTrain too)
                if out.grad_fn is not None and out.output_nr == 0:
                    out.grad_fn.register_hook(self._backward_hook(name))
                    break  # one hook per module call: all its node's output gradients
        return hook

    def _backward_hook(self, name: str):
        def hook(_grad_inputs, grad_outputs):
            if self._quiet:
                return
            grads = [g for g in grad_outputs if g is not None]
            if self.backward_scale != 1.0:
                grads = [g * self.backward_scale for g in grads]
            self.check(name, "backward", grads)
        return hook

    def _local(self, tensor: torch.Tensor) -> torch.Tensor:
        """A DTensor's local shard (this rank's slice, as InfiniTrain writes it)."""
        if self._dtensor is not None and isinstance(tensor, self._dtensor):
            return tensor.to_local()
        return tensor

    # -- the writing ----------------------------------------------------------------------------
    def check(self, name: str, phase: str, tensors: list[torch.Tensor]) -> None:
        """Write each tensor of one module call (CheckTensors): its .npy and its log line."""
        for i, tensor in enumerate(tensors):
            tensor = self._local(tensor).detach()
            key = f"{name}_{phase}"
            idx = self.counters.get(key, 0)
            self.counters[key] = idx + 1
            logged = f"{name}_{idx}_{phase}" if idx > 0 else key
            data = tensor.to(device="cpu", dtype=torch.float32).contiguous().numpy()
            if self.config.save_tensors:
                self.tensors.mkdir(parents=True, exist_ok=True)
                np.save(self.tensors / f"{logged}.npy", data)
            self._stream().write(format_line(logged, i, data, _dtype_name(tensor.dtype),
                                             self.config) + "\n")

    def _stream(self):
        """The log, opened (truncated) at the first tensor, as InfiniTrain's GetLogStream."""
        if self._log is None:
            self._log = open(self.log_path, "w", buffering=1)
            print(f"[Rank {self.rank}] Precision check output: {self.log_path}", flush=True)
        return self._log


def _tensors(output) -> list[torch.Tensor]:
    """A module's output tensors, in order (a tuple's or list's tensors; others skipped)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    return []


def _dtensor_type():
    """DTensor where a process group exists (only then can a module output be one); None
    otherwise, so a single-device run does not import torch.distributed.tensor."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


def start_precision_check(text: str | None, parts: Iterable[nn.Module], rank: int,
                          backward_scale: float = 1.0,
                          stages: Iterable = ()) -> PrecisionChecker | None:
    """The checker for `--precision_check`'s value on this rank, or None where it is off;
    `stages`: this rank's PipelineStages, if any. With a process group every rank must call
    this (the folder's name is broadcast)."""
    config = parse_precision_check(text)
    if not config.enabled:
        return None
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    folder = shared_folder(config.path, rank, distributed)
    if rank == 0:
        print(f"[PrecisionCheck] Output: {folder}", flush=True)
    checker = PrecisionChecker(config, folder, rank, parts, backward_scale)
    checker.skip_metadata_inference(stages)
    return checker
