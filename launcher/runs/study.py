"""Study files (`studies/*.toml`): a recipe, a matrix of runs and the published data it is compared with.

`dlaunch study run FILE --site S` renders every job of the matrix through `cli.prepare` and submits
it through `cli.submit` into one study directory (`OUTPUT/<study name>/<matrix name>/<run name>`).
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
from typing import Annotated, Any, Dict, Iterator, List, Literal, Optional, Sequence, Tuple

import typer
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from launcher.boundary import ALLOW_LARGE, LIMITS, escape, quoted, read_json, read_text, whole
from launcher.cli import AllowLarge
from launcher.errors import DlaunchError
from launcher.jobs.request import FRAMEWORKS, LaunchRequest, check_trainer_value
from launcher.runs.rundir import RunDir, display_path, find_runs
from launcher.jobs.schema import SAFE_NAME, parse_time
from launcher.jobs.sites import load_toml
from launcher.paths import PUBLISHED_DIR
from train.config import MODELS, SCHEDULES

STUDY_COPY = "study.toml"
STUDY_INFO = "study.json"
# Matrix dimensions: set by the matrix, never by a recipe.
DIMENSIONS = ("framework", "loader", "model", "gpus", "nodes", "schedule")
METRICS = ("images_per_s", "speedup", "efficiency", "comm_share")

FILE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"  # a file directly in data/published/: no folder, no `..`
LISTS = {"framework": "frameworks", "loader": "loaders", "model": "models", "gpus": "gpus", "nodes": "nodes",
         "schedule": "schedules"}  # a dimension -> the matrix's list of its values
SafeName = Annotated[str, StringConstraints(pattern=SAFE_NAME)]
Count = Annotated[int, Field(gt=0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


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
    env: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


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
        if not whole(FILE_NAME, name) or not (PUBLISHED_DIR / name).is_file() or (PUBLISHED_DIR / name).is_symlink():
            raise ValueError("%s is not a file in data/published/" % escape(name))
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
    frameworks: List[Literal[FRAMEWORKS]] = Field(default=["ddp"], min_length=1)
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

    @model_validator(mode="after")
    def _counts(self) -> "Matrix":
        if (self.gpus is None) == (self.nodes is None):
            raise ValueError("give exactly one of gpus and nodes")
        for dimension, values in self.lists().items():
            twice = [v for v in values if values.count(v) > 1]
            if twice:  # two jobs would get one run directory
                raise ValueError("%s: %s appears twice" % (LISTS[dimension], quoted(twice[0])))
        lists = self.lists()
        for i, rule in enumerate(self.exclude):  # the matrix has every combination: a rule matches one iff each value is listed
            if not all(value in lists[key] for key, value in rule.items()):
                raise ValueError("exclude.%d: %s matches no job of the matrix" % (i, _rule_text(rule)))
        named = [d for d in lists if any(d in rule for rule in self.exclude)]  # only these decide
        if not any(not _excluded(dict(zip(named, values)), self.exclude)
                   for values in itertools.product(*(lists[d] for d in named))):
            raise ValueError("exclude: the exclusions leave no job of the matrix")
        return self

    def lists(self) -> Dict[str, List[Any]]:
        """The matrix's dimensions (framework, loader, model, gpus or nodes, schedule) and their values."""
        return {"framework": self.frameworks, "loader": self.loaders, "model": self.models,
                self.count_key: list(self.gpus or self.nodes or []), "schedule": self.schedules}

    def points(self) -> Iterator[Dict[str, Any]]:
        """Every combination of the lists, in file order (before exclusions and repeats)."""
        lists = self.lists()
        for values in itertools.product(*lists.values()):
            yield dict(zip(lists, values))

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


class StudyInfo(BaseModel):
    """`study.json` in a study directory: the study, its file and the site it runs on."""

    model_config = ConfigDict(extra="allow", strict=True)
    study: str
    file: str
    site: str


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


def _rule_text(rule: Dict[str, Any]) -> str:
    return "{%s}" % ", ".join("%s = %s" % (k, quoted(v)) for k, v in rule.items())


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
           image: Optional[str] = None, only: Sequence[str] = (), allow_large: bool = False) -> List[Job]:
    """Every job of the study's matrix (in file order), as requests for `site`; more than the limit of
    `study jobs` (a typo's million) is refused as soon as it is reached, unless `allow_large`."""
    filters = parse_only(only)
    jobs = []
    for m in study.matrix:
        key = m.count_key
        recipe = dict(study.recipe, **m.recipe)
        if data:
            recipe["data"] = data
        for point in m.points():
            framework, loader, model, count, schedule = point.values()
            if _excluded(point, m.exclude):
                continue
            for repeat in range(1, m.repeats + 1):
                coordinates = dict(point, matrix=m.name, repeat=repeat)
                if any(str(coordinates.get(k)) not in values for k, values in filters.items()):
                    continue
                if len(jobs) == LIMITS["study jobs"] and not allow_large:
                    raise DlaunchError("study %s: more than %d jobs (at matrix %s): pass %s if you mean it"
                                       % (study.name, LIMITS["study jobs"], m.name, ALLOW_LARGE))
                name = "%s-%s-%s-%s%04d-%s-r%d" % (framework, loader, model, key[0], count, schedule, repeat)
                trainer = dict(recipe, model=model, loader=loader, schedule=schedule)
                request = LaunchRequest(site=site, framework=framework, partition=m.partition or study.partition,
                                        time=m.time or study.time, account=account, image=image, output=str(output),
                                        experiment="%s.%s" % (study.name, m.name), run_name=name,
                                        trainer=tuple(trainer.items()), allow_large=allow_large, **{key: count})
                jobs.append(Job(m.name, name, coordinates, request))
    return jobs


