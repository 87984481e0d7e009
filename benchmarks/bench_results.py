"""What the results database costs: recording N ended runs (as `dlaunch status` does after its table),
recording them again unchanged (every later `status`), listing them with S_G, E_G and history
verdicts, comparing two experiments, and one exact Mann-Whitney p-value of 20 against 20 runs.

    python benchmarks/bench_results.py [N ...]     (default 100 1000)

Prints one table row per N: seconds per step, on hand-written metrics files of 3 epochs each.
"""
import json
import sys
import tempfile
import time
from pathlib import Path

from dlaunch.resultsdb.compare import compare, mann_whitney, with_history, with_scaling
from dlaunch.resultsdb.store import ResultsDB, record
from dlaunch.train.metrics_schema import make_record


def write_runs(root: Path, n: int) -> list:
    """`n` runs in two experiments, 1-8 GPUs, 3 epochs each."""
    paths = []
    for i in range(n):
        gpus = 2 ** (i % 4)
        experiment = "exp-%d" % (i % 2)
        header = make_record("header", 1000.0 + i, run_id="r%05d" % i, argv=["python", "-m", "dlaunch.train"],
                             config={"schedule": "step", "amp": "none"}, framework="ddp", loader="native",
                             model="resnet50", device="cuda", world_size=gpus, nodes=1, hosts=["n0"] * gpus,
                             batch_per_worker=64, global_batch=64 * gpus, lr_scaled=0.1, versions={"torch": "2.14.1"},
                             slurm_job_id=str(i), site="juwels-booster", experiment=experiment, image=None,
                             git_revision=None)
        records = [header] + [make_record("epoch", 1001.0 + i + e, epoch=e, steps=100, images=6400 * gpus,
                                          images_per_s=800.0 * gpus + i % 7, epoch_time_s=8.0, data_wait_s=0.1,
                                          loss=1.0, lr=0.1) for e in range(3)]
        records.append(make_record("end", 1010.0 + i, status="ok", total_time_s=30.0, epochs_completed=3))
        path = root / experiment / ("r%05d" % i) / "metrics.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        paths.append(path)
    return paths


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main(counts) -> None:
    print("| runs | record new s | record unchanged s | list (S_G, E_G, history) s | compare s |")
    print("|---|---|---|---|---|")
    for n in counts:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "results.sqlite"
            paths = write_runs(Path(tmp) / "runs", n)
            new = timed(lambda: record(paths, db))
            again = timed(lambda: record(paths, db))

            def listing():
                with ResultsDB(db) as store:
                    rows = with_scaling(store.rows())
                with_history(rows, rows)

            def comparing():
                with ResultsDB(db) as store:
                    compare(store.rows(), "exp-0", "exp-1", "images_per_s")

            print("| %d | %.2f | %.2f | %.2f | %.2f |" % (n, new, again, timed(listing), timed(comparing)))
    a, b = [100.0 + i for i in range(20)], [110.5 + i for i in range(20)]
    print("\nexact Mann-Whitney p of 20 against 20 runs: %.3f s" % timed(lambda: mann_whitney(a, b)))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100, 1000])
