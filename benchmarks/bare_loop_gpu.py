"""A bare PyTorch training loop on one CUDA GPU: the reference the trainer's images/s is compared with.

  python3 benchmarks/bare_loop_gpu.py --configs 256:fp16 256:bf16 64:fp16 64:bf16 --channels-last
      [--model resnet50] [--image-size 224] [--steps 80] [--warmup-steps 20] [--steps-64 230 --warmup-64 30]

Per config BATCH:PRECISION (precision none|fp16|bf16): a fresh torchvision model, the trainer's
optimizer (SGD, momentum 0.9, weight decay 1e-4 on conv/linear weights only), cross-entropy with label
smoothing 0.1, autocast (fp16 with a GradScaler), cuDNN benchmark mode, one fixed random batch on the
device (as `--data synthetic`), channels-last when asked. Timed with the device synchronised at both ends
of the measured steps (those after the warm-up steps), like the trainer's measured window. Prints one
JSON line per config: {"batch", "amp", "channels_last", "steps", "warmup_steps", "images_per_s"}.
"""
import argparse
import json
import sys
import time
from typing import List, Optional

import torch
import torchvision


def images_per_s(model_name: str, batch: int, amp: str, channels_last: bool, image_size: int, steps: int,
                 warmup_steps: int) -> float:
    """Training images/s over `steps - warmup_steps` steps of a plain loop."""
    device = torch.device("cuda")
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(0)
    model = getattr(torchvision.models, model_name)(num_classes=1000).to(device, memory_format=memory_format)
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=0.1, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp)
    images = torch.randn(batch, 3, image_size, image_size, device=device).contiguous(memory_format=memory_format)
    labels = torch.randint(0, 1000, (batch,), device=device)
    model.train()
    for step in range(steps):
        if step == warmup_steps:
            torch.cuda.synchronize()
            started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = criterion(model(images), labels)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    if not torch.isfinite(loss).item():
        raise RuntimeError("non-finite loss %s at batch %d, %s" % (loss.item(), batch, amp))
    return (steps - warmup_steps) * batch / elapsed


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", nargs="+", default=["256:fp16", "256:bf16", "64:fp16", "64:bf16"],
                   help="BATCH:PRECISION, precision none|fp16|bf16")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--steps", type=int, default=80, help="steps per config with batch > 64")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--steps-64", type=int, default=230, help="steps per config with batch <= 64")
    p.add_argument("--warmup-64", type=int, default=30)
    args = p.parse_args(argv)
    torch.backends.cudnn.benchmark = True  # as the trainer on CUDA
    for config in args.configs:
        batch_text, amp = config.split(":")
        batch = int(batch_text)
        small = batch <= 64
        steps, warmup = (args.steps_64, args.warmup_64) if small else (args.steps, args.warmup_steps)
        rate = images_per_s(args.model, batch, amp, args.channels_last, args.image_size, steps, warmup)
        print(json.dumps({"batch": batch, "amp": amp, "channels_last": args.channels_last, "model": args.model,
                          "steps": steps, "warmup_steps": warmup, "images_per_s": rate}), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
