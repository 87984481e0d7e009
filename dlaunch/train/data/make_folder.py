"""Write ImageNet-layout folders of real JPEG files (train/<class>/*.JPEG, val/<class>/*.JPEG).

  python -m dlaunch.train.data.make_folder OUT --classes 4 --images-per-class 32 --size 64 --seed 0
  python -m dlaunch.train.data.make_folder OUT --from-digits --size 32

The generated classes are learnable: each class has its own colour and stripe pattern (orientation,
frequency), every image adds a random phase, brightness jitter and noise. `--from-digits` exports
scikit-learn's bundled 8x8 digits (1797 images, 10 classes, no download) upscaled to RGB JPEGs with a
stratified train/val split. Both are deterministic by seed. The folder appears atomically (written to
a temporary sibling, then renamed); an existing non-empty OUT is refused.
"""

import os
import shutil
import sys
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from dlaunch.train.config import ConfigError, OneLineParser

Sample = Tuple[np.ndarray, int, str]  # (HxWx3 uint8 image, class index, split)


def _write_atomically(root: str, class_names: List[str], samples: Callable[[], List[Sample]]) -> None:
    if os.path.exists(root) and (not os.path.isdir(root) or os.listdir(root)):
        raise ConfigError("%s exists and is not an empty directory" % root)
    tmp = "%s.tmp-%d" % (root.rstrip("/"), os.getpid())
    try:
        for split in ("train", "val"):
            for name in class_names:
                os.makedirs(os.path.join(tmp, split, name))
        counts: Dict[Tuple[str, int], int] = {}
        for pixels, label, split in samples():
            key = (split, label)
            counts[key] = counts.get(key, 0) + 1
            path = os.path.join(tmp, split, class_names[label], "%s_%05d.JPEG" % (split, counts[key]))
            Image.fromarray(pixels, "RGB").save(path, "JPEG", quality=90)
        if os.path.isdir(root):
            os.rmdir(root)
        os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_pattern_folder(
    root: str, classes: int, images_per_class: int, val_per_class: int, size: int, seed: int = 0
) -> None:
    """`classes` classes of coloured stripes, `images_per_class` train and `val_per_class` val images each."""
    rng = np.random.RandomState(seed)
    colours = rng.uniform(40, 215, size=(classes, 3))
    angles = rng.permutation(classes) * np.pi / classes
    frequencies = rng.uniform(2, 6, size=classes) * 2 * np.pi / size
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)

    def samples() -> List[Sample]:
        out = []
        for split, count in (("train", images_per_class), ("val", val_per_class)):
            for label in range(classes):
                along = np.cos(angles[label]) * xx + np.sin(angles[label]) * yy
                for _ in range(count):
                    stripes = np.sin(frequencies[label] * along + rng.uniform(0, 2 * np.pi))
                    image = colours[label] * rng.uniform(0.8, 1.2) + 40 * stripes[..., None]
                    image += rng.normal(0, 12, size=image.shape)
                    out.append((np.clip(image, 0, 255).astype(np.uint8), label, split))
        return out

    _write_atomically(root, ["class_%03d" % c for c in range(classes)], samples)


def make_digits_folder(root: str, size: int = 32, val_fraction: float = 0.2, seed: int = 0) -> None:
    """scikit-learn's digits as `size`x`size` RGB JPEGs, `val_fraction` of every class in val/."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.RandomState(seed)

    def samples() -> List[Sample]:
        out = []
        for label in range(10):
            indices = rng.permutation(np.flatnonzero(digits.target == label))
            n_val = max(1, int(round(len(indices) * val_fraction)))
            for rank, index in enumerate(indices):
                grey = Image.fromarray((digits.images[index] * (255.0 / 16.0)).astype(np.uint8), "L")
                pixels = np.asarray(grey.resize((size, size), Image.BILINEAR).convert("RGB"))  # type: ignore[attr-defined]  # Image.Resampling is Pillow >= 9.1; the trainer's 3.9 image may have an older Pillow
                out.append((pixels, label, "val" if rank < n_val else "train"))
        return out

    _write_atomically(root, [str(d) for d in range(10)], samples)


def main(argv: Optional[List[str]] = None) -> int:
    p = OneLineParser(prog="python -m dlaunch.train.data.make_folder", description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--from-digits", action="store_true", help="export scikit-learn's digits instead")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--images-per-class", type=int, default=32, help="training images per class")
    p.add_argument("--val-per-class", type=int, default=8)
    p.add_argument("--val-fraction", type=float, default=0.2, help="--from-digits: share of each class in val/")
    p.add_argument("--size", type=int, default=64, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0)
    try:
        args = p.parse_args(argv)
        if args.size < 8:
            raise ConfigError("--size %d is too small (at least 8)" % args.size)
        if args.from_digits:
            if not 0.0 < args.val_fraction < 1.0:
                raise ConfigError("--val-fraction %s must be in (0, 1)" % args.val_fraction)
            make_digits_folder(args.out, args.size, args.val_fraction, args.seed)
        else:
            for flag, value in (
                ("--classes", args.classes),
                ("--images-per-class", args.images_per_class),
                ("--val-per-class", args.val_per_class),
            ):
                if value < 1:
                    raise ConfigError("%s %d must be at least 1" % (flag, value))
            make_pattern_folder(args.out, args.classes, args.images_per_class, args.val_per_class, args.size, args.seed)
    except ConfigError as e:
        print("make_folder: error: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
