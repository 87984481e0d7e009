"""PyTorch parameter server (`torch-ps-sync`, `torch-ps-async`) over torch.distributed.rpc, beside DDP.

One task of the job's step per process (dlaunch/train/engines.py): task 0 is the parameter server (the model's master
copy and the SGD optimizer, the same parameter groups as dlaunch/train/loop.py's), every other task a worker
that runs dlaunch/train/loop.py. A worker's step sends its gradients and the step's LR to the server and copies
the parameters it gets back into its model (BatchNorm statistics stay local, as with DDP's buffers
of each rank before a broadcast).
- synchronous: the server waits for every worker's gradients, applies their mean once, and answers
  all of them with the same new parameters (all workers stay identical);
- asynchronous: the server applies each worker's gradients as they arrive and answers with the
  current parameters; a gradient may be computed on parameters several updates old (staleness
  unbounded). A loop step is then one update per worker, each of one worker's batch, so the LR is
  scaled linearly for one worker's batch (`batches_per_update` = 1 / workers).
Collectives of the loop (barriers, loss means, validation counts, stop flags) run in a gloo group of
the workers alone. Checkpoints hold the worker's copy of the model (the server's optimizer state is
not saved; a resumed run starts the server from the checkpointed parameters).

Entry: `python -m dlaunch.train.frameworks.torch_ps --framework torch-ps-sync|torch-ps-async ...` (the flags of
`python -m dlaunch.train`), one task per process.
"""

import os
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from dlaunch.train.config import EXIT_BAD_INPUT, ConfigError
from dlaunch.train.engines import COORDINATOR, engine_config, engine_mode, mode_settings, task_layout
from dlaunch.train.frameworks.base import DistInfo, ProcessGroupFramework
from dlaunch.train.workload import refuse_step_options

SERVER_NAME = "ps"
RPC_TIMEOUT_S = 600.0

_server: Optional["ParameterServer"] = None  # set in the server's process only


class ParameterServer:
    """The master copy of the parameters and the optimizer (task 0)."""

    def __init__(
        self, parameters: List[torch.nn.Parameter], optimizer: torch.optim.Optimizer, workers: int, synchronous: bool
    ):
        self.parameters, self.optimizer = parameters, optimizer
        self.workers, self.synchronous = workers, synchronous
        self.lock = threading.Lock()
        self.version = 0
        self.pending: List[List[torch.Tensor]] = []
        self.answer: torch.futures.Future = torch.futures.Future()
        self.max_staleness = 0

    def snapshot(self) -> Tuple[int, List[torch.Tensor]]:
        return self.version, [p.detach().clone() for p in self.parameters]

    def apply(self, grads: List[torch.Tensor], lr: float) -> None:
        for p, g in zip(self.parameters, grads):
            p.grad = g
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.version += 1

    def push(self, grads: List[torch.Tensor], lr: float, read_version: int) -> torch.futures.Future:
        with self.lock:
            if not self.synchronous:
                self.max_staleness = max(self.max_staleness, self.version - read_version)
                self.apply(grads, lr)
                done: torch.futures.Future = torch.futures.Future()
                done.set_result(self.snapshot())
                return done
            self.pending.append(grads)
            answer = self.answer
            if len(self.pending) == self.workers:
                mean = [torch.stack(gs).mean(dim=0) for gs in zip(*self.pending)]
                self.pending = []
                self.apply(mean, lr)
                self.answer = torch.futures.Future()
                answer.set_result(self.snapshot())
            return answer


def _pull() -> Tuple[int, List[torch.Tensor]]:
    with _server.lock:  # type: ignore[union-attr]  # RPC functions run on the server process, which sets _server
        return _server.snapshot()  # type: ignore[union-attr]  # RPC functions run on the server process, which sets _server


@rpc.functions.async_execution
def _push(grads: List[torch.Tensor], lr: float, read_version: int) -> torch.futures.Future:
    return _server.push(grads, lr, read_version)  # type: ignore[union-attr]  # RPC functions run on the server process, which sets _server


def _load(parameters: List[torch.Tensor]) -> None:
    """A resumed run's parameters (sent by worker 0)."""
    with _server.lock:  # type: ignore[union-attr]  # RPC functions run on the server process, which sets _server
        for p, value in zip(_server.parameters, parameters):  # type: ignore[union-attr]  # RPC functions run on the server process, which sets _server
            p.data.copy_(value)


