#!/usr/bin/env python3
"""Capture what every `dlaunch` command prints, for a byte-for-byte comparison before and after a change
that must not change output (a refactoring): `scripts/golden_outputs.py RUNS OUT` writes one file per
command under OUT (its stdout, its stderr and its exit code); `diff -r OUT_BEFORE OUT_AFTER` shows what
changed. RUNS is a folder of finished runs made once (e.g. `dlaunch study run smoke --site local -o RUNS`)
and read, never changed (each command works on a copy). The run's git revision the copy's path and the checkout's
are replaced by fixed words, so that only the output's own changes remain (tables holding the checkout's path, `sites`, keep its
length: compare captures made from checkouts at paths of one length).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SITES = ["alps", "frontier", "generic-slurm", "jupiter", "jureca-dc", "juwels-booster", "juwels-cluster",
         "leonardo-booster", "local", "lumi-g", "perlmutter", "polaris"]
FRAMEWORKS = ["ddp", "horovod", "deepspeed"]
HELP = [[], ["run"], ["sweep"], ["status"], ["runs"], ["watch"], ["logs"], ["cancel"], ["sites"], ["sites", "show"],
        ["sites", "check"], ["sites", "migrate"], ["images"], ["doctor"], ["report"], ["predict"], ["rerun"],
        ["archive"], ["study"], ["study", "run"], ["study", "check"], ["study", "status"], ["study", "report"],
        ["results"], ["results", "compare"], ["results", "rebuild"]]
GPUS = "4,8,16,32,64,128,256,512,1024"


def commands(runs: str) -> list:
    """(name, argv) of every command captured; `runs` is the copy's folder of finished runs."""
    found = []
    for words in HELP:
        found.append(("help-" + ("-".join(words) or "top"), words + ["--help"]))
    found += [("version", ["--version"]), ("sites", ["sites"]), ("sites-json", ["sites", "--json"]),
              ("sites-show", ["sites", "show", "juwels-booster"]), ("images", ["images"]),
              ("images-json", ["images", "--json"]), ("doctor-local", ["doctor", "--site", "local"])]
    for site in SITES:
        for framework in FRAMEWORKS:
            found.append(("dry-%s-%s" % (site, framework),
                          ["run", "--site", site, "--nodes", "1" if site == "local" else "2", "--framework", framework,
                           "--dry-run", "--run-name", "golden", "--account", "acct"]))
    found += [
        ("sweep-dry", ["sweep", "--site", "juwels-booster", "--nodes", "1,2,4", "--framework", "ddp", "--dry-run",
                       "--account", "acct"]),
        ("repeat-dry", ["run", "--site", "juwels-booster", "--nodes", "2", "--repeat", "3", "--dry-run",
                        "--run-name", "golden", "--account", "acct"]),
        ("study-aach-list", ["study", "run", "aach2023", "--site", "juwels-booster", "--list"]),
        ("study-aach-list-json", ["study", "run", "aach2023", "--site", "juwels-booster", "--list", "--json"]),
        ("study-smoke-dry", ["study", "run", "smoke", "--site", "local", "--dry-run"]),
        ("study-check-smoke", ["study", "check", "smoke"]),
        ("study-check-aach-juwels", ["study", "check", "aach2023", "--site", "juwels-booster"]),
        ("predict", ["predict", "--site", "juwels-booster", "--model", "resnet50", "--gpus", GPUS]),
        ("predict-dali", ["predict", "--site", "juwels-booster", "--model", "resnet50", "--gpus", GPUS,
                          "--calibrated", "dali"]),
        ("predict-json", ["predict", "--site", "juwels-booster", "--model", "resnet152", "--gpus", GPUS, "--json"]),
        ("status", ["status", runs]), ("status-json", ["status", runs, "--json"]), ("runs", ["runs", runs]),
        ("watch-once", ["watch", runs, "--once"]),
        ("report", ["report", runs, "--output", "report-out"]),
        ("results", ["results"]), ("results-json", ["results", "--json"]),
        ("study-status", ["study", "status", runs]),
        ("err-site", ["run", "--site", "nosuch", "--dry-run"]),
        ("err-nodes", ["run", "--site", "juwels-booster", "--nodes", "0", "--dry-run"]),
        ("err-report", ["report", "/nonexistent-folder"]),
        ("err-flag", ["run", "--site", "local", "--batch-size", "-3", "--dry-run"]),
        ("err-status-empty-json", ["status", "empty-folder", "--json"]),
    ]
    return found


def normalise(text: str, work: str, repo: str) -> str:
    text = text.replace(work, "WORK").replace(repo, "REPO")
    text = re.sub(r"\b[0-9a-f]{40}\b", "GITREV40", text)
    text = re.sub(r"\b[0-9a-f]{12}\b", "GITREV12", text)
    text = re.sub(r"\b\d{8}-\d{6}-\d{3}-[0-9a-f]{4}\b", "RUNSTAMP", text)  # default run and sweep names
    text = re.sub(r"(?m)^\d\d:\d\d:\d\d ", "HH:MM:SS ", text)  # watch's plain lines
    return text


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    source, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[1]
    dlaunch = [sys.executable, "-m", "dlaunch.cli"]
    for name, argv in commands("runs-copy"):
        with tempfile.TemporaryDirectory(prefix="golden-") as work:
            shutil.copytree(source, Path(work) / "runs-copy", symlinks=True)
            (Path(work) / "empty-folder").mkdir()
            env = dict(os.environ, COLUMNS="100", PYTHONPATH=str(repo), DLAUNCH_RESULTS_DB=str(Path(work) / "r.sqlite"),
                       NO_COLOR="1", TERM="dumb")
            env.pop("SBATCH_ACCOUNT", None)
            done = subprocess.run(dlaunch + argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
            text = "$ dlaunch %s\n-- exit %d\n-- stdout\n%s-- stderr\n%s" % (" ".join(argv), done.returncode,
                                                                           done.stdout, done.stderr)
            report = Path(work) / "report-out" / "report.md"
            if report.exists():
                text += "-- report.md\n" + report.read_text(encoding="utf-8")
            (out / (name + ".txt")).write_text(normalise(text, work, str(repo)), encoding="utf-8")
        print(name, done.returncode, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
