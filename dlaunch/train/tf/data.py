"""tf.data input: synthetic (one fixed random batch per worker, repeated) or the image folder (decoded
JPEGs, random horizontal flip, resized to --image-size, ImageNet mean/std). Training batches are
per worker (`--batch-size`); worker w of W takes files w, w+W, ... of a per-pass shuffle."""

from typing import Any, Optional, Tuple

import tensorflow as tf

from dlaunch.train.engines import folder_files

MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def _decode(image_size: int, train: bool):
    def decode(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        image = tf.image.resize(tf.cast(image, tf.float32), (image_size, image_size))
        if train:
            image = tf.image.random_flip_left_right(image)
        return (image - MEAN) / STD, label

    return decode


def train_dataset(cfg: Any, worker: Optional[int], workers: int) -> tf.data.Dataset:
    """An endless dataset of (images NHWC float32, labels int32) batches of `cfg.batch_size`: worker
    `worker`'s shard of a per-pass shuffle seeded by --seed, or (`worker` None: parameter-server workers,
    which do not know their index when the dataset is built) the whole set in an unseeded order."""
    if cfg.synthetic:
        tf.random.set_seed(cfg.seed * 65536 + (worker or 0))
        images = tf.random.normal((cfg.batch_size, cfg.image_size, cfg.image_size, 3), seed=1)
        labels = tf.random.uniform((cfg.batch_size,), 0, cfg.num_classes, dtype=tf.int32, seed=2)
        return tf.data.Dataset.from_tensors((images, labels)).repeat()
    paths, labels = folder_files(cfg.data, "train")
    ds = tf.data.Dataset.from_tensor_slices((paths, tf.constant(labels, tf.int32)))
    seed = None if worker is None else cfg.seed
    ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True).repeat()
    if worker is not None:
        ds = ds.shard(workers, worker)
    return (
        ds.map(_decode(cfg.image_size, True), num_parallel_calls=max(1, cfg.workers))
        .batch(cfg.batch_size, drop_remainder=True)
        .prefetch(2)
    )


def steps_per_epoch(cfg: Any, workers: int) -> int:
    """Synthetic: --steps-per-epoch; folder: full global batches in the training set."""
    if cfg.synthetic:
        return cfg.steps_per_epoch
    return max(1, len(folder_files(cfg.data, "train")[0]) // (cfg.batch_size * workers))


def val_dataset(cfg: Any, worker: int, workers: int) -> Optional[tf.data.Dataset]:
    """Files worker, worker+workers, ... of val/ (every image on exactly one worker); None for synthetic."""
    if cfg.synthetic:
        return None
    paths, labels = folder_files(cfg.data, "val")
    ds = tf.data.Dataset.from_tensor_slices((paths[worker::workers], tf.constant(labels[worker::workers], tf.int32)))
    return ds.map(_decode(cfg.image_size, False)).batch(cfg.batch_size)


def counts(model: Any, ds: Optional[tf.data.Dataset]) -> Tuple[float, float, float, float]:
    """(top-1 hits, top-5 hits, cross-entropy sum, images) of `model` over `ds`."""
    totals = [0.0, 0.0, 0.0, 0.0]
    for images, labels in ds if ds is not None else ():
        logits = model(images, training=False)
        top = tf.math.top_k(logits, k=min(5, logits.shape[-1])).indices
        hits = tf.cast(tf.equal(top, labels[:, None]), tf.float32)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        totals[0] += float(tf.reduce_sum(hits[:, 0]))
        totals[1] += float(tf.reduce_sum(hits))
        totals[2] += float(tf.reduce_sum(loss))
        totals[3] += float(tf.shape(labels)[0])
    return totals[0], totals[1], totals[2], totals[3]
