"""Every module of a bundled model replayed on a subject's own recorded tensors: the error a
module adds on its own inputs, forward and backward (a shadow comparison; judged by
harness.compare.blame, recorded as harness.contracts.replay).

A module-level trace (harness.contracts.trace) holds each module's forward output and the
gradient of that output. The replay runs the bundled model over the traced step's batches with
every module's output replaced by the subject's record of it, straight through (the value is
the subject's, the gradient flows on as the module's own): so each module computes on the
inputs the subject's modules gave it, whether its input is a recorded output itself or what the
model's inline code builds from recorded outputs (a residual sum, the attention core between
c_attn and c_proj). Its output there is compared with the subject's record of it. In the
backward alike: the gradient arriving at a module's output is replaced by the subject's record
of it, so the gradient each output receives is what its consumers' backward computed from the
subject's own gradients; that is compared with the subject's record of the output's gradient.

Run twice, in float64 (the arbiter) and in the subject's dtype: a row's subject error is the
subject's distance from the float64 replay, its floor error the dtype replay's. Where the
subject recorded no tensor of a call, or one of another shape, that module is not replaced (its
consumers see the partner's own output there) and its row says so: no input is guessed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from harness.contracts.replay import ReplayRow

Key = tuple[str, str, int]  # (module, phase, call index)
# How far back from a module's input the graph is walked to find the recorded outputs it was
# built from (inline code between modules: a residual sum, the attention core, a reshape).
_WALK_LIMIT = 4096


@dataclass
class _Pass:
    """One replay pass: what each module computed on the subject's inputs, and which modules
    each recorded output fed."""
    replayed: dict[Key, torch.Tensor] = field(default_factory=dict)
    consumers: dict[str, list[str]] = field(default_factory=dict)
    # module -> (the recorded outputs its inputs were built from, through inline code or not)
    inputs: dict[str, tuple[list[str], bool]] = field(default_factory=dict)


class _Substitution:
    """Hooks on every named submodule: record its output, replace it by the subject's."""

    def __init__(self, model: nn.Module, recorded: Mapping[Key, np.ndarray],
                 flat: Callable[[str], bool] = lambda _name: False) -> None:
        self.recorded = recorded
        self.flat = flat  # modules whose records are a (rows, last dim) view of the output
        self.calls: Counter = Counter()
        self.marks: dict = {}  # a replaced output's grad node -> its module
        self.result = _Pass()
        self.handles = []
        for name, module in model.named_modules():
            if name:
                self.handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
                self.handles.append(module.register_forward_hook(self._hook(name)))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _record(self, name: str, phase: str, shape: tuple) -> tuple[Key, np.ndarray | None]:
        key = (name, phase, self.calls[(name, phase)])
        self.calls[(name, phase)] += 1
        subject = self.recorded.get(key)
        return key, as_shape(subject, shape, self.flat(name))

    def _pre_hook(self, name: str):
        def hook(_module, args):
            producers, inline = self.result.inputs.setdefault(name, ([], False))
            for arg in args:
                if isinstance(arg, torch.Tensor) and arg.grad_fn is not None:
                    inline = inline or arg.grad_fn not in self.marks
                    for producer in self._producers(arg.grad_fn):
                        if producer not in producers:
                            producers.append(producer)
                        users = self.result.consumers.setdefault(producer, [])
                        if name not in users:
                            users.append(name)
            self.result.inputs[name] = (producers, inline)
        return hook

    def _producers(self, node) -> list[str]:
        """The replaced outputs a tensor was built from, through inline code only."""
        found, seen, stack = [], set(), [node]
        while stack and len(seen) < _WALK_LIMIT:
            current = stack.pop()
            if current is None or current in seen:
                continue
            seen.add(current)
            if current in self.marks:
                found.append(self.marks[current])
                continue
            stack.extend(next_node for next_node, _ in current.next_functions)
        return found

    def _hook(self, name: str):
        def hook(_module, _args, output):
            if not isinstance(output, torch.Tensor):
                return None  # a tuple output is compared by no row: left as it is
            key, subject = self._record(name, "forward", tuple(output.shape))
            self.result.replayed[key] = output.detach().to(torch.float64).clone()
            if subject is None or tuple(subject.shape) != tuple(output.shape):
                return None  # not replaced: its consumers see the partner's own output
            value = torch.tensor(subject, dtype=output.dtype)  # a copy: autograd may write into it
            replaced = output + (value - output).detach() if output.requires_grad else value
            if replaced.requires_grad:
                self.marks[replaced.grad_fn] = name
                replaced.register_hook(self._grad_hook(name))
            return replaced
        return hook

    def _grad_hook(self, name: str):
        def hook(grad):
            key, subject = self._record(name, "backward", tuple(grad.shape))
            self.result.replayed[key] = grad.detach().to(torch.float64).clone()
            if subject is None or tuple(subject.shape) != tuple(grad.shape):
                return None
            return torch.tensor(subject, dtype=grad.dtype)  # a copy: gradients accumulate in place
        return hook


