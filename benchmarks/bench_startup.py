"""How long each `dlaunch` command takes from a cold process to its exit, on this machine.

    .venv/bin/python benchmarks/bench_startup.py [--runs 9] [--only NAME ...]

Each command runs `--runs` times as a fresh process (the installed `dlaunch` entry point, as a
user types it), output to /dev/null, COLUMNS=80, in a scratch folder holding three finished local
run directories (written by this script, named bench/r0..r2) for `status`, `runs`, `watch` and `logs`.
`--help` of a command measures its start-up alone (import + argument parsing); the others do their
whole (small) job. A command that does not exist in this version is reported as such, not timed.
Python's bytecode cache is on, as for an installed dlaunch (pip compiles it; an editable install
writes it on the first run): $PYTHONDONTWRITEBYTECODE is unset, the cache goes to a scratch folder
($PYTHONPYCACHEPREFIX) and each command runs once untimed first; `--no-bytecode-cache` measures every
run compiling dlaunch's sources instead (a sandbox that sets PYTHONDONTWRITEBYTECODE=1).
Besides wall seconds, the CPU seconds (user + system) the process and its children used: on a shared
machine they vary far less with the load than the wall clock. Prints a table (command, median and min
wall seconds, median CPU seconds) and writes benchmarks/results/bench_startup.json. `--imports LABEL`
instead runs that command once under `python -X importtime` and prints its slowest imports (where its
start-up goes).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchlib import save_results  # noqa: E402

from dlaunch.train.metrics_schema import make_record  # noqa: E402

# (label, argv after `dlaunch`, extra environment)
COMMANDS: List[Tuple[str, List[str], Dict[str, str]]] = [
    ("--help", ["--help"], {}),
    ("run --help", ["run", "--help"], {}),
    ("run juwels 256 nodes --dry-run", ["--site", "juwels", "--nodes", "256", "--framework", "ddp", "--account", "p", "--dry-run"], {}),
    ("sweep juwels 1,2,4 --dry-run", ["sweep", "--site", "juwels", "--nodes", "1,2,4", "--account", "p", "--dry-run"], {}),
    ("sites", ["sites"], {}),
    ("status runs", ["status", "runs"], {}),
    ("runs", ["runs"], {}),
    ("watch --once runs/bench", ["watch", "--once", "runs/bench"], {}),
    ("logs runs/bench/r0", ["logs", "runs/bench/r0"], {}),
    ("predict juwels resnet50", ["predict", "--site", "juwels", "--model", "resnet50", "--gpus", "4,8,16"], {}),
    ("images", ["images"], {}),
    ("report --help", ["report", "--help"], {}),
    ("TAB: dlaunch run --site ju", [], {"_DLAUNCH_COMPLETE": "complete_bash", "COMP_WORDS": "dlaunch run --site ju", "COMP_CWORD": "3"}),
]


def write_runs(folder: str) -> None:
    """Three finished local runs (2 epochs each) under folder/runs/bench."""
    for i in range(3):
        run = os.path.join(folder, "runs", "bench", "r%d" % i)
        os.makedirs(os.path.join(run, "checkpoints"))
        plan = {"plan": {"scheduler": "local", "site": "local", "run_dir": run, "framework": "ddp"}, "request": {}}
        with open(os.path.join(run, "plan.json"), "w") as f:
            json.dump(plan, f)
        for name, text in (("job_id", "local-1\n"), ("state", "finished (exit 0)\n"), ("local.log", "done\n")):
            with open(os.path.join(run, name), "w") as f:
                f.write(text)
        header = make_record("header", 1.0, run_id="r%d" % i, argv=[], config={}, framework="ddp", loader="native",
                             model="resnet50", device="cpu", world_size=2, nodes=1, hosts=["h", "h"],
                             batch_per_worker=4, global_batch=8, lr_scaled=0.1, versions={},
                             loader_settings={"steps_per_epoch": 10, "total_steps": 20}, slurm_job_id=None,
                             site="local", experiment="bench", image=None, git_revision=None)
        records = [header] + [make_record("epoch", 2.0 + e, epoch=e, steps=10, images=80, images_per_s=40.0,
                                          epoch_time_s=2.0, data_wait_s=0.1, loss=2.0, lr=0.1) for e in range(2)]
        records.append(make_record("end", 5.0, status="ok", total_time_s=4.0, epochs_completed=2))
        with open(os.path.join(run, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


def dlaunch_argv() -> List[str]:
    script = os.path.join(os.path.dirname(sys.executable), "dlaunch")
    return [script] if os.path.isfile(script) else [sys.executable, "-m", "dlaunch.cli"]


def command_env(scratch: str, bytecode_cache: bool = True) -> Dict[str, str]:
    """The environment the timed commands run in: COLUMNS=80, and Python's bytecode cache in `scratch`
    (or none: every run compiles dlaunch's sources)."""
    env = dict(os.environ, COLUMNS="80", SBATCH_ACCOUNT="p")
    env.pop("_DLAUNCH_COMPLETE", None)
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(scratch, "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def time_command(argv: List[str], env: Dict[str, str], cwd: str, runs: int,
                 warm_up: bool = True) -> Optional[List[Tuple[float, float]]]:
    """(wall, CPU) seconds of each run, after one untimed run (`warm_up`: it fills the bytecode cache);
    None when this version lacks the command (or completion)."""
    if warm_up:
        subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append((wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime))
        if any(m in done.stderr for m in ("No such command", "No such option", "not supported")):
            return None
        if done.returncode != 0:
            raise SystemExit("%s: exit %d: %s" % (" ".join(argv), done.returncode, done.stderr.strip()[-500:]))
    return times


def print_imports(label: str, env: Dict[str, str], shown: int = 25) -> None:
    """The `shown` imports of command `label` with the largest cumulative time (python -X importtime)."""
    found = [(tail, extra) for name, tail, extra in COMMANDS if name == label]
    if not found:
        raise SystemExit("--imports: %r is none of: %s" % (label, ", ".join(name for name, _, _ in COMMANDS)))
    tail, extra = found[0]
    with tempfile.TemporaryDirectory() as folder:
        write_runs(folder)
        argv = [sys.executable, "-X", "importtime", "-m", "dlaunch.cli"] + tail
        subprocess.run(argv, cwd=folder, env=dict(env, **extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done = subprocess.run(argv, cwd=folder, env=dict(env, **extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            own, total, name = line[len("import time:"):].split("|")
            rows.append((int(total), int(own), name.rstrip()))
    print("| module | cumulative ms | own ms |")
    print("|---|---|---|")
    for total, own, name in sorted(rows, reverse=True)[:shown]:
        print("| %s | %.1f | %.1f |" % (name.strip(), total / 1000, own / 1000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="runs per command (median and min reported)")
    parser.add_argument("--only", nargs="*", help="labels of the commands to time (default: all)")
    parser.add_argument("--imports", metavar="LABEL", help="print the slowest imports of this command instead")
    parser.add_argument("--no-bytecode-cache", action="store_true", help="every run compiles dlaunch's sources")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as folder:
        env = command_env(folder, not args.no_bytecode_cache)
        if args.imports:
            print_imports(args.imports, env)
            return
        write_runs(folder)
        baselines = [("python -c pass", [sys.executable, "-c", "pass"]),
                     ("import dlaunch.cli", [sys.executable, "-c", "import dlaunch.cli"])]
        for label, argv in baselines:
            results.append((label, time_command(argv, env, folder, args.runs)))
        for label, tail, extra in COMMANDS:
            if args.only and label not in args.only:
                continue
            results.append((label, time_command(dlaunch_argv() + tail, dict(env, **extra), folder, args.runs)))
    print("| command | median s | min s | CPU s (median) |")
    print("|---|---|---|---|")
    for label, times in results:
        if times is None:
            print("| %s | (no such command) | | |" % label)
        else:
            walls = [wall for wall, _ in times]
            print("| %s | %.3f | %.3f | %.3f |" % (label, statistics.median(walls), min(walls),
                                                   statistics.median(cpu for _, cpu in times)))
    path = save_results("bench_startup", {
        "runs": args.runs, "python": sys.version.split()[0], "bytecode_cache": not args.no_bytecode_cache,
        "commands": {label: (None if t is None else {
            "median_s": statistics.median(w for w, _ in t), "min_s": min(w for w, _ in t),
            "cpu_median_s": statistics.median(c for _, c in t)}) for label, t in results},
    })
    print("\nwritten: %s" % os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
