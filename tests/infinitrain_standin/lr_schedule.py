"""The learning-rate schedule of InfiniTrain feat/lr_scheduler (a7949ac), as gpt2 / llama3 use it:
``CreateLRScheduler`` (feat/lr_scheduler:infini_train/src/lr_scheduler.cc:14-85) stepped once per
training step after the optimizer step (feat/lr_scheduler:example/gpt2/main.cc:474-476, :487-489),
the step line printing the lr read before that step (feat/lr_scheduler:example/gpt2/main.cc:428).

``schedule(...)`` returns the lr in force at each step 0..n-1, in float32 and with the branch's
own state machine (LambdaLR closed form, LinearLR's chained multiplicative form, SequentialLR's
warmup -> main hand-over with ``Step(0)`` at the milestone), so the float rounding is the
branch's (std::cos / std::sqrt of float are matched to the last ulp only up to libm). ``check``
returns the first CHECK of CreateLRScheduler that fails (or None).

Planted schedule bugs (``plant=``, from ``STANDIN_PLANT_LR`` in trainer.py), each a bug every
configuration shares (the self-check cannot see it; the baseline check's lr comparison can):

- ``warmup_short``: SequentialLR hands over to the main schedule one step early (milestone
  W - 1 instead of the ``{warmup_iters}`` of lr_scheduler.cc:81-83), the ramp still ``k / W``: the lr
  of step W (1-based) is already max_lr instead of ``init + (max - init)(W - 1)/W``, and every
  later step is the main schedule one step ahead. W = 1 leaves no warmup at all (step 1 at
  max_lr); W = 0 plants nothing.
- ``cosine_floor``: the cosine decays to 2 x min_lr instead of min_lr (lr_scheduler.cc:41-56's
  ``min_lr`` doubled in the formula and after the decay): the last steps stay above min_lr.
  Only the cosine style, and only with min_lr > 0.
"""

from __future__ import annotations

import math

import numpy as np

f32 = np.float32
STYLES = ("none", "constant", "linear", "cosine", "inverse-square-root")  # gpt2/main.cc:119-120
SRC = "lr_scheduler.cc"
PLANTS = ("warmup_short", "cosine_floor")


def decay_iters(flag_decay_iters: int, num_iteration: int) -> int:
    """feat/lr_scheduler:example/gpt2/main.cc:328: 0 (or less) means num_iteration."""
    return flag_decay_iters if flag_decay_iters > 0 else num_iteration


def check(style, max_lr, min_lr, warmup_iters, warmup_init, decay) -> tuple | None:
    """CreateLRScheduler's CHECKs (feat/lr_scheduler:infini_train/src/lr_scheduler.cc:22-29), in order:
    (expr, a, b, message, where) of the first that fails, or None. ``none`` checks nothing (:16-18)."""
    if style == "none":
        return None
    mx, mn, wi = f32(max_lr), f32(min_lr), f32(warmup_init)
    rows = [
        (mx > 0, "max_lr > 0.0f", mx, 0, "CreateLRScheduler: max_lr must be > 0.", 22),
        (wi >= 0, "config.lr_warmup_init >= 0.0f", wi, 0, "CreateLRScheduler: lr_warmup_init must be >= 0.", 23),
        (mn >= 0, "config.min_lr >= 0.0f", mn, 0, "CreateLRScheduler: min_lr must be >= 0.", 24),
        (mx >= mn, "max_lr >= config.min_lr", mx, mn, "CreateLRScheduler: max_lr must be >= min_lr.", 25),
        (wi <= mx, "config.lr_warmup_init <= max_lr", wi, mx,
         "CreateLRScheduler: lr_warmup_init must be <= max_lr.", 26),
        (warmup_iters >= 0, "config.lr_warmup_iters >= 0", warmup_iters, 0,
         "CreateLRScheduler: lr_warmup_iters must be >= 0.", 27),
        (decay > 0, "config.lr_decay_iters > 0", decay, 0, "CreateLRScheduler: lr_decay_iters must be > 0.", 28),
        (warmup_iters < decay, "config.lr_warmup_iters < config.lr_decay_iters", warmup_iters, decay,
         "CreateLRScheduler: lr_warmup_iters must be < lr_decay_iters.", 29),
    ]
    for ok, expr, a, b, msg, line in rows:
        if not ok:
            return expr, _g(a), _g(b), msg, f"{SRC}:{line}"
    return None


def _g(v):
    return f"{float(v):g}" if isinstance(v, (float, np.floating)) else str(v)


class _Opt:
    def __init__(self, lr):
        self.lr = f32(lr)


class _Lambda:
    """LambdaLR (lr_scheduler.cc:227-231): lr = base_lr * lambda(last_step), chained == closed."""

    def __init__(self, opt, fn):
        self.opt, self.fn, self.last, self.base = opt, fn, -1, opt.lr  # ctor, lr_scheduler.cc:87-91
        self.step()  # InitialStep, lr_scheduler.cc:103-107

    def closed(self):
        return f32(self.base * f32(self.fn(self.last)))

    def step(self, epoch=None):  # lr_scheduler.cc:93-101
        if epoch is None:
            self.last += 1
        else:
            self.last = epoch
        self.opt.lr = self.closed()


