"""Study files (`studies/*.toml`): a recipe, a matrix of runs and the published data it is compared with.

`dlaunch study run FILE --site S` renders every job of the matrix and submits them through the run
service (launcher/runs/service.py) into one study directory (`OUTPUT/<study name>/<matrix name>/<run name>`).
Run names are deterministic, so a second `study run` finds the runs it made: it leaves those that
ended ok or still run and resubmits (with `--resume`, as `dlaunch run --resume`) those that ended
otherwise (`runstate.observe` decides). The study file is copied into the study directory
(`study.toml`) with the site it runs on (`study.json`); `study report` reads the comparisons from it.

Pydantic validates the files (as `launcher/jobs/sites.py` does site profiles): a schema library gives
field-named errors and typed values without hand-written checks.
"""
import dataclasses
import itertools
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Dict, List, Literal, Optional, Sequence, Tuple

import typer
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from launcher.errors import DlaunchError
from launcher.jobs.request import LaunchRequest, check_trainer_value
from launcher.runs.rundir import RunDir, display_path, find_runs
from launcher.jobs.schema import EnvName, SafeName, parse_time
from launcher.jobs.sites import load_toml
from launcher.paths import PUBLISHED_DIR
from launcher.terminal import err, out, show_status
from train.config import MODELS, SCHEDULES
from train.framework_table import FRAMEWORKS

STUDY_COPY = "study.toml"
STUDY_INFO = "study.json"
# Matrix dimensions: set by the matrix, never by a recipe.
DIMENSIONS = ("framework", "loader", "model", "gpus", "nodes", "schedule")
METRICS = ("images_per_s", "speedup", "efficiency", "comm_share")

