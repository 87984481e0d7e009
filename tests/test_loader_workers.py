"""Loader workers start safely beside the trainer's threads (issue 44 item 4; dlaunch/train/data/folder.py): a worker
forked while another thread of the trainer holds a lock keeps that lock held for ever; the trainer's workers come from
a fork server and never see that state."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from helpers_train import REPO, trainer_env

from dlaunch.train.config import parse_config
from dlaunch.train.data import build_loaders
from dlaunch.train.data.folder import process_gone
from dlaunch.train.data.make_folder import make_pattern_folder
from dlaunch.train.frameworks.base import DistInfo

PROBE = Path(__file__).resolve().parent / "loader_lock_probe.py"


def probe(way: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(PROBE), way],
        cwd=REPO,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_worker_forked_while_a_thread_holds_a_lock_finds_it_held_for_ever():
    """The forced state: with the start method the trainer used before (fork, torch's default on Linux) the
    worker's copy of the lock is held by a thread that does not exist in the worker; every item that needs it would
    wait for ever (the probe asks without waiting)."""
    assert probe("fork") == {"way": "fork", "worker_found_the_lock_free": [False, False], "start_method": "fork"}


def test_the_trainers_workers_find_the_lock_free():
    """The same moment with the trainer's own worker options (failed before: its workers were forked)."""
    assert probe("trainer") == {
        "way": "trainer",
        "worker_found_the_lock_free": [True, True],
        "start_method": "forkserver",
    }


def test_the_workers_and_their_fork_server_end_with_a_trainer_that_dies_abruptly(tmp_path):
    """A trainer that exits without shutting its loader down (the watchdog's os._exit(69) on a hang; SIGKILL) leaves
    no process behind (failed before: the fork server lives as long as its workers and each worker as long as its
    parent, the fork server, so both ran on for ever, holding the job's output; seen in bench_watchdog.py's runs)."""
    out = tmp_path / "probe.out"
    with open(out, "w") as f:  # not a pipe: a process left behind would hold it open
        done = subprocess.run(
            [sys.executable, str(PROBE), "trainer-dies"],
            cwd=REPO,
            env=trainer_env(),
            stdout=f,
            stderr=subprocess.DEVNULL,
            timeout=300,
            check=False,
        )
    assert done.returncode == 69
    pids = json.loads(out.read_text().splitlines()[-1])["pids"]
    assert len(pids) == 2
    deadline = time.monotonic() + 120  # they end within TRAINER_CHECK_S of it; a bound, not a measurement
    while not all(map(process_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in pids if not process_gone(pid)]
    for pid in left:  # this test's own processes: end them, then fail
        os.kill(pid, signal.SIGKILL)
    assert not left, "left running: %s" % left


def test_the_folder_loaders_keep_their_workers_and_seed_by_epoch_and_index(tmp_path):
    """build_folder_loaders uses those options, keeps its workers between epochs, and the augmentation of a sample is
    a function of (seed, epoch, index) however many workers there are: a persistent worker holds its dataset from the
    first epoch, so the epoch comes with each index."""
    folder = tmp_path / "jpegs"
    make_pattern_folder(str(folder), 2, 4, 2, 40)

    def epochs(workers: int) -> list:
        cfg = parse_config(
            [
                "--data",
                str(folder),
                "--workers",
                str(workers),
                "--batch-size",
                "2",
                "--image-size",
                "32",
                "--metrics",
                str(tmp_path / "unused.jsonl"),
            ]
        )
        train = build_loaders(cfg, DistInfo(0, 1, 0, 1, torch.device("cpu"))).train
        if workers:
            assert train.loader.persistent_workers
            assert train.loader.multiprocessing_context.get_start_method() == "forkserver"
        seen = []
        for epoch in range(2):
            train.set_epoch(epoch)
            seen.append(torch.cat([images for images, _ in train]))
        return seen

    inline, two_workers = epochs(0), epochs(2)
    assert all(torch.equal(a, b) for a, b in zip(inline, two_workers))
    assert not torch.equal(inline[0], inline[1])  # each epoch its own crops
