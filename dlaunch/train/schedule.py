"""Learning rate per iteration: linear scaling, gradual warm-up, step/cosine/exponential decay.

`lr_max = lr * global_batch / reference_batch` (Goyal et al.'s linear scaling rule; with the paper's
0.025 per 64 images and 64 images per GPU this is 0.025 per GPU).

Warm-up (Goyal et al.'s gradual warm-up): over the first `round(warmup_epochs * steps_per_epoch)`
steps the LR rises linearly from `lr` (the rate for one reference batch) to `lr_max`; when
`lr_max <= lr` (a global batch below the reference batch) the warm-up holds `lr_max`.

After warm-up, with `e = step / steps_per_epoch` (fractional epochs since the start) and
`t = (step - warmup_steps) / steps_per_epoch` (fractional epochs since the end of warm-up):
  step:        lr_max / 10**k, k = milestones reached by e; the milestones are epochs 30, 60, 80
               of 90, scaled to the run's length as max(1, round(epochs * m / 90))
  cosine:      lr_min + 0.5 * (lr_max - lr_min) * (1 + cos(pi * t / t_max)), t_max = epochs after warm-up
  exponential: lr_max * gamma**t

Pure Python: no torch.
"""

import math
from dataclasses import dataclass
from typing import Tuple

PAPER_EPOCHS = 90
PAPER_MILESTONES = (30, 60, 80)


@dataclass(frozen=True)
class LRSchedule:
    lr: float  # per reference batch
    reference_batch: int
    global_batch: int
    steps_per_epoch: int
    total_steps: int
    schedule: str = "step"
    warmup_epochs: float = 5.0
    lr_min: float = 0.0
    gamma: float = 0.95

    @property
    def lr_max(self) -> float:
        return self.lr * self.global_batch / self.reference_batch

    @property
    def warmup_steps(self) -> int:
        return min(int(round(self.warmup_epochs * self.steps_per_epoch)), self.total_steps)

    @property
    def epochs(self) -> float:
        return self.total_steps / self.steps_per_epoch

    @property
    def milestones(self) -> Tuple[int, ...]:
        """Epochs at which the step schedule divides the LR by 10."""
        return tuple(max(1, int(round(self.epochs * m / PAPER_EPOCHS))) for m in PAPER_MILESTONES)

    def __call__(self, step: int) -> float:
        """The LR for global optimizer step `step` (0-based)."""
        warmup = self.warmup_steps
        if step < warmup:
            start = min(self.lr, self.lr_max)
            return start + (self.lr_max - start) * step / warmup
        t = (step - warmup) / self.steps_per_epoch
        if self.schedule == "step":
            epoch = step / self.steps_per_epoch
            return self.lr_max * 0.1 ** sum(1 for m in self.milestones if epoch >= m)
        if self.schedule == "cosine":
            t_max = (self.total_steps - warmup) / self.steps_per_epoch
            if t_max <= 0:
                return self.lr_max
            return self.lr_min + 0.5 * (self.lr_max - self.lr_min) * (1 + math.cos(math.pi * min(t, t_max) / t_max))
        if self.schedule == "exponential":
            return self.lr_max * self.gamma**t
        raise ValueError("unknown schedule %r" % (self.schedule,))