Count = Annotated[int, Field(gt=0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_recipe(recipe: Dict[str, Any]) -> Dict[str, Any]:
    for name, value in recipe.items():
        if name in DIMENSIONS:
            raise ValueError("%s: set by the matrix (its list of %ss), not by a recipe" % (name, name))
        try:
            check_trainer_value(name, value)
        except DlaunchError as e:
            raise ValueError("%s: %s" % (name, str(e).split(": ", 1)[1])) from None
    return recipe


class Dataset(_Model):
    """Data the study needs that this file cannot name (a path on the user's cluster)."""

    description: str
    env: EnvName


class Compare(_Model):
    """Published values to draw beside the measured ones: rows of `file` (data/published/) matching
    `match`, the value in `column` (divided by the sum of `share_of` when given)."""

    label: str
    file: str
    metric: Literal[METRICS]
    column: str
    share_of: List[str] = []
    match: Dict[Literal["framework", "loader", "model"], str] = {}

    @field_validator("file")
    @classmethod
    def _exists(cls, name: str) -> str:
        if not (PUBLISHED_DIR / name).is_file():
            raise ValueError("%s is not a file in data/published/" % name)
        return name


class _WithRecipe(_Model):
    """A recipe of trainer flags and a time limit, checked alike in a study and in each of its matrix blocks."""

    @field_validator("recipe", check_fields=False)
    @classmethod
    def _recipe(cls, recipe: Dict[str, Any]) -> Dict[str, Any]:
        return _check_recipe(recipe)

    @field_validator("time", check_fields=False)
    @classmethod
    def _time(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            parse_time(value)
        return value


class Matrix(_WithRecipe):
    """One block of runs: every combination of its lists, `repeats` times, less the `exclude`d ones."""

    name: SafeName
    description: str = ""
    frameworks: List[str] = Field(default=["ddp"], min_length=1)  # rows of train/framework_table.py
    loaders: List[Literal["native", "dali"]] = Field(default=["native"], min_length=1)
    models: List[Literal[MODELS]] = Field(min_length=1)
    gpus: Optional[List[Count]] = None
    nodes: Optional[List[Count]] = None
    schedules: List[Literal[SCHEDULES]] = Field(default=["step"], min_length=1)
    repeats: int = Field(default=1, gt=0)
    exclude: List[Dict[Literal[DIMENSIONS], Any]] = []
    recipe: Dict[str, Any] = {}
    time: Optional[str] = None
    partition: Optional[SafeName] = None

    @field_validator("frameworks")
    @classmethod
    def _known(cls, frameworks: List[str]) -> List[str]:
        unknown = [name for name in frameworks if name not in FRAMEWORKS]
        if unknown:
            raise ValueError("%r is not one of %s" % (unknown[0], ", ".join(FRAMEWORKS)))
        return frameworks

    @model_validator(mode="after")
    def _counts(self) -> "Matrix":
        if (self.gpus is None) == (self.nodes is None):
            raise ValueError("give exactly one of gpus and nodes")
        return self

    @property
    def count_key(self) -> str:
        return "gpus" if self.gpus is not None else "nodes"


class Study(_WithRecipe):
    name: SafeName
    description: str
    based_on: List[str] = Field(min_length=1)
    recipe: Dict[str, Any] = {}
    time: str = "01:00:00"
    partition: Optional[SafeName] = None
    dataset: Optional[Dataset] = None
    matrix: List[Matrix] = Field(min_length=1)
    compare: List[Compare] = []

    @model_validator(mode="after")
    def _unique(self) -> "Study":
        names = [m.name for m in self.matrix]
        if len(set(names)) != len(names):
            raise ValueError("two matrix blocks are called %s" % next(n for n in names if names.count(n) > 1))
        if self.dataset and any("data" in r for r in [self.recipe] + [m.recipe for m in self.matrix]):
            raise ValueError("a recipe sets data and [dataset] asks for it: keep one")
        return self


def load_study(path: Path) -> Study:
    """Read and validate a study file; errors name the file and the field (exit code 2)."""
    return load_toml(Path(path), Study)


@dataclass(frozen=True)
class Job:
    """One run of the matrix: where it goes and what it asks for."""

    matrix: str
    name: str
    coordinates: Dict[str, Any]  # framework, loader, model, gpus|nodes, schedule, repeat
    request: LaunchRequest


def _excluded(point: Dict[str, Any], exclusions: Sequence[Dict[str, Any]]) -> bool:
    return any(all(point.get(k) == v for k, v in rule.items()) for rule in exclusions)


def parse_only(only: Sequence[str]) -> Dict[str, List[str]]:
    """`--only key=value` filters: values of one key are alternatives, keys must all match."""
    known = ("matrix", "repeat") + DIMENSIONS
    filters: Dict[str, List[str]] = {}
    for item in only:
        key, sep, value = item.partition("=")
        if not sep or key not in known or not value:
            raise DlaunchError("--only: %r is not key=value with key one of %s" % (item, ", ".join(known)))
        filters.setdefault(key, []).append(value)
    return filters


def expand(study: Study, site: str, output: Path, data: Optional[str] = None, account: Optional[str] = None,
           image: Optional[str] = None, only: Sequence[str] = ()) -> List[Job]:
    """Every job of the study's matrix (in file order), as requests for `site`."""
    filters = parse_only(only)
    jobs = []
    for m in study.matrix:
        key = m.count_key
        counts = m.gpus if key == "gpus" else m.nodes
        recipe = dict(study.recipe, **m.recipe)
        if data:
            recipe["data"] = data
        for framework, loader, model, count, schedule in itertools.product(m.frameworks, m.loaders, m.models, counts or [], m.schedules):
            point = {"framework": framework, "loader": loader, "model": model, key: count, "schedule": schedule}
            if _excluded(point, m.exclude):
                continue
            for repeat in range(1, m.repeats + 1):
                coordinates = dict(point, matrix=m.name, repeat=repeat)
                if any(str(coordinates.get(k)) not in values for k, values in filters.items()):
                    continue
                name = "%s-%s-%s-%s%04d-%s-r%d" % (framework, loader, model, key[0], count, schedule, repeat)
                trainer = dict(recipe, model=model, loader=loader, schedule=schedule)
                request = LaunchRequest(site=site, framework=framework, partition=m.partition or study.partition,
                                        time=m.time or study.time, account=account, image=image, output=str(output),
                                        experiment="%s.%s" % (study.name, m.name), run_name=name,
                                        trainer=tuple(trainer.items()), **{key: count})
                jobs.append(Job(m.name, name, coordinates, request))
    return jobs


def study_dir(study: Study, output: Path) -> Path:
    return (output / study.name).resolve()


def _check_site(folder: Path, site: str) -> None:
    """Refuse to add runs of another site to a study directory."""
    info = folder / STUDY_INFO
    recorded = json.loads(info.read_text(encoding="utf-8"))["site"] if info.is_file() else site
    if recorded != site:
        raise DlaunchError("--site: %s was run on site %s; give another --output to run it on %s"
                           % (display_path(folder), recorded, site))


def _record_study(path: Path, folder: Path, site: str) -> None:
    """Copy the study file and the site into the study directory (first submission only)."""
    from launcher.atomic import write_atomic

    if (folder / STUDY_INFO).is_file():
        return
    write_atomic(folder / STUDY_COPY, path.read_text(encoding="utf-8"))
    write_atomic(folder / STUDY_INFO, json.dumps({"study": load_study(path).name, "file": str(path.resolve()), "site": site},
                                                 indent=2) + "\n")


def _data(study: Study, data: Optional[str], dry_run: bool) -> Tuple[Optional[str], Optional[str]]:
    """(data path, warning) for a study with a [dataset]: --data, else its environment variable."""
    if study.dataset is None:
        if data:
            raise DlaunchError("--data: study %s names its data in its recipe" % study.name)
        return None, None
    data = data or os.environ.get(study.dataset.env)
    if data:
        return data, None
    missing = "--data: give the %s (or set $%s)" % (study.dataset.description, study.dataset.env)
    if not dry_run:
        raise DlaunchError(missing)
    placeholder = "/unset/%s" % study.dataset.env
    return placeholder, "dlaunch: warning: %s; the scripts below read --data %s" % (missing, placeholder)


def run_study(path: Path, site: str, output: Path = Path("runs"), dry_run: bool = False, only: Sequence[str] = (),
              data: Optional[str] = None, account: Optional[str] = None, image: Optional[str] = None) -> int:
    """Render (--dry-run: print) or submit the jobs of a study that are missing or failed; exit code as
    the run service's (1 for a refusal, a failed run's here)."""
    from launcher.runs import service

    study = load_study(path)
    data, data_warning = _data(study, data, dry_run)
    jobs = expand(study, site, output, data, account, image, only)
    if not jobs:
        raise DlaunchError("--only: no job of study %s matches %s" % (study.name, " ".join(only)))
    folder = study_dir(study, output)
    if not dry_run:
        _check_site(folder, site)
    existing = [RunDir(folder / j.matrix / j.name) for j in jobs if (folder / j.matrix / j.name / "plan.json").is_file()]
    snapshots = {s.run.path: s for s in service.observe(existing)} if existing else {}
    todo, ok, active = [], 0, 0
    for job in jobs:
        snapshot = snapshots.get(folder / job.matrix / job.name)
        if snapshot is None:
            todo.append((job, False))
        elif snapshot.ok:
            ok += 1
        elif not snapshot.ended:
            active += 1
        else:
            todo.append((job, True))  # ended otherwise than ok: resumed from its checkpoint, if any
    rendered = [service.prepare(dataclasses.replace(job.request, resume=resume), run_dir=folder / job.matrix / job.name,
                                dry_run=dry_run) for job, resume in todo]
    warnings = Counter("dlaunch: warning: %s" % line for job in rendered for line in job.warnings)  # one line per distinct one
    if data_warning:
        warnings[data_warning] += 1
    for line, n in sorted(warnings.items()):
        err.print(line if n == 1 else "%s (%d jobs)" % (line, n))
    summary = "%d jobs" % len(rendered)
    skipped = ["%d ended ok" % ok] * bool(ok) + ["%d still active" % active] * bool(active)
    if skipped:
        summary += " (left alone: %s)" % ", ".join(skipped)
    if dry_run:
        for job in rendered:
            out.out(job.script)
        out.out(summary)
        return 0
    _record_study(Path(path), folder, site)
    submitted = service.submit_all(rendered, err.print)
    failed = sum(bool(code) for code in submitted.codes)
    out.out("study %s: %s submitted%s" % (study.name, summary, ", %d failed here" % failed if failed else ""))
    return submitted.exit_code


def study_runs(folder: Path) -> List[RunDir]:
    runs = find_runs([folder])
    if not runs:
        raise DlaunchError("%s: no run directories" % folder)
    return runs


def recorded_study(folder: Path) -> Study:
    """The study file copied into a study directory."""
    if not (folder / STUDY_COPY).is_file():
        raise DlaunchError("%s: not a study directory (no %s; made by `dlaunch study run`)" % (folder, STUDY_COPY))
    return load_study(folder / STUDY_COPY)


def report_study(folder: Path, output: Path) -> int:
    """`dlaunch report` of the study directory, plus the published values beside this run's."""
    from launcher.analysis.scaling import compare_published, load_runs
    from launcher.analysis.report import report_command, write_comparison

    study = recorded_study(folder)
    code = 0
    try:
        report_command([folder], output=output, site=None)
    except typer.Exit as e:
        code = e.exit_code
    comparisons = [compare_published(c, PUBLISHED_DIR / c.file, load_runs([str(folder)]).runs) for c in study.compare]
    write_comparison(output, comparisons, study.based_on)
    out.print("wrote %s" % (output / "published_vs_this_run.png"), markup=False, highlight=False)
    return code


study_app = typer.Typer(help="Studies: a matrix of runs from a study file, its status and its report.", no_args_is_help=True)


@study_app.command("run")
def study_run_command(
    file: Annotated[Path, typer.Argument(help="study file (studies/*.toml)")],
    site: Annotated[str, typer.Option("--site", help="profile name, alias or path to a .toml")],
    output: Annotated[Path, typer.Option(help="the study directory is OUTPUT/<study name>")] = Path("runs"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print every job's script and the count; write and submit nothing")] = False,
    only: Annotated[Optional[List[str]], typer.Option("--only", help="key=value (matrix, framework, loader, model, gpus, nodes, schedule, repeat); repeatable")] = None,
    data: Annotated[Optional[str], typer.Option(help="the dataset a study's [dataset] asks for")] = None,
    account: Annotated[Optional[str], typer.Option(help="account/budget; default: the site's account variable")] = None,
    image: Annotated[Optional[str], typer.Option(help="container image; default: images/<stack>-<framework>.sif")] = None,
) -> int:
    """Submit the jobs of a study that are missing or failed (or print them with --dry-run)."""
    return run_study(file, site, output, dry_run, only or (), data, account, image)


@study_app.command("status")
def study_status_command(folder: Annotated[Path, typer.Argument(help="study directory")]) -> int:
    """State and figures of every run of a study directory."""
    show_status(study_runs(folder))
    return 0


@study_app.command("report")
def study_report_command(
    folder: Annotated[Path, typer.Argument(help="study directory")],
    output: Annotated[Path, typer.Option("--output", "-o", help="folder for report.md and the plots")] = Path("report"),
) -> int:
    """The study's tables and plots, with the published values beside this run's."""
    return report_study(folder, output)
