"""A user's first day at the command line (issue 37): tables that fit 80 columns, help that cuts no word,
errors that point the right way, dry runs that are clean scripts. Commands run as real processes where
the terminal's width or a pipe matters (COLUMNS=80, stdout a pipe)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def dlaunch(*argv: str, cwd: Path, columns: int = 80, **env: str) -> subprocess.CompletedProcess:
    """`dlaunch ARGV` as a process whose stdout is a pipe, laid out for `columns`."""
    return subprocess.run([sys.executable, "-m", "dlaunch.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS=str(columns), **env), timeout=300)


def fits(text: str, columns: int = 80) -> bool:
    return "…" not in text and max(len(line) for line in text.splitlines()) <= columns


# -- tables at 80 columns ------------------------------------------------------------------------------
def test_sites_at_80_columns_show_names_aliases_scheduler_and_gpus_per_node(tmp_path):
    """What a user picks a site by stays (so `juwels` appears); the many-line description and the absolute
    path give way, and the caption says so."""
    listed = dlaunch("sites", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert fits(listed.stdout)
    lines = listed.stdout.splitlines()
    assert lines[1].split() == ["name", "aliases", "scheduler", "GPUs", "per", "node", "container"]
    row = next(line.split() for line in lines if line.startswith("juwels-booster "))
    assert row == ["juwels-booster", "juwels,", "jwb", "slurm", "4", "apptainer"]
    assert lines[-1] == "left out at 80 columns: description, file"
    assert str(REPO / "sites") not in listed.stdout and "InfiniBand" not in listed.stdout
    wide = dlaunch("sites", cwd=tmp_path, columns=300)
    assert str(REPO / "sites" / "juwels-booster.toml") in wide.stdout.split() and "left out" not in wide.stdout


def test_images_at_80_columns_keep_built(tmp_path):
    """`dlaunch images` exists to say which images are built: that column stays; the pins give way (one
    site's images, `--site`, have room for them)."""
    listed = dlaunch("images", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert fits(listed.stdout)
    lines = listed.stdout.splitlines()
    assert lines[1].split() == ["image", "sites", "built"]
    assert next(line for line in lines if line.startswith("current-ddp-x86_64 ")).split()[-1] == "missing"
    assert "left out at 80 columns: pins from, pins" in lines
    one_site = dlaunch("images", "--site", "juwels", cwd=tmp_path)
    assert fits(one_site.stdout) and one_site.stdout.splitlines()[1].split() == ["image", "sites", "built", "pins"]