class TorchParameterServer(ProcessGroupFramework):
    name = "torch-ps"
    synchronous = True

    def __init__(self) -> None:
        self.model: Any = None
        self.optimizer: Any = None
        self.params: List[torch.nn.Parameter] = []
        self.version = 0
        self.world_size = 1
        self.reply: Optional[Tuple[int, List[torch.Tensor]]] = None  # the server's answer to this step's push

    def init(self, cfg: Any) -> DistInfo:
        refuse_step_options(
            cfg,
            "a parameter server's worker runs on the CPU",
            "a parameter server's worker waits for the server's answer every step",
        )
        mode = engine_mode(cfg.framework, "torch")
        layout = task_layout(os.environ, mode.coordinators, mode.servers_per_node)
        torch.set_num_threads(layout.threads(cfg.threads))
        server = layout.ids(COORDINATOR)[0]
        self.world_size = layout.num_workers
        options = rpc.TensorPipeRpcBackendOptions(
            init_method="tcp://%s:%d" % (layout.hosts[server], layout.ports[server]), rpc_timeout=RPC_TIMEOUT_S
        )
        if layout.role == COORDINATOR:
            self.serve(cfg, layout.task, len(layout.hosts), options)
            raise SystemExit(0)
        worker = layout.worker_index
        rpc.init_rpc("worker%d" % worker, rank=layout.task, world_size=len(layout.hosts), rpc_backend_options=options)
        first = layout.ids("worker")[0]
        dist.init_process_group(
            "gloo",
            init_method="tcp://%s:%d" % (layout.hosts[first], layout.ports[first]),
            rank=worker,
            world_size=self.world_size,
        )
        local = [t for t in layout.ids("worker") if layout.hosts[t] == layout.hosts[layout.task]]
        return DistInfo(worker, self.world_size, local.index(layout.task), len(local), torch.device("cpu"))

    def serve(self, cfg: Any, task: int, world_size: int, options: Any) -> None:
        """The server's whole life: build the model as the workers do, answer until they shut down."""
        global _server
        from dlaunch.train.models import build_model
        from dlaunch.train.workload import build_optimizer

        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, cfg.num_classes)
        _server = ParameterServer(
            list(model.parameters()), build_optimizer(model, cfg), self.world_size, self.synchronous
        )
        rpc.init_rpc(SERVER_NAME, rank=task, world_size=world_size, rpc_backend_options=options)
        rpc.shutdown()  # waits for every worker's shutdown

    def batches_per_update(self, cfg: Any) -> Any:
        return 1 if self.synchronous else 1.0 / self.world_size

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Any):
        self.model, self.optimizer = model, optimizer
        self.params = list(model.parameters())
        self.receive(rpc.rpc_sync(SERVER_NAME, _pull))
        return model, optimizer

    def receive(self, answer: Tuple[int, List[torch.Tensor]]) -> None:
        self.version, values = answer
        with torch.no_grad():
            for p, value in zip(self.params, values):
                p.copy_(value)

    def synchronize_gradients(self) -> None:
        """Push this step's gradients and LR and wait for the server's answer: the update happens there, so for
        the loop's step timers the round trip is communication and waiting for peers; `step` copies it in."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        lr = self.optimizer.param_groups[0]["lr"]
        self.reply = rpc.rpc_sync(SERVER_NAME, _push, args=(grads, lr, self.version))

    def step(self) -> None:
        if self.reply is None:  # a profiled step pushes here (dlaunch/train/profiling.py calls step alone)
            self.synchronize_gradients()
        reply, self.reply = self.reply, None
        self.receive(reply)  # type: ignore[arg-type]  # synchronize_gradients sets the reply

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def state_dict(self) -> Dict[str, Any]:
        return {"model": self.model.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if dist.get_rank() == 0:
            rpc.rpc_sync(SERVER_NAME, _load, args=([p.detach() for p in self.params],))
        dist.barrier()
        self.receive(rpc.rpc_sync(SERVER_NAME, _pull))

    def versions(self) -> Dict[str, str]:
        return {"torch-ps": torch.__version__}

    def settings(self) -> Dict[str, Any]:
        mode = engine_mode("torch-ps-sync" if self.synchronous else "torch-ps-async", "torch")
        staleness = (
            {"staleness_bound": 0}
            if self.synchronous
            else {
                "staleness_bound": None,
                "staleness": "unbounded: the server applies each worker's gradients as they arrive",
            }
        )
        return dict(
            mode_settings(mode),
            transport="torch.distributed.rpc (TensorPipe)",
            collectives="gloo (workers)",
            servers=1,
            **staleness,
        )

    def shutdown(self) -> None:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        if self.params:
            rpc.shutdown()


class TorchParameterServerAsync(TorchParameterServer):
    synchronous = False


def main(argv: Optional[List[str]] = None) -> int:
    """Parse the flags (dlaunch/train/config.py's, `--framework` a torch parameter-server mode) and run the loop."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg, mode, _ = engine_config(argv, "torch", os.environ)
    except ConfigError as e:
        print("train: error: %s" % e, file=sys.stderr)
        return EXIT_BAD_INPUT
    from dlaunch.train.loop import run

    return run(cfg, argv, TorchParameterServer() if mode.synchronous else TorchParameterServerAsync())


if __name__ == "__main__":
    # Run the module under its own name, so that the RPC functions pickle as dlaunch.train.frameworks.torch_ps.*.
    from dlaunch.train.frameworks.torch_ps import main as _main

    sys.exit(_main())
