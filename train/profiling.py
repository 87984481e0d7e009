"""`--profile-steps N`: where the time of a step goes, measured without overlap.

For N steps right after the warm-up steps, each step is timed in parts, with the device
synchronised at every boundary (so the parts are un-overlapped costs, not what a normal step pays):
  data_s    waiting for the next batch;
  compute_s forward + backward with gradient synchronisation disabled (`Framework.no_sync()`);
  comm_s    one explicit all-reduce (mean) of all gradients flattened into one tensor
            (`Framework.all_reduce_mean`), copied back into the gradients; 0 for a job of one
            process, which has nothing to communicate;
  step_s    the whole step: data + compute + comm + the optimizer step.
A normal step overlaps the all-reduce with the backward pass in buckets, so step_s here is an upper
bound of a normal step, and compute_s + comm_s shows what overlap can at best hide. The profiled
steps train exactly like normal ones (averaged gradients) and are excluded from throughput.
The `profile` record holds rank 0's means (method "unoverlapped-timers").
"""
import time
from typing import Any, Callable, Dict, List

import torch

METHOD = "unoverlapped-timers"


class StepProfiler:
    def __init__(self, framework: Any, parameters: List[torch.nn.Parameter], synchronize: Callable[[], None],
                 world_size: int):
        self.framework = framework
        self.world_size = world_size
        self.parameters = parameters
        self.synchronize = synchronize
        self.times: Dict[str, List[float]] = {"data_s": [], "compute_s": [], "comm_s": [], "step_s": []}

    def step(self, forward_backward: Callable[[], torch.Tensor], started: float, data_s: float) -> torch.Tensor:
        """Run one training step in timed parts; `started` is when the batch was requested."""
        self.framework.zero_grad()
        begin = time.perf_counter()
        with self.framework.no_sync():
            loss = forward_backward()
        self.synchronize()
        computed = time.perf_counter()
        if self.world_size > 1:
            self.all_reduce_gradients()
        self.synchronize()
        communicated = time.perf_counter()
        self.framework.step()
        self.synchronize()
        for name, value in (("data_s", data_s), ("compute_s", computed - begin),
                            ("comm_s", communicated - computed), ("step_s", time.perf_counter() - started)):
            self.times[name].append(value)
        return loss

    def all_reduce_gradients(self) -> None:
        grads = [p.grad for p in self.parameters if p.grad is not None]
        mean = self.framework.all_reduce_mean(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for g in grads:
            g.copy_(mean[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def summary(self) -> Dict[str, Any]:
        """Fields of the `profile` record."""
        fields: Dict[str, Any] = {name: sum(v) / len(v) for name, v in self.times.items()}
        fields.update(steps=len(self.times["step_s"]), method=METHOD)
        return fields
