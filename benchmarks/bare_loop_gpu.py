"""A bare PyTorch training loop: the reference the trainer's images/s is compared with (one CUDA GPU, or the CPU).

  python3 benchmarks/bare_loop_gpu.py --batch-size 256 --amp fp16 --channels-last [--model resnet50]
      [--image-size 224] [--steps 80] [--warmup-steps 20] [--device cuda|cpu]
      [--compile off|default|reduce-overhead|max-autotune-no-cudagraphs] [--cuda-graphs]
      [--optimizer-impl default|foreach|fused] [--host-syncs default|minimal]

The options mean what the trainer's options of the same names mean, so a pair (trainer, bare loop) run with
the same options measures only the trainer's own overhead. One run: a fresh torchvision model, the
trainer's optimizer (SGD, lr 0.1, momentum 0.9, weight decay 1e-4 on conv/linear weights only), cross-entropy
with label smoothing 0.1, autocast (fp16 with a GradScaler), cuDNN benchmark mode, one fixed random batch on
the device (as `--data synthetic`), channels-last when asked.
  --compile MODE      torch.compile(model, mode=MODE); the loss and the optimizer step stay eager.
  --optimizer-impl    torch.optim.SGD's foreach=True / fused=True (default: torch's own choice).
  --cuda-graphs       the whole step (forward, backward, optimizer step, fp16's loss scaling) is captured in one
                      CUDA graph at the last warm-up step and replayed from then on; the steps before the capture
                      run on a side stream and autocast runs without its cache, as torch.cuda.graph requires.
  --host-syncs        the bare loop reads nothing on the host per step in either mode. Under fp16, GradScaler's
                      step reads its overflow flag on the host unless the optimizer is fused (the fused SGD skips
                      an overflowing step on the device), so `minimal` with fp16 needs --optimizer-impl fused; on
                      CUDA, `minimal` runs the last warm-up step under torch.cuda.set_sync_debug_mode("error"),
                      so a step that still waits for the host fails, naming the call.
Prints one JSON line: the options, then the measures
  images_per_s   images of the steps after the warm-up steps / their wall time, the device synchronised at
                 both ends (the trainer's measured window)
  first_step_s   wall time of the first step, device synchronised: with --compile, torch.compile's tracing and
                 code generation of forward and backward, plus one step (never part of images_per_s)
  warmup_s       wall time of all warm-up steps (compilation, cuDNN autotuning, CUDA graph capture)
  compiled_graphs, graph_breaks   torch._dynamo's counters (0 without --compile)
Bad options: one line naming the flag, exit 2, nothing printed on stdout.
"""
import argparse
import contextlib
import json
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional

import torch
import torchvision

COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
OPTIMIZER_IMPLS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}
GRAPH_EAGER_STEPS = 3  # eager steps on a side stream before a capture (torch.cuda.graph's documented warm-up)


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError("%s is below %d" % (text, low))
        return value
    return parse


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, "%s: error: %s\n" % (self.prog, message))


def refusal(args: argparse.Namespace, cuda_available: bool) -> Optional[str]:
    """Why these options cannot run here (one line naming the flag), else None."""
    fp16_unfused = args.amp == "fp16" and args.optimizer_impl != "fused"
    if args.warmup_steps >= args.steps:
        return "--warmup-steps %d leaves none of the --steps %d to measure" % (args.warmup_steps, args.steps)
    if args.host_syncs == "minimal" and fp16_unfused:
        return ("--host-syncs minimal with --amp fp16 needs --optimizer-impl fused (otherwise GradScaler's step "
                "reads its overflow flag on the host every step)")
    if args.cuda_graphs:
        if fp16_unfused:
            return ("--cuda-graphs with --amp fp16 needs --optimizer-impl fused (otherwise GradScaler's step reads "
                    "its overflow flag on the host, which a CUDA graph cannot capture)")
        if args.compile == "reduce-overhead":
            return "--cuda-graphs with --compile reduce-overhead: that mode captures CUDA graphs itself"
        if args.warmup_steps <= GRAPH_EAGER_STEPS:
            return "--cuda-graphs needs --warmup-steps > %d (eager steps before the capture)" % GRAPH_EAGER_STEPS
        if args.device != "cuda":
            return "--cuda-graphs needs --device cuda"
    if args.amp == "fp16" and args.device != "cuda":
        return "--amp fp16 needs --device cuda (use --amp bf16 on the CPU)"
    if args.device == "cuda" and not cuda_available:
        return "--device cuda: no CUDA device is available"
    return None


