"""How long `dlaunch status` and `dlaunch report` take over an archive of many finished runs.

    .venv/bin/python benchmarks/bench_status.py [--runs 400,2000,5000] [--per-group 5] [--repeats 3]
                                                [--source RUN_DIR] [--no-report] [--keep DIR]

The archive holds copies of one real finished run directory (`--source`, else a tiny 2-process
`dlaunch run --site local` made here first): every file but the checkpoint, each copy's metrics header
and plan.json given its own experiment (one per group of `--per-group` runs), GPU count (1, 2, 4, ...
within the group) and run directory, its images/s scaled with the GPU count so that the groups scale.
Each command runs as a fresh process (the `dlaunch` entry point, output to /dev/null, in the environment
of benchmarks/bench_startup.py: COLUMNS=80, Python's bytecode cache on) with its own empty results database
($DLAUNCH_RESULTS_DB) and so its own status cache beside it (dlaunch/runs/statuscache.py): the first
`status` reads every run and records it in both ("first"), the next ones find them there (the usual case:
runs end once, and are listed many times). Prints a table (runs, groups, command, median and min wall
seconds, median CPU seconds, wall seconds per 1,000 runs) and writes benchmarks/results/bench_status.json.
`--stages` adds where a warm `status` spends its time, measured in this process: finding the run
directories, checking them (with reading the status cache), the run service's snapshots, and the whole
of the status table (dlaunch.api.status, which does those again and records the ended runs, then
dlaunch/cli/terminal.py's show_status printing the table and the notes below it).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench_startup import command_env, dlaunch_argv, time_command as timed_runs  # noqa: E402
from benchlib import save_results  # noqa: E402

TINY_RUN = ["run", "--site", "local", "--gpus", "2", "--steps", "6", "--steps-per-epoch", "2", "--warmup-steps", "1",
            "--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--threads", "1", "--device", "cpu",
            "--data", "synthetic", "--experiment", "source", "--run-name", "r"]


def make_source(folder: str) -> str:
    """A real finished run: a tiny 2-process local run made in `folder`."""
    done = subprocess.run(dlaunch_argv() + TINY_RUN, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("the source run failed: %s" % (done.stdout + done.stderr)[-2000:])
    return os.path.join(folder, "runs", "source", "r")


def _copy_metrics(text: str, experiment: str, gpus: int, run_dir: str) -> str:
    """The source's records with this copy's experiment, GPU count, run directory and images/s."""
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    header = records[0]
    scale = gpus / header["world_size"]
    factor = scale * 0.9 ** (gpus.bit_length() - 1)  # some loss of efficiency per doubling
    header.update(experiment=experiment, world_size=gpus, hosts=[header["hosts"][0]] * gpus,
                  global_batch=header["batch_per_worker"] * gpus, run_id=os.path.basename(run_dir))
    header["config"]["experiment"] = experiment
    if isinstance(header.get("request"), dict):
        header["request"]["world_size"] = gpus
    for record in records[1:]:
        if record["type"] == "epoch":
            record["images_per_s"] *= factor
            record["images"] = round(record["images"] * scale)
    return "".join(json.dumps(r) + "\n" for r in records)


def _copy_plan(text: str, experiment: str, gpus: int, run_dir: str) -> str:
    data = json.loads(text)
    data["plan"]["run_dir"] = run_dir
    data["plan"]["nproc_per_node"] = gpus
    data["plan"]["env"] = [[k, {"DLAUNCH_EXPERIMENT": experiment, "DLAUNCH_RUN_DIR": run_dir}.get(k, v)]
                           for k, v in data["plan"].get("env", [])]
    data["request"].update(experiment=experiment, gpus=gpus, run_name=os.path.basename(run_dir))
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_archive(source: str, folder: str, runs: int, per_group: int) -> None:
    """`runs` copies of `source` under folder/exp-NNNNN/gGGGG, `per_group` GPU counts per experiment."""
    names = sorted(n for n in os.listdir(source) if os.path.isfile(os.path.join(source, n)))
    texts = {}
    for name in names:
        with open(os.path.join(source, name), encoding="utf-8") as f:
            texts[name] = f.read()
    for i in range(runs):
        experiment = "exp-%05d" % (i // per_group)
        gpus = 2 ** (i % per_group)
        run_dir = os.path.join(folder, experiment, "g%04d" % gpus)
        os.makedirs(os.path.join(run_dir, "checkpoints"))
        for name in names:
            text = texts[name]
            if name == "metrics.jsonl":
                text = _copy_metrics(text, experiment, gpus, run_dir)
            elif name == "plan.json":
                text = _copy_plan(text, experiment, gpus, run_dir)
            with open(os.path.join(run_dir, name), "w", encoding="utf-8") as f:
                f.write(text)
            shutil.copystat(os.path.join(source, name), os.path.join(run_dir, name))


def time_command(argv: List[str], env: Dict[str, str], cwd: str) -> float:
    """Wall seconds of one run of `argv` (benchmarks/bench_report.py times `report` with it)."""
    ((wall, _),) = timed_runs(argv, env, cwd, 1, warm_up=False)
    return wall


def measure(archive: str, scratch: str, repeats: int, report: bool, env: Dict[str, str]) -> List[Tuple[str, List[Tuple[float, float]]]]:
    """(label, (wall, CPU) seconds of each run) of status (first, then again) and report over `archive`."""
    env = dict(env, DLAUNCH_RESULTS_DB=os.path.join(scratch, "results.sqlite"))
    status = dlaunch_argv() + ["status", archive]
    results = [("status, first (reads every run)", timed_runs(status, env, scratch, 1, warm_up=False)),
               ("status", timed_runs(status, env, scratch, repeats, warm_up=False))]
    if report:
        argv = dlaunch_argv() + ["report", archive, "--output", os.path.join(scratch, "report")]
        results.append(("report", timed_runs(argv, env, scratch, repeats, warm_up=False)))
    return results


def stages(archive: str, database: str) -> List[Tuple[str, float]]:
    """Seconds of each stage of a warm `status` over `archive` (its results database and cache filled)."""
    os.environ["DLAUNCH_RESULTS_DB"] = database
    from pathlib import Path

    import dlaunch.cli.terminal
    from dlaunch import api
    from dlaunch.runs import service
    from dlaunch.runs.rundir import find_runs, readable

    found: List[Tuple[str, float]] = []

    def timed(label: str, work):
        start = time.perf_counter()
        result = work()
        found.append((label, time.perf_counter() - start))
        return result

    runs = timed("find_runs", lambda: find_runs([Path(archive)]))
    kept, _ = timed("readable (with the status cache's file)", lambda: readable(runs))
    snapshots = timed("service.observe", lambda: service.observe(kept))
    timed("why_failed + run_figures", lambda: [(service.why_failed(s) if s.failed else "", service.run_figures(s))
                                              for s in snapshots])
    with open(os.devnull, "w") as devnull:
        dlaunch.cli.terminal.out.file = devnull
        dlaunch.cli.terminal.out.width = 80
        timed("terminal.show_status (all of the above again, the table, the notes, the database)",
              lambda: dlaunch.cli.terminal.show_status(api.status([archive])))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="400,2000,5000", help="archive sizes, comma-separated (default 400,2000,5000)")
    parser.add_argument("--per-group", type=int, default=5, help="runs per experiment (GPU counts 1, 2, 4, ...)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each warm command (median and min)")
    parser.add_argument("--source", help="a finished run directory to copy (default: a tiny local run made first)")
    parser.add_argument("--no-report", action="store_true", help="time status only")
    parser.add_argument("--keep", help="write the archives here and keep them (default: a temporary folder)")
    parser.add_argument("--stages", action="store_true", help="also time the stages of a warm status, in process")
    args = parser.parse_args()
    sizes = [int(n) for n in args.runs.split(",")]
    rows = []
    staged: List[Tuple[int, List[Tuple[str, float]]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        env = command_env(scratch)
        source = os.path.abspath(args.source) if args.source else make_source(scratch)
        base = os.path.abspath(args.keep) if args.keep else scratch
        for size in sizes:
            archive = os.path.join(base, "archive-%d" % size)
            if not os.path.isdir(archive):
                write_archive(source, archive, size, args.per_group)
            work = tempfile.mkdtemp(dir=scratch)
            for label, times in measure(archive, work, args.repeats, not args.no_report, env):
                rows.append((size, -(-size // args.per_group), label, times))
                print("%d runs: %s: %s" % (size, label, " ".join("%.2f" % wall for wall, _ in times)), file=sys.stderr, flush=True)
            if args.stages:
                staged.append((size, stages(archive, os.path.join(work, "results.sqlite"))))
    print("| runs | groups | command | median s | min s | CPU s (median) | s per 1,000 runs |")
    print("|---|---|---|---|---|---|---|")
    for size, groups, label, times in rows:
        walls = [wall for wall, _ in times]
        print("| %d | %d | %s | %.2f | %.2f | %.2f | %.2f |" % (size, groups, label, statistics.median(walls), min(walls),
                                                              statistics.median(cpu for _, cpu in times),
                                                              statistics.median(walls) / size * 1000))
    if staged:
        print("\n| stage of a warm status, s | %s |" % " | ".join("%d runs" % size for size, _ in staged))
        print("|---|%s" % ("---|" * len(staged)))
        for i, (label, _) in enumerate(staged[0][1]):
            print("| %s | %s |" % (label, " | ".join("%.3f" % found[i][1] for _, found in staged)))
    path = save_results("bench_status", {
        "per_group": args.per_group, "repeats": args.repeats, "python": sys.version.split()[0],
        "results": [{"runs": size, "groups": groups, "command": label, "wall_s": [w for w, _ in times],
                     "cpu_s": [c for _, c in times]} for size, groups, label, times in rows],
        "stages": [{"runs": size, "seconds": dict(found)} for size, found in staged],
    })
    print("\nwritten: %s" % os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
