"""A loader worker that needs a lock the trainer's other thread holds while the workers start (issue 44 item 4).

`python tests/loader_lock_probe.py fork|trainer`: a thread of this process takes LOCK, the DataLoader starts its worker
(with the start method `fork`, or with the trainer's own `worker_options`), the thread lets LOCK go, and the worker
reports whether it found LOCK free: a worker forked while the thread held it has a copy that stays held for ever,
whatever happens in this process afterwards (the state is forced, no timing involved). Prints one JSON line. LOCK
stands for any lock a worker needs: a logging handler's, sys.stderr's buffer, a module being imported.
`python tests/loader_lock_probe.py trainer-dies`: the trainer's workers started, then this process ends abruptly."""
import json
import sys
import threading

import torch
from torch.utils.data import DataLoader, Dataset

LOCK = threading.Lock()


class NeedsTheLock(Dataset):
    """Item i: whether the worker could take LOCK at once (True), or found it held (False)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        free = LOCK.acquire(blocking=False)
        if free:
            LOCK.release()
        return torch.tensor(free)


def die_with_workers_running() -> None:
    """A trainer that dies abruptly (the watchdog's os._exit on a hang, as SIGKILL would): its worker running, its
    loader never shut down. Prints the worker's and the fork server's pids first."""
    import os
    from multiprocessing import forkserver

    from dlaunch.train.data.folder import worker_options

    loader = DataLoader(NeedsTheLock(), batch_size=2, **worker_options(1))
    batches = iter(loader)
    next(batches)
    pids = [w.pid for w in batches._workers] + [forkserver._forkserver._forkserver_pid]
    print(json.dumps({"pids": pids}), flush=True)
    os._exit(69)


def main(way: str) -> None:
    from dlaunch.train.data.folder import worker_options

    if way == "trainer-dies":
        die_with_workers_running()

    options = {"num_workers": 1, "multiprocessing_context": "fork"} if way == "fork" else worker_options(1)
    loader = DataLoader(NeedsTheLock(), batch_size=2, **options)
    taken, workers_started = threading.Event(), threading.Event()

    def hold_the_lock() -> None:  # a trainer thread (the watchdog's heartbeat, say) inside its lock
        with LOCK:
            taken.set()
            workers_started.wait()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    taken.wait()
    batches = iter(loader)  # the worker process starts now, while the thread holds LOCK
    workers_started.set()
    holder.join()
    print(json.dumps({"way": way, "worker_found_the_lock_free": next(batches).tolist(),
                      "start_method": loader.multiprocessing_context.get_start_method()}))


if __name__ == "__main__":
    main(sys.argv[1])
