"""What `build_loaders` returns (beside the loaders, which import it: no circle through the package)."""

from collections import namedtuple

Loaders = namedtuple("Loaders", ["train", "val"])
