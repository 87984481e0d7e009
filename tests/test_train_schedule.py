"""LR schedule: linear scaling, gradual warm-up, step/cosine/exponential (pure functions)."""
import math

import pytest

from dlaunch.train.schedule import LRSchedule


def schedule(name: str, **kw) -> LRSchedule:
    # The paper's setting on 4 GPUs: 0.025 per 64 images, 64 per GPU -> lr_max 0.1; 90 epochs of 100 steps.
    args = dict(lr=0.025, reference_batch=64, global_batch=256, steps_per_epoch=100, total_steps=9000,
                schedule=name, warmup_epochs=5, lr_min=0.001, gamma=0.95)
    args.update(kw)
    return LRSchedule(**args)


def test_linear_scaling_and_gradual_warmup_from_the_reference_lr():
    s = schedule("step")
    assert s.lr_max == pytest.approx(0.1)
    assert s(0) == pytest.approx(0.025)
    assert s(250) == pytest.approx(0.025 + (0.1 - 0.025) * 250 / 500)
    assert s(499) < 0.1
    assert s(500) == pytest.approx(0.1)


def test_fractional_warmup_epochs_and_global_batch_below_reference_batch():
    assert schedule("step", warmup_epochs=0.5).warmup_steps == 50
    small = schedule("step", global_batch=32)  # lr_max 0.0125 < lr: warm-up holds lr_max
    assert small(0) == pytest.approx(0.0125) and small(10) == pytest.approx(0.0125)


def test_step_divides_by_ten_at_30_60_80_of_90_epochs():
    s = schedule("step")
    assert s.milestones == (30, 60, 80)
    assert s(2999) == pytest.approx(0.1)
    assert s(3000) == pytest.approx(0.01)
    assert s(6000) == pytest.approx(0.001)
    assert s(8000) == pytest.approx(0.0001)
    assert s(8999) == pytest.approx(0.0001)


def test_step_milestones_scale_with_shorter_runs():
    s = schedule("step", total_steps=1800, warmup_epochs=1)  # 18 epochs
    assert s.milestones == (6, 12, 16)
    assert s(599) == pytest.approx(0.1) and s(600) == pytest.approx(0.01)


def test_cosine_counts_t_after_warmup():
    s = schedule("cosine")
    t_max = 85.0
    for step in (500, 1234, 4750, 8999):
        t = (step - 500) / 100
        expected = 0.001 + 0.5 * (0.1 - 0.001) * (1 + math.cos(math.pi * t / t_max))
        assert s(step) == pytest.approx(expected)
    assert s(500) == pytest.approx(0.1)
    assert s(9000) == pytest.approx(0.001)


def test_exponential_is_fractional_per_iteration():
    s = schedule("exponential")
    assert s(500) == pytest.approx(0.1)
    assert s(600) == pytest.approx(0.1 * 0.95)
    assert s(650) == pytest.approx(0.1 * 0.95 ** 1.5)


def test_unknown_schedule_is_rejected():
    with pytest.raises(ValueError, match="linear"):
        schedule("linear")(600)