def as_shape(subject: np.ndarray | None, shape: tuple, flat: bool) -> np.ndarray | None:
    """A subject's tensor in the partner's shape: as it is, or where the pairing facts say the
    subject writes the module's tensors as a (rows, last dim) view, that view undone."""
    if subject is None or tuple(subject.shape) == tuple(shape) or not flat:
        return subject
    if subject.ndim == 2 and shape and subject.shape[-1] == shape[-1] \
            and subject.size == int(np.prod(shape)):
        return subject.reshape(shape)
    return subject


def replay_pass(build: Callable[[torch.dtype], nn.Module], batches: Sequence[tuple],
                recorded: Mapping[Key, np.ndarray], dtype: torch.dtype,
                flat: Callable[[str], bool] = lambda _name: False) -> _Pass:
    """One pass of the step in `dtype`: `build(dtype)` gives the partner model at the traced
    step's weights, `batches` the step's (inputs, targets) microbatches; each microbatch's mean
    cross-entropy is divided by their count (as InfiniTrain's and the bundled trainer's loops)."""
    model = build(dtype)
    substitution = _Substitution(model, recorded, flat)
    try:
        for inputs, targets in batches:
            logits = model(torch.as_tensor(inputs))
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   torch.as_tensor(targets).reshape(-1)) / len(batches)
            loss.backward()
    finally:
        substitution.close()
    return substitution.result


def replay_rows(order: Sequence[Key], recorded: Mapping[Key, np.ndarray], exact: _Pass,
                dtype_pass: _Pass, flat: Callable[[str], bool] = lambda _name: False,
                ) -> list[ReplayRow]:
    """One row per recorded tensor, in the subject's order: its distance from the float64
    replay, the dtype replay's distance, or the reason it has neither."""
    rows = []
    for position, key in enumerate(order):
        name, phase, index = key
        reference, own = exact.replayed.get(key), dtype_pass.replayed.get(key)
        subject = as_shape(recorded[key], tuple(reference.shape) if reference is not None
                           else (), flat(name))
        shape = tuple(int(d) for d in subject.shape)
        base = {"module": name, "phase": phase, "index": index, "order": position,
                "shape": shape}
        note = None
        if reference is None or own is None:
            note = "the partner made no such call (its model has no module of this name, or " \
                   "fewer calls of it)"
        elif tuple(reference.shape) != shape:
            note = f"the subject's tensor is {shape}, the partner's {tuple(reference.shape)}"
        elif not np.isfinite(subject).all():
            note = (f"the subject's recorded tensor holds {int((~np.isfinite(subject)).sum())} "
                    f"NaN / Inf values (the subject's, not the replay's)")
        if note is not None:
            rows.append(ReplayRow(**base, note=note))
            continue
        exact64 = reference.numpy()
        producers, inline = exact.inputs.get(name, ([], False)) if phase == "forward" \
            else ([], False)
        rows.append(ReplayRow(
            **base, inputs=tuple(producers), inline=inline,
            subject_error=float(np.max(np.abs(subject.astype(np.float64) - exact64))),
            floor_error=float(np.max(np.abs(own.numpy() - exact64))),
            scale=float(np.max(np.abs(exact64))),
            consumers=tuple(sorted(exact.consumers.get(name, ()),
                                   key=lambda c: -c.count("."))) if phase == "backward" else ()))
    return rows


