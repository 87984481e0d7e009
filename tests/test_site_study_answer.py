"""`study check` and `study run` give one answer for a site and an image stack (issue 46): LUMI-G (AMD GPUs) with
the NVIDIA study aach2023. With the study's own stack (the paper's CUDA build) no job can run, and both say the
fix is `--stack site`; with the site's stack the jobs of the native loader run and DALI's (NVIDIA-only) do not,
and `study run --only loader=native` renders exactly the jobs `study check` passes.

Before, `study check --site lumi-g` refused every job for the study's GPU vendor even with `--stack site`, while
`study run --stack site --only loader=native` rendered 144 jobs, and `study run` without `--stack` advised setting
the profile's `[container] stack`, which lumi-g already sets."""
import re

from test_study import STUDIES, dlaunch

AACH = STUDIES / "aach2023.toml"


def test_the_studys_own_stack_on_an_amd_site_is_refused_the_same_way_by_check_and_run(tmp_path):
    check = dlaunch(tmp_path, "study", "check", AACH, "--site", "lumi-g")
    run = dlaunch(tmp_path, "study", "run", AACH, "--site", "lumi-g", "--dry-run")
    why = "site lumi-g has amd GPUs, and image stack 'paper' is a CUDA build (--stack site renders it with the site's own"
    assert check.returncode == 1 and "lumi-g: no job can run there" in check.stdout and why in check.stdout
    assert run.returncode == 2 and "--stack: " + why in run.stderr and "[container] stack" not in run.stderr


def test_the_sites_own_stack_runs_the_jobs_check_passes_and_refuses_the_ones_it_names(tmp_path):
    check = dlaunch(tmp_path, "study", "check", AACH, "--site", "lumi-g", "--stack", "site")
    counts = re.search(r"lumi-g: (\d+) of (\d+) jobs cannot run there", check.stdout)
    assert check.returncode == 1 and counts, check.stdout + check.stderr
    refused, total = int(counts.group(1)), int(counts.group(2))
    reasons = [line for line in check.stdout.splitlines() if line.startswith("lumi-g: ") and "cannot run" not in line]
    assert reasons == ["lumi-g: --loader dali: site lumi-g has AMD GPUs, and NVIDIA DALI runs only on NVIDIA GPUs; "
                       "use --loader native"]
    native = dlaunch(tmp_path, "study", "run", AACH, "--site", "lumi-g", "--stack", "site", "--only", "loader=native",
                     "--dry-run")
    assert native.returncode == 0 and re.search(r"^%d jobs$" % (total - refused), native.stderr, re.M), native.stderr
    everything = dlaunch(tmp_path, "study", "run", AACH, "--site", "lumi-g", "--stack", "site", "--dry-run")
    assert everything.returncode == 2 and reasons[0][len("lumi-g: "):] in everything.stderr