@contextlib.contextmanager
def sync_debug(mode: Optional[str]) -> Iterator[None]:
    """torch.cuda.set_sync_debug_mode(mode) inside the block (nothing when mode is None)."""
    if mode is None:
        yield
        return
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def dynamo_counts() -> Dict[str, int]:
    """Graphs torch._dynamo compiled and graph breaks it took, in this process."""
    from torch._dynamo.utils import counters
    return {"compiled_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def measure(args: argparse.Namespace) -> Dict[str, Any]:
    """Train `args.steps` steps; the measures of the module docstring."""
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    synchronize: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(num_classes=1000).to(device, memory_format=memory_format)
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=0.1, momentum=0.9, **OPTIMIZER_IMPLS[args.optimizer_impl])
    if args.optimizer_impl == "fused":  # zero momentum before a first step that fp16 skips: the trainer's reason
        for param in model.parameters():  # (dlaunch/train/workload.py, zero_momentum_at_first_step)
            optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    scaler = torch.amp.GradScaler("cuda") if args.amp == "fp16" else None
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.amp)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    images = images.contiguous(memory_format=memory_format)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)
    forward = model if args.compile == "off" else torch.compile(model, mode=args.compile)
    model.train()

    def train_step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None, cache_enabled=not args.cuda_graphs):
            loss = criterion(forward(images), labels)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss

    side_stream = torch.cuda.Stream() if args.cuda_graphs else None
    if side_stream is not None:
        side_stream.wait_stream(torch.cuda.current_stream())
    graph: Optional[torch.cuda.CUDAGraph] = None
    capture_step = args.warmup_steps - 1
    check_syncs = cuda and args.host_syncs == "minimal"
    began = time.perf_counter()
    for step in range(args.steps):
        if step == args.warmup_steps:
            synchronize()
            started = time.perf_counter()
        if args.cuda_graphs and step == capture_step:
            torch.cuda.current_stream().wait_stream(side_stream)
            optimizer.zero_grad(set_to_none=True)  # the capture allocates the gradients in the graph's pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                loss = train_step()
        with sync_debug("error" if check_syncs and step == args.warmup_steps - 1 else None):
            if graph is not None:
                graph.replay()
            else:
                with torch.cuda.stream(side_stream) if side_stream is not None else contextlib.nullcontext():
                    optimizer.zero_grad(set_to_none=True)
                    loss = train_step()
        if step == 0:
            synchronize()
            first_step_s = time.perf_counter() - began
    synchronize()
    elapsed = time.perf_counter() - started
    if not torch.isfinite(loss).item():
        raise RuntimeError("non-finite loss %s at batch %d, %s" % (loss.item(), args.batch_size, args.amp))
    counts = dynamo_counts() if args.compile != "off" else {"compiled_graphs": 0, "graph_breaks": 0}
    return dict(images_per_s=(args.steps - args.warmup_steps) * args.batch_size / elapsed, first_step_s=first_step_s,
                warmup_s=started - began, host_syncs_checked=check_syncs, **counts)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = OneLineParser(prog="bare_loop_gpu.py", description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=at_least(1), default=256)
    p.add_argument("--amp", choices=("none", "fp16", "bf16"), default="none")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--model", default="resnet50", help="a torchvision model name")
    p.add_argument("--image-size", type=at_least(1), default=224)
    p.add_argument("--steps", type=at_least(1), default=80, help="steps in all, the warm-up steps included")
    p.add_argument("--warmup-steps", type=at_least(0), default=20)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--compile", choices=COMPILE_MODES, default="off")
    p.add_argument("--cuda-graphs", action="store_true")
    p.add_argument("--optimizer-impl", choices=tuple(OPTIMIZER_IMPLS), default="default")
    p.add_argument("--host-syncs", choices=("default", "minimal"), default="default")
    args = p.parse_args(argv)
    if not hasattr(torchvision.models, args.model):
        p.error("--model %s: torchvision has no such model" % args.model)
    why = refusal(args, torch.cuda.is_available())
    if why:
        p.error(why)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True  # as the trainer on CUDA
    result = dict(vars(args), **measure(args))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