def study_dir(study: Study, output: Path) -> Path:
    return (output / study.name).resolve()


def _check_site(folder: Path, site: str) -> None:
    """Refuse to add runs of another site to a study directory."""
    info = folder / STUDY_INFO
    recorded = read_json(info, StudyInfo, follow_links=False).site if os.path.lexists(info) else site
    if recorded != site:
        raise DlaunchError("--site: %s was run on site %s; give another --output to run it on %s"
                           % (display_path(folder), recorded, site))


def _record_study(path: Path, folder: Path, site: str) -> None:
    """Copy the study file and the site into the study directory (first submission only)."""
    from launcher.atomic import write_atomic

    if (folder / STUDY_INFO).is_file():
        return
    write_atomic(folder / STUDY_COPY, read_text(path))
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
              data: Optional[str] = None, account: Optional[str] = None, image: Optional[str] = None,
              allow_large: bool = False) -> int:
    """Render (--dry-run: print) or submit the jobs of a study that are missing or failed; exit code 1
    when a run here failed."""
    from launcher import cli
    from launcher.runs.runstate import observe

    study = load_study(path)
    data, data_warning = _data(study, data, dry_run)
    jobs = expand(study, site, output, data, account, image, only, allow_large)
    if not jobs:
        raise DlaunchError("--only: no job of study %s matches %s" % (study.name, " ".join(only)))
    folder = study_dir(study, output)
    if not dry_run:
        _check_site(folder, site)
    existing = [RunDir(folder / j.matrix / j.name) for j in jobs if (folder / j.matrix / j.name / "plan.json").is_file()]
    snapshots = {s.run.path: s for s in observe(existing)} if existing else {}
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
    rendered, warnings = [], Counter()
    if data_warning:
        warnings[data_warning] += 1
    for job, resume in todo:
        request = dataclasses.replace(job.request, resume=resume)
        with cli.err.capture() as captured:  # one line per distinct warning, not one per job
            request, plan, script = cli.prepare(request, run_dir=folder / job.matrix / job.name, dry_run=dry_run)
            cli.check_image(plan, dry_run)
        warnings.update(line for line in captured.get().splitlines() if line)
        rendered.append((job, resume, request, plan, script))
    for line, n in sorted(warnings.items()):
        cli.err.print(line if n == 1 else "%s (%d jobs)" % (line, n))
    summary = "%d jobs" % len(rendered)
    skipped = ["%d ended ok" % ok] * bool(ok) + ["%d still active" % active] * bool(active)
    if skipped:
        summary += " (left alone: %s)" % ", ".join(skipped)
    if dry_run:
        for _, _, _, _, script in rendered:
            cli.out.out(script)
        cli.out.out(summary)
        return 0
    _record_study(Path(path), folder, site)
    failed = 0
    for i, (job, resume, request, plan, script) in enumerate(rendered, 1):
        cli.err.print("[%d/%d] %s %s/%s" % (i, len(rendered), "resubmitting" if resume else "submitting", job.matrix, job.name))
        run = RunDir.open(Path(plan.run_dir)) if resume else RunDir.create(Path(plan.run_dir))
        failed += bool(cli.submit(request, plan, script, run))
    cli.out.out("study %s: %s submitted%s" % (study.name, summary, ", %d failed here" % failed if failed else ""))
    return 1 if failed else 0


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
    from launcher.cli import out

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
    allow_large: AllowLarge = False,
) -> int:
    """Submit the jobs of a study that are missing or failed (or print them with --dry-run)."""
    return run_study(file, site, output, dry_run, only or (), data, account, image, allow_large)


@study_app.command("status")
def study_status_command(folder: Annotated[Path, typer.Argument(help="study directory")]) -> int:
    """State and figures of every run of a study directory."""
    from launcher.cli import show_status

    return show_status(study_runs(folder))


@study_app.command("report")
def study_report_command(
    folder: Annotated[Path, typer.Argument(help="study directory")],
    output: Annotated[Path, typer.Option("--output", "-o", help="folder for report.md and the plots")] = Path("report"),
) -> int:
    """The study's tables and plots, with the published values beside this run's."""
    return report_study(folder, output)
