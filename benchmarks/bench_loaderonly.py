"""The input pipeline alone: images/s of the trainer's training loader per loader and worker count, with
`python -m dlaunch.train.loaderbench` (issue 48: the rate `dlaunch predict --loader` bounds a step by).

  .venv/bin/python benchmarks/bench_loaderonly.py [--images 1024] [--source photos|pattern] [--batch-size 32]
      [--workers 1 2] [--loaders native dali-cpu] [--repeats 2]

Writes `--images` JPEGs once: `photos` (default) random 500 x 375 crops of scikit-learn's two sample photographs at
JPEG quality 97 (about 90 kB: ImageNet's training JPEGs average about 110 kB at about 400 x 350), `pattern` the
trainer's noisy stripes at 433 x 433 (ImageNet's mean pixel count); then runs the loader-only benchmark for every
loader and worker count, `--repeats` times interleaved (other processes share the machine: the fastest run counts),
and prints a Markdown table with the machine, the date and the commands; writes benchmarks/results/bench_loaderonly.json.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import save_results  # noqa: E402

from dlaunch.train.data.make_folder import make_pattern_folder  # noqa: E402
from dlaunch.train.loaderbench import cpu_name, usable_cores  # noqa: E402

FLAGS = {"native": ["--loader", "native"], "dali-cpu": ["--loader", "dali", "--dali-device", "cpu"],
         "dali-gpu": ["--loader", "dali", "--dali-device", "gpu"]}


def run(folder: str, loader: str, workers: int, args: argparse.Namespace) -> Dict[str, Any]:
    argv = [sys.executable, "-m", "dlaunch.train.loaderbench", "--data", folder, *FLAGS[loader], "--workers",
            str(workers), "--batch-size", str(args.batch_size), "--batches", str(args.batches), "--warmup-batches",
            str(args.warmup_batches)]
    shown = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT))
    if shown.returncode != 0:
        raise SystemExit("%s failed: %s" % (" ".join(argv), shown.stderr.strip()))
    return dict(json.loads(shown.stdout), command=" ".join(["python"] + argv[1:]))


def write_photos(root: str, images: int, seed: int = 0) -> None:
    """`images` training JPEGs (and 2 validation ones per class) in 4 classes: random 500 x 375 crops of scikit-learn's
    sample photographs, mirrored at random, quality 97."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.RandomState(seed)
    for split, count in (("train", images // 4), ("val", 2)):
        for label in range(4):
            folder = os.path.join(root, split, "class_%d" % label)
            os.makedirs(folder)
            for i in range(count):
                photo = photos[rng.randint(len(photos))]
                top, left = rng.randint(photo.shape[0] - 375 + 1), rng.randint(photo.shape[1] - 500 + 1)
                crop = photo[top:top + 375, left:left + 500]
                Image.fromarray(crop[:, ::-1] if rng.rand() < 0.5 else crop).save(
                    os.path.join(folder, "%05d.JPEG" % i), quality=97)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--source", default="photos", choices=("photos", "pattern"))
    parser.add_argument("--size", type=int, default=433, help="the pattern's side in pixels")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--warmup-batches", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--loaders", nargs="+", default=["native", "dali-cpu"], choices=sorted(FLAGS))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "jpegs")
        if args.source == "photos":
            write_photos(folder, args.images)
        else:
            make_pattern_folder(folder, classes=4, images_per_class=args.images // 4, val_per_class=2, size=args.size)
        files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(folder, "train")) for f in fs]
        jpeg_kb = sum(os.path.getsize(f) for f in files) / len(files) / 1e3
        runs: List[Dict[str, Any]] = []
        for _ in range(args.repeats):
            for loader in args.loaders:
                for workers in args.workers:
                    runs.append(run(folder, loader, workers, args))
    best = {}
    for r in runs:
        key = (r["loader"], r["workers"])
        if key not in best or r["images_per_s"] > best[key]["images_per_s"]:
            best[key] = r
    shape = "500 x 375 photo crops" if args.source == "photos" else "%d x %d pattern" % (args.size, args.size)
    print("Machine: %s, %d usable cores; %s; %d %s JPEGs (%.0f kB each on average), batch %d, "
          "%d timed batches after %d; fastest of %d runs.\n" % (
              cpu_name(), usable_cores(), datetime.date.today().isoformat(), len(files), shape, jpeg_kb,
              args.batch_size, args.batches, args.warmup_batches, args.repeats))
    print("| loader | workers | images/s | per worker | all runs images/s |")
    print("|---|---|---|---|---|")
    for (loader, workers), r in sorted(best.items()):
        every = [x["images_per_s"] for x in runs if (x["loader"], x["workers"]) == (loader, workers)]
        print("| %s | %d | %.1f | %.1f | %s |" % (loader, workers, r["images_per_s"], r["images_per_s_per_worker"],
                                                 " / ".join("%.1f" % x for x in every)))
    print("\nCommands (the folder is a temporary one):")
    for r in best.values():
        print("    %s" % r["command"])
    save_results("bench_loaderonly", {"jpeg_kb": jpeg_kb, "source": shape, "runs": runs})


if __name__ == "__main__":
    main()
