"""Learning-rate schedules: the lr of every optimizer step, as InfiniTrain's feat/lr_scheduler
defines it (same five styles, same flag names), written again from its definition so the PyTorch
baseline can judge the branch's implementation rather than repeat it. No torch here.

The definition, with its source (feat/lr_scheduler@a7949ac; W = --lr_warmup_iters, D =
--lr_decay_iters or --num_iteration when 0, D' = D - W, max = --learning_rate, min = --min_lr,
k = optimizer steps already taken, j = k - W):

    none      no scheduler: every step at --learning_rate         lr_scheduler.cc:16-18
    warmup    k < W: init + (max - init) * k / W                  lr_scheduler.cc:75-83
    constant  max; min and D are validated but not used           lr_scheduler.cc:37-38
    linear    max * (1 + (min/max - 1) * min(j, D') / D')         lr_scheduler.cc:39-41
    cosine    j > D': min; else min + (max - min)(cos(pi j/D')+1)/2  lr_scheduler.cc:42-55
    inverse-square-root  g = j + W; g > D: min;
              else max(min, max * sqrt(max(W, 1)) / sqrt(max(g, 1)))  lr_scheduler.cc:56-67

Step k's lr is set before step k+1 trains: the scheduler applies lr(0) when it is made
(lr_scheduler.h:30-34 InitialStep) and steps once after every optimizer step
(example/gpt2/main.cc:473-476, example/llama3/main.cc:451-453), and the step line prints the
lr read before the update (example/gpt2/main.cc:428, 507). So the step numbered n (from 1)
trains at, and prints, lr(n - 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.contracts.flags import FlagError
from harness.contracts.semantics import LR_DECAY_STYLES as STYLES


@dataclass(frozen=True)
class LRSchedule:
    style: str
    max_lr: float  # --learning_rate: the peak
    min_lr: float = 0.0
    warmup_iters: int = 0
    warmup_init: float = 0.0
    decay_iters: int = 1  # already resolved: --lr_decay_iters, or --num_iteration when 0

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise FlagError(f"--lr_decay_style={self.style}: expected one of {', '.join(STYLES)}")
        if self.style == "none":  # no scheduler is made, so nothing is checked (cc:16-18)
            return
        # The branch's CHECKs (lr_scheduler.cc:22-30), each as the flag it is about.
        checks = (
            (self.max_lr > 0, f"--learning_rate={self.max_lr}", "> 0"),
            (self.warmup_init >= 0, f"--lr_warmup_init={self.warmup_init}", ">= 0"),
            (self.min_lr >= 0, f"--min_lr={self.min_lr}", ">= 0"),
            (self.max_lr >= self.min_lr, f"--min_lr={self.min_lr}",
             f"<= --learning_rate={self.max_lr}"),
            (self.warmup_init <= self.max_lr, f"--lr_warmup_init={self.warmup_init}",
             f"<= --learning_rate={self.max_lr}"),
            (self.warmup_iters >= 0, f"--lr_warmup_iters={self.warmup_iters}", ">= 0"),
            (self.decay_iters > 0, f"--lr_decay_iters={self.decay_iters}", "> 0"),
            (self.warmup_iters < self.decay_iters, f"--lr_warmup_iters={self.warmup_iters}",
             f"< the decay iterations {self.decay_iters} (--lr_decay_iters, or "
             f"--num_iteration when 0)"),
        )
        for ok, flag, wanted in checks:
            if not ok:
                raise FlagError(f"{flag}: expected {wanted} (--lr_decay_style={self.style}; "
                                f"InfiniTrain's feat/lr_scheduler CHECKs the same, "
                                f"lr_scheduler.cc:22-30)")

    @classmethod
    def from_flags(cls, style: str, learning_rate: float, min_lr: float, warmup_iters: int,
                   warmup_init: float, decay_iters: int, num_iteration: int) -> "LRSchedule":
        """The schedule the flags ask for: a `--lr_decay_iters` of 0 spans the whole run
        (feat/lr_scheduler@a7949ac:example/gpt2/main.cc:328)."""
        return cls(style, learning_rate, min_lr, warmup_iters, warmup_init,
                   decay_iters if decay_iters > 0 else num_iteration)

    def lr(self, k: int) -> float:
        """The lr after `k` optimizer steps (the lr step k + 1 trains at)."""
        if k < 0:
            raise ValueError(f"step {k}: expected >= 0 optimizer steps taken")
        if self.style == "none":
            return self.max_lr
        warmup = self.warmup_iters
        if k < warmup:
            return self.warmup_init + (self.max_lr - self.warmup_init) * k / warmup
        j = k - warmup
        span = self.decay_iters - warmup  # D' >= 1: checked above
        if self.style == "constant":
            return self.max_lr
        if self.style == "linear":
            end = self.min_lr / self.max_lr
            return self.max_lr * (1.0 + (end - 1.0) * min(j, span) / span)
        if self.style == "cosine":
            if j > span:
                return self.min_lr
            return self.min_lr + 0.5 * (math.cos(math.pi * j / span) + 1.0) * (
                self.max_lr - self.min_lr)
        # inverse-square-root
        global_step = j + warmup
        if global_step > self.decay_iters:
            return self.min_lr
        return max(self.min_lr,
                   self.max_lr * math.sqrt(max(warmup, 1)) / math.sqrt(max(global_step, 1)))

    def printed(self, step: int) -> float:
        """The lr the step numbered `step` (from 1) trains at and prints."""
        return self.lr(step - 1)
