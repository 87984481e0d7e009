"""Data loaders: `build_loaders(cfg, dist) -> Loaders(train, val)`.

Each loader is an iterable of `(images, labels)` already on `dist.device`, with `len(loader)` =
batches per epoch on this rank and `set_epoch(epoch, skip_batches=0)`: the next iteration yields the
batches of `epoch` (DistributedSampler semantics: one permutation seeded by `seed + epoch`, sharded by
rank) minus the first `skip_batches` (a mid-epoch resume skips them without reading them).
`val` is None where there is no validation set (synthetic data).
"""

from typing import Any

from dlaunch.train.data.loaders import Loaders
from dlaunch.train.errors import ConfigError


def build_loaders(cfg: Any, dist: Any) -> Loaders:
    if cfg.loader == "dali":
        try:
            from dlaunch.train.data.dali import build_dali_loaders
        except ImportError as e:
            raise ConfigError("--loader dali needs NVIDIA DALI (pip install nvidia-dali-cuda120): %s" % e) from None
        return build_dali_loaders(cfg, dist)
    if cfg.synthetic:
        from dlaunch.train.data.synthetic import build_synthetic_loaders

        return build_synthetic_loaders(cfg, dist)
    from dlaunch.train.data.folder import build_folder_loaders

    return build_folder_loaders(cfg, dist)
