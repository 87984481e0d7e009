"""`dlaunch archive`: an experiment bundled with a sha256 manifest; `dlaunch rerun` reads a run inside it."""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from test_analysis import write_run

REPO = Path(__file__).resolve().parents[1]
DLAUNCH = ("import sys; from dlaunch.cli import app, main; from dlaunch.cli.rerun import rerun_command; "
           "from dlaunch.cli.archive import archive_command; app.command('rerun')(rerun_command); "
           "app.command('archive')(archive_command); sys.exit(main(sys.argv[1:]))")


def dlaunch(cwd: Path, *args: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SBATCH_ACCOUNT"}
    env.update(PYTHONPATH=str(REPO), COLUMNS="200")
    return subprocess.run([sys.executable, "-c", DLAUNCH, *(str(a) for a in args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def experiment(tmp_path: Path) -> Path:
    """An experiment of two runs of site `local` (metrics written by the test, plan.json, the profile the
    job was made from and a log too)."""
    for name, gpus in (("g1", 1), ("g2", 2)):
        run = write_run(tmp_path / "runs", name, gpus, [10.0, 20.0], site="local", experiment="exp").parent
        run.joinpath("plan.json").write_text(json.dumps({"plan": {"site": "local", "scheduler": "local"},
                                                         "request": {"site": "local"}}))
        run.joinpath("local.log").write_text("log of %s\n" % name)
        run.joinpath("site.toml").write_text((REPO / "sites" / "local.toml").read_text())
        run.joinpath("checkpoints").mkdir()
        run.joinpath("checkpoints", "checkpoint.pt").write_bytes(b"\0" * 1000)
    return tmp_path / "runs" / "exp"


def test_archive_holds_every_file_but_checkpoints_with_the_runs_profiles_and_a_manifest_of_hashes(tmp_path):
    folder = experiment(tmp_path)
    result = dlaunch(tmp_path, "archive", folder, "-o", tmp_path / "exp.tar.gz")
    assert result.returncode == 0, result.stderr
    with tarfile.open(tmp_path / "exp.tar.gz") as tar:
        names = sorted(tar.getnames())
        manifest = json.load(tar.extractfile("exp/manifest.json"))["files"]
        for name, entry in manifest.items():
            data = tar.extractfile(name).read()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
    assert names == sorted(["exp/manifest.json"] + ["exp/%s/%s" % (run, f) for run in ("g1", "g2")
                                                    for f in ("local.log", "metrics.jsonl", "plan.json", "site.toml")])
    assert set(manifest) == set(names) - {"exp/manifest.json"}
    assert (tmp_path / "runs" / "exp" / "g1" / "checkpoints" / "checkpoint.pt").exists()  # left where it was


def test_rerun_reads_a_run_inside_an_archive_and_checks_its_hash(tmp_path):
    folder = experiment(tmp_path)
    assert dlaunch(tmp_path, "archive", folder, "-o", "exp.tar.gz").returncode == 0
    result = dlaunch(tmp_path, "rerun", "exp.tar.gz:exp/g2", "--site", "jureca-dc", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --nodes=1" in result.stdout and "--nproc_per_node=2" in result.stdout
    assert "exp.tar.gz:exp/g2 on jureca-dc" in result.stderr  # the differences: the script alone is on stdout
    missing = dlaunch(tmp_path, "rerun", "exp.tar.gz:exp/g9", "--site", "jureca-dc", "--dry-run")
    assert missing.returncode == 2 and "no run exp/g9 (runs: exp/g1, exp/g2)" in missing.stderr
    unnamed = dlaunch(tmp_path, "rerun", "exp.tar.gz", "--site", "jureca-dc", "--dry-run")
    assert unnamed.returncode == 2 and unnamed.stderr == (
        "dlaunch: error: exp.tar.gz: an archive: name the run in it, as exp.tar.gz:EXPERIMENT/RUN (its runs: exp/g1, exp/g2)\n")
    # a bundle whose metrics were changed after archiving is refused
    with tarfile.open(tmp_path / "exp.tar.gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    files["exp/g2/metrics.jsonl"] = files["exp/g2/metrics.jsonl"].replace(b"20.0", b"99.0")
    with tarfile.open(tmp_path / "tampered.tar.gz", "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tampered = dlaunch(tmp_path, "rerun", "tampered.tar.gz:exp/g2", "--site", "jureca-dc", "--dry-run")
    assert tampered.returncode == 2 and "does not match its sha256" in tampered.stderr


def test_archive_refuses_a_folder_without_runs_and_a_wrong_suffix(tmp_path):
    (tmp_path / "empty").mkdir()
    result = dlaunch(tmp_path, "archive", tmp_path / "empty", "-o", tmp_path / "x.tar.gz")
    assert result.returncode == 2 and "no run directories" in result.stderr and not (tmp_path / "x.tar.gz").exists()
    folder = experiment(tmp_path)
    wrong = dlaunch(tmp_path, "archive", folder, "-o", tmp_path / "x.zip")
    assert wrong.returncode == 2 and "must end in .tar.gz" in wrong.stderr