def replay(build: Callable[[torch.dtype], nn.Module], batches: Sequence[tuple],
           recorded: Mapping[Key, np.ndarray], order: Sequence[Key],
           dtype: torch.dtype = torch.float32,
           flat: Callable[[str], bool] = lambda _name: False) -> list[ReplayRow]:
    """The rows of one traced step: the float64 pass and the subject's dtype pass. `flat(name)`:
    the subject writes that module's tensors as a (rows, last dim) view (pairing facts)."""
    exact = replay_pass(build, batches, recorded, torch.float64, flat)
    own = replay_pass(build, batches, recorded, dtype, flat)
    return replay_rows(order, recorded, exact, own, flat)


# ----------------------------------------------------------------------------- the command


def subject_tensors(folder, program: str | None) -> tuple[list[Key], dict[Key, np.ndarray],
                                                           list[str]]:
    """A subject's one-rank trace (its --precision_check folder) under the bundled model's
    names: (execution order, tensors, what was left out and why). `program`: a foreign
    program's pairing facts (harness.contracts.trace); None: the bundled trainer's own names.
    Only each call's first output is replayed (tensor[0])."""
    from harness.contracts.trace import find_trace_root, pairing_of, read_trace, trace_ranks

    root = find_trace_root(folder)
    ranks = trace_ranks(root)
    if ranks != [0]:
        raise ValueError(f"{root}: ranks {ranks}: the replay takes a one-device trace "
                         f"(rank 0 only)")
    pairing = pairing_of(program) if program else None
    order, tensors, left_out = [], {}, []
    for entry in read_trace(root, 0).entries:
        if entry.tensor != 0:
            continue
        name = pairing.bundled_name(entry.module) if pairing is not None else entry.module
        if name is None:
            left_out.append(f"{entry.label}: {pairing.why_unpaired(entry.module, 'subject')}")
            continue
        key = (name, entry.phase, entry.index)
        order.append(key)
        tensors[key] = np.load(entry.file)
    return order, tensors, left_out


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.trainer replay --trace DIR --checkpoint F --input_bin F ... --out
    replay.jsonl`: the traced step 1 of a one-device run replayed module by module."""
    import argparse

    from harness.contracts.llmc import read_checkpoint, read_tokens
    from harness.contracts.replay import write_replay
    from harness.trainer.data import StepBatches
    from harness.trainer.models import build_model, load_weights

    parser = argparse.ArgumentParser(prog="python -m harness.trainer replay",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True, help="the subject's --precision_check folder")
    parser.add_argument("--program", default=None,
                        help="the subject's InfiniTrain program (its module names' pairing "
                             "facts); left out: the bundled trainer's own names")
    parser.add_argument("--checkpoint", required=True, help="the llm.c model file of step 1")
    parser.add_argument("--input_bin", required=True, help="the token file")
    parser.add_argument("--batch_size", type=int, required=True)
    parser.add_argument("--sequence_length", type=int, required=True)
    parser.add_argument("--total_batch_size", type=int, required=True)
    parser.add_argument("--dtype", default="float32", choices=("float32",),
                        help="the subject's dtype (bfloat16 floors are not measured)")
    parser.add_argument("--out", required=True, help="where the rows go (JSON lines)")
    args = parser.parse_args(argv)

    checkpoint = read_checkpoint(args.checkpoint)
    span = args.batch_size * args.sequence_length
    if args.total_batch_size % span:
        parser.error(f"--total_batch_size {args.total_batch_size} is not a multiple of "
                     f"batch_size * sequence_length = {span}")
    tokens = read_tokens(args.input_bin, vocab_size=checkpoint.config.vocab_size)
    inputs, targets = StepBatches(tokens, args.batch_size, args.sequence_length,
                                  args.total_batch_size // span).next_step()
    batches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(inputs, targets)]

    def build(dtype: torch.dtype) -> nn.Module:
        model = build_model(checkpoint.config)
        load_weights(model, checkpoint.tensors)
        return model.to(dtype)

    torch.manual_seed(0)
    order, tensors, left_out = subject_tensors(args.trace, args.program)
    from harness.contracts.trace import pairing_of
    pairing = pairing_of(args.program) if args.program else None
    rows = replay(build, batches, tensors, order, torch.float32,
                  pairing.is_flattened if pairing is not None else (lambda _name: False))
    write_replay(args.out, rows)
    for line in left_out:
        print(f"not replayed: {line}")
    print(f"{len(rows)} rows: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