class _Linear(_Lambda):
    """LinearLR (lr_scheduler.cc:185-224): closed form for Step(epoch), chained form for Step()."""

    def __init__(self, opt, start, end, total):
        self.start, self.end, self.total = f32(start), f32(end), total
        self.initial = True
        self.opt, self.last, self.base = opt, -1, opt.lr
        self.step()
        self.initial = False

    def closed(self):  # lr_scheduler.cc:196-203
        if self.last >= self.total:
            return f32(self.base * self.end)
        return f32(self.base * f32(self.start + f32(f32(self.end - self.start) * f32(self.last)) / f32(self.total)))

    def chained(self):  # lr_scheduler.cc:205-224
        lr, s, e, n, k = self.opt.lr, self.start, self.end, self.total, self.last
        if k == 0:
            return f32(lr * s)
        if k > n or self.initial:
            return lr
        if k == n:
            prev = f32(s + f32(f32(e - s) * f32(n - 1)) / f32(n))
            return f32(lr * f32(e / prev))
        num = f32(e - s)
        den = f32(f32(s * f32(n)) + f32(f32(k - 1) * num))
        return f32(lr * f32(f32(1) + f32(num / den)))

    def step(self, epoch=None):
        if epoch is None:
            self.last += 1
            self.opt.lr = self.chained()
        else:
            self.last = epoch
            self.opt.lr = self.closed()


def _main(opt, style, mx, mn, warmup_iters, decay, cosine_floor=False):
    """The main scheduler of CreateLRScheduler (lr_scheduler.cc:35-68); ``cosine_floor`` plants
    a cosine that decays to 2 x min_lr."""
    d_after = decay - warmup_iters  # lr_scheduler.cc:34
    if style == "constant":  # :36-37
        return _Lambda(opt, lambda step: 1.0)
    if style == "linear":  # :38-40
        return _Linear(opt, 1.0, f32(mn / mx), d_after)
    if style == "cosine":  # :41-56
        floor = f32(f32(2) * mn) if cosine_floor else mn

        def cosine(step):
            if step > d_after:
                return f32(floor / mx)
            ratio = f32(f32(step) / f32(d_after))
            coeff = f32(f32(0.5) * f32(np.cos(f32(f32(math.pi) * ratio)) + f32(1)))
            return f32(f32(floor + f32(coeff * f32(mx - floor))) / mx)
        return _Lambda(opt, cosine)

    def inv_sqrt(step):  # :57-68
        g = step + warmup_iters
        if g > decay:
            return f32(mn / mx)
        w = f32(max(warmup_iters, 1))
        cur = f32(max(g, 1))
        return f32(max(mn, f32(f32(mx * np.sqrt(w)) / np.sqrt(cur))) / mx)
    return _Lambda(opt, inv_sqrt)


def schedule(style: str, lr: float, min_lr: float, warmup_iters: int, warmup_init: float, decay: int,
             n: int, plant: str | None = None) -> list[np.float32]:
    """The lr in force at steps 0..n-1 (what the step line prints and SGD uses). ``decay`` is the
    effective lr_decay_iters (see ``decay_iters``); ``check`` must have passed. ``plant``: one
    of PLANTS (the module docstring), or None for the branch's schedule."""
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"lr plant {plant!r}: expected one of {', '.join(PLANTS)}")
    opt = _Opt(lr)
    if style == "none":  # no scheduler: static_cast<float>(FLAGS_learning_rate), gpt2/main.cc:428
        return [f32(lr)] * n
    mx, mn, wi = f32(lr), f32(min_lr), f32(warmup_init)  # config.lr != 0 -> max_lr, lr_scheduler.cc:21
    main = _main(opt, style, mx, mn, warmup_iters, decay, cosine_floor=plant == "cosine_floor")
    # the warmup's hand-over step (SequentialLR's milestone, lr_scheduler.cc:81-83); warmup_short
    # hands over one step early
    milestone = max(warmup_iters - 1, 0) if plant == "warmup_short" else warmup_iters
    out = []
    if milestone == 0:  # lr_scheduler.cc:71-73
        for _ in range(n):
            out.append(opt.lr)
            main.step()
        return out
    # warmup LambdaLR (lr_scheduler.cc:75-80), created after main's InitialStep moved the lr
    warm = _Lambda(opt, lambda step: f32(f32(wi + f32(f32(mx - wi) * f32(f32(step) / f32(warmup_iters)))) / mx))
    # SequentialLR::InitialStep (lr_scheduler.cc:256-264): lr = warmup's base, children undone one
    # step, then warmup's InitialStep
    opt.lr = warm.base
    warm.last -= 1
    main.last -= 1
    seq_last = 0
    warm.step()
    for _ in range(n):
        out.append(opt.lr)
        seq_last += 1  # SequentialLR::Step, lr_scheduler.cc:275-286 (milestones = [warmup_iters])
        if seq_last < milestone:
            warm.step()
        elif seq_last == milestone:
            main.step(0)
        else:
            main.step()
    return out
