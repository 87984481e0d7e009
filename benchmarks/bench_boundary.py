"""Reading hostile run files: wall time and peak memory of `dlaunch status` on a run whose log is
300 MB (a sparse file: no disk used) and of `dlaunch report` on 200 runs of which one is broken,
each in a fresh interpreter, for the checkout on PYTHONPATH (compare main with a branch).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_boundary.py
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hostile import jsonl, metrics_records, plan_file  # noqa: E402  (the run files the tests corrupt)

LOG_MB = 300
RUNS = 200


def write_run(root: Path, name: str, metrics: bytes) -> Path:
    run = root / "runs" / "exp" / name
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps(plan_file(run)))
    (run / "state").write_text("finished (exit 1)\n")
    (run / "metrics.jsonl").write_bytes(metrics)
    return run


def measure(argv, cwd: Path):
    """(seconds, peak resident MB, exit code) of `dlaunch ARGV` in a fresh interpreter (GNU time's %M)."""
    started = time.monotonic()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "dlaunch.cli", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, COLUMNS="100", MPLBACKEND="Agg"))
    seconds = time.monotonic() - started
    peak_kb = int(done.stderr.strip().splitlines()[-1])
    return seconds, peak_kb / 1024, done.returncode


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "log"
        run = write_run(root, "r1", jsonl(metrics_records()[:3]).encode())
        with open(run / "local.log", "wb") as log:
            log.truncate(LOG_MB * 2 ** 20)
            log.seek(0, os.SEEK_END)
            log.write(b"\ntrain: error: --data /x: no such directory\n")
        rows.append(("status, one run with a %d MB log" % LOG_MB,) + measure(["status", "runs"], root))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "report"
        good = jsonl(metrics_records()).encode()
        for i in range(RUNS - 1):
            write_run(root, "r%03d" % i, good)
        records = metrics_records()
        records[1] = dict(records[1], images_per_s=float("nan"))
        write_run(root, "bad", jsonl(records).encode())
        rows.append(("report, %d runs, one with NaN images/s" % RUNS,) + measure(["report", "runs", "-o", "out"], root))
    print("%-45s %8s %9s %5s" % ("case", "seconds", "peak MB", "exit"))
    for case, seconds, peak, code in rows:
        print("%-45s %8.2f %9.0f %5d" % (case, seconds, peak, code))


if __name__ == "__main__":
    main()
