"""How long `dlaunch report` takes over archives of many finished runs, and which of its stages grows.

    .venv/bin/python benchmarks/bench_report.py [--runs 400,2000,5000] [--per-group 5] [--repeats 3]
                                                [--source RUN_DIR] [--keep DIR]

The archives are benchmarks/bench_status.py's (copies of one real finished run, `--per-group` runs per
experiment at GPU counts 1, 2, 4, ...; `--source`, else a tiny 2-process local run made first). Each
`dlaunch report` runs as a fresh process (the `dlaunch` entry point, COLUMNS=80, output to /dev/null)
with its own empty results database: the first records every run ("cold"), the next find them
recorded ("warm", the usual case). Then one warm report runs in this process with its stages timed
(the functions that api.report and dlaunch/cli/report.py's printing call, wrapped with a timer where they are called), so that
a stage that grows faster than the runs shows. Prints both tables (seconds per 1,000 runs in the last
column) and writes benchmarks/results/bench_report.json.
"""
import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_status import dlaunch_argv, make_source, time_command, write_archive  # noqa: E402
from benchlib import save_results  # noqa: E402

# report_command's stages: (the module that looks each up at call time, its name there).
STAGES = (("dlaunch.analysis.scaling", "load_runs"), ("dlaunch.reporting.report", "load_profiles"),
          ("dlaunch.reporting.report", "off_network"), ("dlaunch.reporting.report", "flagged"),
          ("dlaunch.reporting.report", "build_results"), ("dlaunch.reporting.report", "record_runs"),
          ("dlaunch.api.reports", "_report_tables"), ("dlaunch.cli.report", "print_table"), ("dlaunch.reporting.document", "write_plots"),
          ("dlaunch.reporting.document", "markdown_report"), ("dlaunch.reporting.document", "write_page"))


def timed_report(archive: str, out: str, env: Dict[str, str]) -> Dict[str, float]:
    """Seconds per stage of one `report` over `archive`, run in this process (console output discarded)."""
    import importlib

    import dlaunch.cli.report as report

    spent: Dict[str, float] = {}

    def timer(name, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
        return timed

    originals = {(module, name): getattr(importlib.import_module(module), name) for module, name in STAGES}
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        for (module, name), function in originals.items():
            setattr(importlib.import_module(module), name, timer(name, function))
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            report.report_command([Path(archive)], output=Path(out))
        spent["all"] = time.perf_counter() - start
    finally:
        for (module, name), function in originals.items():
            setattr(importlib.import_module(module), name, function)
        os.environ.clear()
        os.environ.update(saved)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="400,2000,5000", help="archive sizes, comma-separated (default 400,2000,5000)")
    parser.add_argument("--per-group", type=int, default=5, help="runs per experiment (GPU counts 1, 2, 4, ...)")
    parser.add_argument("--repeats", type=int, default=3, help="timed warm reports per size (median and min)")
    parser.add_argument("--source", help="a finished run directory to copy (default: a tiny local run made first)")
    parser.add_argument("--keep", help="write the archives here and keep them (default: a temporary folder)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.runs.split(",")]
    commands: List[Tuple[int, str, List[float]]] = []
    stages: List[Tuple[int, Dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        source = os.path.abspath(args.source) if args.source else make_source(scratch)
        base = os.path.abspath(args.keep) if args.keep else scratch
        for size in sizes:
            archive = os.path.join(base, "archive-%d" % size)
            if not os.path.isdir(archive):
                write_archive(source, archive, size, args.per_group)
            work = tempfile.mkdtemp(dir=scratch)
            env = dict(os.environ, COLUMNS="80", DLAUNCH_RESULTS_DB=os.path.join(work, "results.sqlite"))
            argv = dlaunch_argv() + ["report", archive, "--output", os.path.join(work, "report")]
            commands.append((size, "report (cold database)", [time_command(argv, env, work)]))
            commands.append((size, "report", [time_command(argv, env, work) for _ in range(args.repeats)]))
            stages.append((size, timed_report(archive, os.path.join(work, "report"), env)))
            for _, label, times in commands[-2:]:
                print("%d runs: %s: %s" % (size, label, " ".join("%.2f" % t for t in times)), file=sys.stderr, flush=True)
    print("| runs | groups | command | median s | min s | s per 1,000 runs |")
    print("|---|---|---|---|---|---|")
    for size, label, times in commands:
        print("| %d | %d | %s | %.2f | %.2f | %.2f |" % (size, -(-size // args.per_group), label, statistics.median(times),
                                                         min(times), statistics.median(times) / size * 1000))
    print("\n| stage (in process, warm) | %s |" % " | ".join("%d runs" % size for size, _ in stages))
    print("|---|" + "---|" * len(stages))
    for name in (*(name for _, name in STAGES), "all"):
        print("| %s | %s |" % (name, " | ".join("%.2f" % spent.get(name, 0.0) for _, spent in stages)))
    path = save_results("bench_report", {
        "per_group": args.per_group, "repeats": args.repeats, "python": sys.version.split()[0],
        "commands": [{"runs": size, "command": label, "seconds": times} for size, label, times in commands],
        "stages": [{"runs": size, "seconds": spent} for size, spent in stages]})
    print("\nwritten: %s" % os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
