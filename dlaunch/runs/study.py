"""Study files (`studies/*.toml`): a recipe, a matrix of runs and the published data it is compared with.

`dlaunch study run FILE --site S` renders every job of the matrix and submits them through the run
service (dlaunch/runs/service.py) into one study directory (`OUTPUT/<study name>/<matrix name>/<run name>`).
Run names are deterministic, so a second `study run` finds the runs it made: it leaves those that
ended ok or still run and resubmits (with `--resume`, as `dlaunch run --resume`) those that ended
otherwise (`runstate.observe` decides). The study file is copied into the study directory
(`study.toml`) with the site and protocol it runs with (`study.json`); `study report` reads the
comparisons and the study's assumptions from it. `dlaunch study check FILE [--site S]` renders every
job for a site (or for every shipped site of the study's kind) and lists those that cannot run there.

What a study file says beyond the matrix:
- `kind` (gpu or cpu) and `gpu_vendor`: the hardware it needs; `stack`: the image stack each
  framework's default image comes from (`<stack>-<framework>-<arch>`; `--stack` overrides it);
- `figures` of a matrix block: the published figures and tables its runs stand for (printed per job);
- `[protocol.NAME]`: named lengths of the runs (recipe and time overlays per matrix `part`, with
  overrides at some points), `default_protocol` the one used without `--protocol`;
- `[[dataset]]`: data it needs that it cannot name, per loader (e.g. a JPEG folder for the native loader,
  TFRecords for DALI);
- `assumptions`: the values the paper leaves unstated that the study fixes (shown in its report).
Gpu counts above one node that a site's nodes do not hold evenly in whole nodes run on the fewest
nodes that hold them evenly (12 GPUs: 3 nodes of 4, or 2 nodes of 6 on 8-GPU nodes).

Pydantic validates the files (as `dlaunch/jobs/sites.py` does site profiles): a schema library gives
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

from dlaunch.boundary import ALLOW_LARGE, LIMITS, escape, quoted, read_json, read_text, whole
from dlaunch.errors import DlaunchError
from dlaunch.jobs.request import LaunchRequest, check_trainer_value
from dlaunch.runs.rundir import RunDir, display_path, find_runs
from dlaunch.jobs.schema import EnvName, SafeName, parse_time
from dlaunch.jobs.sites import load_toml
from dlaunch.paths import PUBLISHED_DIR, REPO, SHIPPED_SITES_DIR
from dlaunch.schedulers import registration
from dlaunch.tables import counted
from dlaunch.terminal import AllowLarge, command_group, err, out, show_status
from dlaunch.train.config import MODELS, SCHEDULES
from dlaunch.train.framework_table import FRAMEWORKS

STUDY_COPY = "study.toml"
STUDY_INFO = "study.json"
# Matrix dimensions: set by the matrix, never by a recipe.
DIMENSIONS = ("framework", "loader", "model", "gpus", "nodes", "schedule")
METRICS = ("images_per_s", "speedup", "efficiency", "comm_share", "kernel_comm_share", "kernel_compute_share",
           "kernel_io_share", "throughput_ratio")
LOADERS = ("native", "dali")
KINDS = ("gpu", "cpu")

SHIPPED_STUDIES_DIR = REPO / "studies"

FILE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.+-]*"  # a file directly in data/published/: no folder, no `..`
LISTS = {"framework": "frameworks", "loader": "loaders", "model": "models", "gpus": "gpus", "nodes": "nodes",
         "schedule": "schedules"}  # a dimension -> the matrix's list of its values
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


def _known_frameworks(names: List[str]) -> List[str]:
    """Rows of the framework table (dlaunch/train/framework_table.py), asked when a study file is read."""
    unknown = [name for name in names if name not in FRAMEWORKS]
    if unknown:
        raise ValueError("%r is not one of %s" % (unknown[0], ", ".join(FRAMEWORKS)))
    return names


class Dataset(_Model):
    """Data the study needs that this file cannot name (a path on the user's cluster), for `loaders`."""

    description: str
    env: EnvName
    loaders: List[Literal[LOADERS]] = Field(default=list(LOADERS), min_length=1)


class Compare(_Model):
    """Published values to draw beside the measured ones: rows of `file` (data/published/) matching
    `match`, the value in `column` (divided by the sum of `share_of` when given; by 100 when `percent`).
    `throughput_ratio`: the images/s of framework `ratio_of[0]` over `ratio_of[1]` per count, beside the
    one published ratio in `column` of the row matching `row` (a value without a count: drawn at each)."""

    label: str
    file: str
    metric: Literal[METRICS]
    column: str
    share_of: List[str] = []
    percent: bool = False
    match: Dict[Literal["framework", "loader", "model"], str] = {}
    ratio_of: List[str] = []  # rows of dlaunch/train/framework_table.py
    row: Dict[str, str] = {}

    _frameworks = field_validator("ratio_of")(_known_frameworks)

    @model_validator(mode="after")
    def _ratio(self) -> "Compare":
        if (self.metric == "throughput_ratio") != bool(self.ratio_of):
            raise ValueError("ratio_of: give two frameworks for metric throughput_ratio, and only for it")
        if self.ratio_of and (len(self.ratio_of) != 2 or not self.row):
            raise ValueError("ratio_of: two frameworks (faster, slower), with `row` naming the published row")
        return self

    @field_validator("file")
    @classmethod
    def _exists(cls, name: str) -> str:
        if not whole(FILE_NAME, name) or not (PUBLISHED_DIR / name).is_file() or (PUBLISHED_DIR / name).is_symlink():
            raise ValueError("%s is not a file in data/published/" % escape(name))
        return name


class _WithRecipe(_Model):
    """A recipe of trainer flags and a time limit, checked alike wherever a study file gives them."""

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


class PointOverlay(_WithRecipe):
    """A protocol's recipe and time at the matrix points matching `match` (e.g. gpus = 4)."""

    match: Dict[Literal[DIMENSIONS], Any] = Field(min_length=1)
    recipe: Dict[str, Any] = {}
    time: Optional[str] = None


class Overlay(_WithRecipe):
    """What a protocol sets for the matrix blocks of one `part`: recipe, time, and overrides at some points."""

    recipe: Dict[str, Any] = {}
    time: Optional[str] = None
    at: List[PointOverlay] = []


class Protocol(_Model):
    """A named length of the runs (e.g. the paper's 90 epochs, or a short measurement of throughput)."""

    description: str
    parts: Dict[SafeName, Overlay] = Field(min_length=1)


class Matrix(_WithRecipe):
    """One block of runs: every combination of its lists, `repeats` times, less the `exclude`d ones."""

    name: SafeName
    description: str = ""
    figures: List[str] = []  # the published figures and tables these runs stand for
    part: Optional[SafeName] = None  # which overlay of the chosen protocol applies
    frameworks: List[str] = Field(default=["ddp"], min_length=1)  # rows of dlaunch/train/framework_table.py
    loaders: List[Literal[LOADERS]] = Field(default=["native"], min_length=1)
    models: List[Literal[MODELS]] = Field(min_length=1)
    gpus: Optional[List[Count]] = None
    nodes: Optional[List[Count]] = None
    schedules: List[Literal[SCHEDULES]] = Field(default=["step"], min_length=1)
    repeats: int = Field(default=1, gt=0)
    exclude: List[Dict[Literal[DIMENSIONS], Any]] = []
    recipe: Dict[str, Any] = {}
    time: Optional[str] = None
    partition: Optional[SafeName] = None

    _frameworks = field_validator("frameworks")(_known_frameworks)

    @model_validator(mode="after")
    def _counts(self) -> "Matrix":
        if (self.gpus is None) == (self.nodes is None):
            raise ValueError("give exactly one of gpus and nodes")
        lists = self.lists()
        for dimension, values in lists.items():
            twice = [v for v in values if values.count(v) > 1]
            if twice:  # two jobs would get one run directory
                raise ValueError("%s: %s appears twice" % (LISTS[dimension], quoted(twice[0])))
        for i, rule in enumerate(self.exclude):  # the matrix has every combination: a rule matches one iff each value is listed
            other = next((key for key in rule if key not in lists), None)
            if other:
                raise ValueError("exclude.%d: %s: the matrix lists %s, not %s" % (i, other, self.count_key, other))
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
    kind: Literal[KINDS] = "gpu"
    gpu_vendor: Optional[Literal["nvidia", "amd"]] = None
    stack: Optional[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]*$")]] = None
    assumptions: List[str] = []
    recipe: Dict[str, Any] = {}
    time: str = "01:00:00"
    partition: Optional[SafeName] = None
    dataset: List[Dataset] = []
    protocol: Dict[SafeName, Protocol] = {}
    default_protocol: Optional[SafeName] = None
    matrix: List[Matrix] = Field(min_length=1)
    compare: List[Compare] = []

    @field_validator("dataset", mode="before")
    @classmethod
    def _one_dataset(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value  # `[dataset]`: one for every loader

    @model_validator(mode="after")
    def _consistent(self) -> "Study":
        names = [m.name for m in self.matrix]
        if len(set(names)) != len(names):
            raise ValueError("two matrix blocks are called %s" % next(n for n in names if names.count(n) > 1))
        covered = [loader for d in self.dataset for loader in d.loaders]
        if len(set(covered)) != len(covered):
            raise ValueError("dataset: two datasets for loader %s" % next(l for l in covered if covered.count(l) > 1))
        if self.dataset and any("data" in r for r in [self.recipe] + [m.recipe for m in self.matrix]):
            raise ValueError("a recipe sets data and [dataset] asks for it: keep one")
        if self.kind == "cpu" and self.gpu_vendor:
            raise ValueError("gpu_vendor: a study of kind cpu needs no GPUs")
        if self.protocol and self.default_protocol not in self.protocol:
            raise ValueError("default_protocol: give one of %s" % ", ".join(self.protocol))
        if not self.protocol and self.default_protocol:
            raise ValueError("default_protocol: the study has no [protocol.NAME]")
        for m in self.matrix:
            if m.part is None:
                continue
            for name, protocol in self.protocol.items():
                if m.part not in protocol.parts:
                    raise ValueError("matrix %s: part %s: protocol %s has no parts.%s" % (m.name, m.part, name, m.part))
            if not self.protocol:
                raise ValueError("matrix %s: part %s: the study has no [protocol.NAME]" % (m.name, m.part))
        return self


class StudyInfo(BaseModel):
    """`study.json` in a study directory: the study, its file, the site, protocol and stack it runs with."""

    model_config = ConfigDict(extra="allow", strict=True)
    study: str
    file: str
    site: str
    protocol: Optional[str] = None
    stack: Optional[str] = None


def load_study(path: Path) -> Study:
    """Read and validate a study file; errors name the file and the field (exit code 2)."""
    return load_toml(Path(path), Study)


def study_dirs() -> List[Path]:
    """Where studies are looked up by name, as site profiles are: $DLAUNCH_STUDIES_DIR, then the shipped ones."""
    user = os.environ.get("DLAUNCH_STUDIES_DIR")
    return ([Path(user)] if user else []) + [SHIPPED_STUDIES_DIR]


def available_studies() -> Dict[str, Path]:
    """Study name (its file's) -> file, earlier folders shadowing later ones."""
    found: Dict[str, Path] = {}
    for folder in reversed(study_dirs()):
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            found[path.stem] = path
    return dict(sorted(found.items()))


def find_study(name_or_path: str) -> Path:
    """A study file by path (`x.toml`, or a name with a folder) or by name (aach2023), from any folder."""
    known = available_studies()
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        path = Path(name_or_path)
        if not os.path.lexists(path) and path.stem in known:
            raise DlaunchError("%s: no such file; the study %s is found by its name from any folder (%s)"
                               % (escape(name_or_path), path.stem, display_path(known[path.stem])))
        return path
    if name_or_path not in known:
        raise DlaunchError("study %s: no such study (known: %s; or give a path to a .toml)"
                           % (quoted(name_or_path), ", ".join(known)))
    return known[name_or_path]


def complete_study(incomplete: str) -> List[str]:
    """Study names starting with `incomplete` (TAB after `study run`)."""
    return [name for name in available_studies() if name.startswith(incomplete)]


@dataclass(frozen=True)
class Job:
    """One run of the matrix: where it goes and what it asks for."""

    matrix: str
    name: str
    coordinates: Dict[str, Any]  # framework, loader, model, gpus|nodes, schedule, repeat
    request: LaunchRequest
    figures: Tuple[str, ...] = ()
    repeats: int = 1

    @property
    def label(self) -> str:
        """matrix, figures and repeat, as the dry run prints them above the job's script."""
        figures = ", ".join(self.figures) or "no figure"
        return "%s/%s: %s, repeat %d of %d" % (self.matrix, self.name, figures, self.coordinates["repeat"], self.repeats)

    def line(self, nodes: int, per_node: int) -> str:
        """The label and the job's size, as `study run --list` prints it."""
        return "%s; %s, %s" % (self.label, counted(nodes, "node"), counted(nodes * per_node, "GPU"))


def _excluded(point: Dict[str, Any], exclusions: Sequence[Dict[str, Any]]) -> bool:
    return any(all(point.get(k) == v for k, v in rule.items()) for rule in exclusions)


def _rule_text(rule: Dict[str, Any]) -> str:
    return "{%s}" % ", ".join("%s = %s" % (k, quoted(v)) for k, v in rule.items())


def parse_only(only: Sequence[str]) -> Dict[str, List[str]]:
    """`--only key=value` filters: values of one key are alternatives, keys must all match."""
    known = ("matrix", "figure", "repeat") + DIMENSIONS
    filters: Dict[str, List[str]] = {}
    for item in only:
        key, sep, value = item.partition("=")
        if not sep or key not in known or not value:
            raise DlaunchError("--only: %r is not key=value with key one of %s" % (item, ", ".join(known)))
        filters.setdefault(key, []).append(value)
    return filters


def _selected(filters: Dict[str, List[str]], coordinates: Dict[str, Any], figures: Sequence[str]) -> bool:
    for key, values in filters.items():
        if key == "figure":
            if not set(values) & set(figures):
                return False
        elif str(coordinates.get(key)) not in values:
            return False
    return True


def choose_protocol(study: Study, protocol: Optional[str]) -> Optional[str]:
    """The protocol a run uses: `--protocol`, else the study's default (None for a study without any)."""
    if protocol is None:
        return study.default_protocol
    if protocol not in study.protocol:
        known = ", ".join(study.protocol) or "none"
        raise DlaunchError("--protocol: study %s has no protocol %r (its protocols: %s)" % (study.name, protocol, known))
    return protocol


def spread_nodes(gpus: int, per_node: int) -> Optional[int]:
    """The fewest nodes that hold `gpus` evenly, where a whole number of full nodes does not (else None:
    `--gpus` alone decides)."""
    if gpus <= per_node or gpus % per_node == 0:
        return None
    return next(n for n in range(-(-gpus // per_node), gpus + 1) if gpus % n == 0 and gpus // n <= per_node)


def merge_recipes(*recipes: Dict[str, Any]) -> Dict[str, Any]:
    """Later recipes win; a run length (`epochs` or `steps`) replaces the other one of an earlier recipe."""
    merged: Dict[str, Any] = {}
    for recipe in recipes:
        for length, other in (("epochs", "steps"), ("steps", "epochs")):
            if length in recipe:
                merged.pop(other, None)
        merged.update(recipe)
    return merged


def _overlays(study: Study, m: Matrix, protocol: Optional[str], point: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[str]]:
    """(recipe, time) a protocol adds at one point of a matrix block."""
    if protocol is None or m.part is None:
        return {}, None
    overlay = study.protocol[protocol].parts[m.part]
    recipe, time = dict(overlay.recipe), overlay.time
    for at in overlay.at:
        if all(point.get(k) == v for k, v in at.match.items()):
            recipe.update(at.recipe)
            time = at.time or time
    return recipe, time


def expand(study: Study, site: str, output: Path, data: Optional[Dict[str, str]] = None, account: Optional[str] = None,
           image: Optional[str] = None, only: Sequence[str] = (), protocol: Optional[str] = None,
           stack: Optional[str] = None, allow_large: bool = False) -> List[Job]:
    """Every job of the study's matrix (in file order), as requests for `site`; `data`: loader -> path;
    `stack` overrides the study's (`site`: the site's own). More than the limit of `study jobs` (a
    typo's million) is refused as soon as it is reached, unless `allow_large`."""
    from dlaunch.jobs.imagepaths import default_image_for_site
    from dlaunch.jobs.sites import resolve_site

    filters = parse_only(only)
    protocol = choose_protocol(study, protocol)
    resolved = resolve_site(site)
    stack = None if stack == "site" else stack or study.stack
    jobs = []
    for m in study.matrix:
        key = m.count_key
        for point in m.points():
            framework, loader, model, count, schedule = point.values()
            if _excluded(point, m.exclude):
                continue
            extra_recipe, extra_time = _overlays(study, m, protocol, point)
            recipe = merge_recipes(study.recipe, m.recipe, extra_recipe)
            if data and loader in data:
                recipe["data"] = data[loader]
            nodes = spread_nodes(count, resolved.gpus_per_node) if key == "gpus" and not registration(resolved.scheduler.kind).foreground else None
            job_image = image
            if not job_image and stack and resolved.container.containerized:
                job_image = default_image_for_site(resolved, framework, stack)
            for repeat in range(1, m.repeats + 1):
                coordinates = dict(point, matrix=m.name, repeat=repeat)
                if not _selected(filters, coordinates, m.figures):
                    continue
                if len(jobs) == LIMITS["study jobs"] and not allow_large:
                    raise DlaunchError("study %s: more than %d jobs (at matrix %s): pass %s if you mean it"
                                       % (study.name, LIMITS["study jobs"], m.name, ALLOW_LARGE))
                name = "%s-%s-%s-%s%04d-%s-r%d" % (framework, loader, model, key[0], count, schedule, repeat)
                trainer = dict(recipe, model=model, loader=loader, schedule=schedule)
                request = LaunchRequest(site=site, framework=framework, partition=m.partition or study.partition,
                                        time=extra_time or m.time or study.time, account=account, image=job_image,
                                        output=str(output), experiment="%s.%s" % (study.name, m.name), run_name=name,
                                        trainer=tuple(trainer.items()), allow_large=allow_large, **{key: count},
                                        **({"nodes": nodes} if nodes else {}))
                jobs.append(Job(m.name, name, coordinates, request, tuple(m.figures), m.repeats))
    return jobs


def study_dir(study: Study, output: Path) -> Path:
    return (output / study.name).resolve()


def _check_recorded(folder: Path, site: str, protocol: Optional[str]) -> None:
    """Refuse to add runs of another site or protocol to a study directory."""
    info = folder / STUDY_INFO
    if not os.path.lexists(info):
        return
    recorded = read_json(info, StudyInfo, follow_links=False)
    if recorded.site != site:
        raise DlaunchError("--site: %s was run on site %s; give another --output to run it on %s"
                           % (display_path(folder), escape(recorded.site), site))
    if recorded.protocol != protocol:
        raise DlaunchError("--protocol: %s was run with protocol %s; give another --output to run protocol %s"
                           % (display_path(folder), escape(str(recorded.protocol)), protocol))


def _record_study(path: Path, folder: Path, site: str, protocol: Optional[str], stack: Optional[str]) -> None:
    """Copy the study file, the site, protocol and stack into the study directory (first submission only)."""
    from dlaunch.atomic import write_atomic

    if (folder / STUDY_INFO).is_file():
        return
    write_atomic(folder / STUDY_COPY, read_text(path))
    info = {"study": load_study(path).name, "file": str(path.resolve()), "site": site, "protocol": protocol, "stack": stack}
    write_atomic(folder / STUDY_INFO, json.dumps(info, indent=2) + "\n")


def _datasets(study: Study, data: Sequence[str], dry_run: bool) -> Tuple[Dict[str, str], List[str]]:
    """(loader -> data path, warnings) for a study's [[dataset]]s: `--data PATH` (one dataset) or
    `--data ENV=PATH`, else the datasets' environment variables."""
    if not study.dataset:
        if data:
            raise DlaunchError("--data: study %s names its data in its recipe" % study.name)
        return {}, []
    by_env = {d.env: d for d in study.dataset}
    given: Dict[str, str] = {}
    for item in data:
        env, sep, path = item.partition("=")
        if sep and env in by_env:
            given[env] = path
        elif len(study.dataset) == 1:
            given[study.dataset[0].env] = item
        else:
            raise DlaunchError("--data: %r: give ENV=PATH with ENV one of %s" % (item, ", ".join(by_env)))
    paths, warnings = {}, []
    for d in study.dataset:
        path = given.get(d.env) or os.environ.get(d.env)
        if not path:
            missing = "--data: give the %s (or set $%s)" % (d.description, d.env)
            if not dry_run:
                raise DlaunchError(missing)
            path = "/unset/%s" % d.env
            warnings.append("dlaunch: warning: %s; the scripts below read --data %s" % (missing, path))
        for loader in d.loaders:
            paths[loader] = path
    return paths, warnings


def run_study(path: Path, site: str, output: Path = Path("runs"), dry_run: bool = False, only: Sequence[str] = (),
              data: Sequence[str] = (), account: Optional[str] = None, image: Optional[str] = None,
              protocol: Optional[str] = None, stack: Optional[str] = None, allow_large: bool = False,
              listing: bool = False) -> int:
    """Render (--dry-run: print their scripts, `listing`: one line each) or submit the jobs of a study
    that are missing or failed; exit code as the run service's (1 for a refusal, a failed run's here).
    A dry run's stdout is the scripts (or the list) alone: the counts and notes go to stderr."""
    dry_run = dry_run or listing
    from dlaunch.runs import service

    study = load_study(path)
    protocol = choose_protocol(study, protocol)
    paths, data_warnings = _datasets(study, data, dry_run)
    jobs = expand(study, site, output, paths, account, image, only, protocol, stack, allow_large)
    if not jobs:
        raise DlaunchError("--only: no job of study %s matches %s" % (study.name, " ".join(only)))
    folder = study_dir(study, output)
    if not dry_run:
        _check_recorded(folder, site, protocol)
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
    rendered = [(job, service.prepare(dataclasses.replace(job.request, resume=resume),
                                      run_dir=folder / job.matrix / job.name, dry_run=dry_run)) for job, resume in todo]
    warnings = Counter(data_warnings)  # one line per distinct warning, not one per job
    warnings.update("dlaunch: warning: %s" % line for _, prepared in rendered for line in prepared.warnings)
    for line, n in sorted(warnings.items()):
        err.print(line if n == 1 else "%s (%d jobs)" % (line, n))
    summary = counted(len(rendered), "job")
    skipped = ["%d ended ok" % ok] * bool(ok) + ["%d still active" % active] * bool(active)
    if skipped:
        summary += " (left alone: %s)" % ", ".join(skipped)
    if dry_run:
        for i, (job, prepared) in enumerate(rendered, 1):
            if listing:
                out.out(job.line(prepared.plan.nodes, prepared.plan.nproc_per_node), highlight=False)
            else:
                out.out("# job %d/%d %s" % (i, len(rendered), job.label))
                out.out(prepared.script)
        err.out(design_summary(study, protocol, [job for job, _ in rendered]), highlight=False)
        err.out(summary, highlight=False)
        return 0
    _record_study(Path(path), folder, site, protocol, None if stack == "site" else stack or study.stack)
    submitted = service.submit_all([prepared for _, prepared in rendered], err.print)
    failed = sum(bool(code) for code in submitted.codes)
    out.out("study %s: %s submitted%s" % (study.name, summary, ", %d failed here" % failed if failed else ""))
    return submitted.exit_code


def figure_counts(jobs: Sequence[Job]) -> Dict[str, int]:
    """Jobs per figure label, in the order the figures first appear (a job may stand for several)."""
    counts: Dict[str, int] = {}
    for job in jobs:
        for figure in job.figures or ("no figure",):
            counts[figure] = counts.get(figure, 0) + 1
    return counts


def design_summary(study: Study, protocol: Optional[str], jobs: Sequence[Job]) -> str:
    """The protocol, the stack, the jobs per figure and the study's assumptions, as lines of text."""
    lines = ["study %s%s%s" % (study.name, ", protocol %s: %s" % (protocol, study.protocol[protocol].description) if protocol else "",
                               ", stack %s" % study.stack if study.stack else "")]
    lines += ["  %s: %s" % (figure, counted(n, "job")) for figure, n in figure_counts(jobs).items()]
    if study.assumptions:
        lines.append("assumptions (unstated in the sources; this study's choice):")
        lines += ["  - %s" % a for a in study.assumptions]
    return "\n".join(lines)


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
    """`dlaunch report` of the study directory, plus the published values beside this run's and the
    study's protocol and assumptions."""
    from dlaunch.analysis.scaling import compare_published, load_runs
    from dlaunch.analysis.report import report_command, write_comparison

    study = recorded_study(folder)
    info = read_json(folder / STUDY_INFO, StudyInfo, follow_links=False).model_dump() if os.path.lexists(folder / STUDY_INFO) else {}
    code = 0
    try:
        report_command([folder], output=output, site=None)
    except typer.Exit as e:
        code = e.exit_code
    comparisons = [compare_published(c, PUBLISHED_DIR / c.file, load_runs([str(folder)]).runs) for c in study.compare]
    protocol = info.get("protocol")
    design = ["Protocol: %s (%s)" % (protocol, study.protocol[protocol].description)] if protocol in study.protocol else []
    design += ["Image stack: %s" % info["stack"]] if info.get("stack") else []
    plot = write_comparison(output, comparisons, study.based_on, design=design, assumptions=study.assumptions)
    if plot is not None:
        out.print("wrote %s" % plot, markup=False, highlight=False)
    return code


# -- study check ---------------------------------------------------------------------------------------
def site_kind(site: Any) -> str:
    return "cpu" if site.gpu_vendor == "none" else "gpu"


def unfit_reason(study: Study, site: Any, stack: Optional[str]) -> Optional[str]:
    """Why a site is not of the study's kind (None: it is): CPU or GPU, the GPU vendor, the stack."""
    from dlaunch.jobs.imagepaths import check_site_stack

    if registration(site.scheduler.kind).foreground:
        return "this machine (%s), not a cluster" % site.scheduler.kind
    if site_kind(site) != study.kind:
        return "a %s site; the study needs %s nodes" % (site_kind(site), study.kind.upper())
    if study.gpu_vendor and site.gpu_vendor != study.gpu_vendor:
        return "%s GPUs; the study needs %s GPUs" % (site.gpu_vendor, study.gpu_vendor)
    if stack and site.container.containerized:
        try:
            check_site_stack(site, stack)
        except DlaunchError as e:
            return str(e).split(";")[0] + " (--stack site renders it with the site's own)"
    return None


@dataclass(frozen=True)
class CheckResult:
    site: str
    jobs: int
    failures: Tuple[Tuple[str, str], ...]  # (job label, why it cannot run)
    skipped: Optional[str] = None  # why the site was not checked (not of the study's kind)


def job_nodes(job: Job, gpus_per_node: int) -> int:
    """The nodes a job of the study asks for on a site with `gpus_per_node`."""
    request = job.request
    return request.nodes or -(-request.gpus // gpus_per_node)


def check_study_on_site(study: Study, site: str, protocol: Optional[str], stack: Optional[str],
                        skip_too_small: bool = False) -> CheckResult:
    """Render every job of `study` for `site` as a dry run does; collect those that cannot run there.
    `skip_too_small`: a site whose largest partition holds fewer nodes than the study's largest job is
    not checked but skipped (the study is larger than the site)."""
    from dlaunch.jobs.sites import resolve_site
    from dlaunch.runs import service

    resolved = resolve_site(site)
    try:
        jobs = expand(study, site, Path("/dlaunch-study-check"), {l: "/dlaunch-study-check/data" for l in LOADERS},
                      protocol=protocol, stack=stack)
    except DlaunchError as e:
        return CheckResult(resolved.name, 0, (("every job", str(e)),))
    largest = max((job_nodes(job, resolved.gpus_per_node) for job in jobs), default=0)
    capacity = max((p.max_nodes for p in resolved.partitions), default=largest)
    if skip_too_small and largest > capacity:
        return CheckResult(resolved.name, len(jobs), (), skipped="too small: the study's largest jobs take %d nodes, the "
                           "site's largest partition %d" % (largest, capacity))
    failures = []
    for job in jobs:
        try:
            service.prepare(job.request, run_dir=Path("/dlaunch-study-check") / job.matrix / job.name, dry_run=True)
        except DlaunchError as e:
            failures.append((job.label, str(e)))
    return CheckResult(resolved.name, len(jobs), tuple(failures))


def shipped_sites() -> List[str]:
    return [path.stem for path in sorted(SHIPPED_SITES_DIR.glob("*.toml"))]


def check_study(path: Path, sites: Sequence[str] = (), protocol: Optional[str] = None,
                stack: Optional[str] = None) -> List[CheckResult]:
    """`study check`: the given sites, or every shipped site (those not of the study's kind skipped)."""
    from dlaunch.jobs.sites import resolve_site

    study = load_study(path)
    protocol = choose_protocol(study, protocol)
    results = []
    for name in sites or shipped_sites():
        site = resolve_site(name)
        reason = unfit_reason(study, site, None if stack == "site" else stack or study.stack)
        if reason and not sites:
            results.append(CheckResult(site.name, 0, (), skipped=reason))
        elif reason:
            results.append(CheckResult(site.name, 0, (("every job", reason),)))
        else:
            results.append(check_study_on_site(study, name, protocol, stack, skip_too_small=not sites))
    return results


def print_check(study: Study, protocol: Optional[str], results: Sequence[CheckResult]) -> int:
    """One line per site, then per site every reason with the jobs it stops; exit code 1 when a job cannot run."""
    head = "study %s%s" % (study.name, ", protocol %s" % protocol if protocol else "")
    out.out(head)
    for r in results:
        if r.skipped:
            out.out("  %s: skipped (%s)" % (r.site, r.skipped))
        elif r.failures and not r.jobs:
            out.out("  %s: no job can run there" % r.site)
        elif r.failures:
            out.out("  %s: %d of %s cannot run there" % (r.site, len(r.failures), counted(r.jobs, "job")))
        else:
            out.out("  %s: ok (%s)" % (r.site, counted(r.jobs, "job")))
    for r in results:
        reasons: Dict[str, List[str]] = {}
        for label, why in r.failures:
            reasons.setdefault(why, []).append(label)
        for why, labels in reasons.items():
            out.out("%s: %s" % (r.site, why))
            shown = labels[:3] + (["... and %d more" % (len(labels) - 3)] if len(labels) > 3 else [])
            out.out("\n".join("    %s" % label for label in shown))
    return 1 if any(r.failures for r in results) else 0


study_app = command_group(help="Studies: a matrix of runs from a study file, its status and its report.", no_args_is_help=True)
ProtocolOption = Annotated[Optional[str], typer.Option("--protocol", help="the study's protocol (run length) to use; default: its default_protocol")]
StackOption = Annotated[Optional[str], typer.Option("--stack", help="image stack of every framework's default image (`site`: the site's own); default: the study's `stack`")]


StudyArg = Annotated[str, typer.Argument(help="study name (shipped, or a file in $DLAUNCH_STUDIES_DIR), or a study file",
                                         autocompletion=complete_study, show_default=False)]


@study_app.command("run")
def study_run_command(
    study: StudyArg,
    site: Annotated[str, typer.Option("--site", help="profile name, alias or path to a .toml")],
    output: Annotated[Path, typer.Option(help="the study directory is OUTPUT/<study name>")] = Path("runs"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print every job's figure, repeat and script (the counts per figure and the study's assumptions on stderr); write and submit nothing")] = False,
    listing: Annotated[bool, typer.Option("--list", help="as --dry-run, one line per job (its figures, repeat, nodes and GPUs) instead of its script")] = False,
    only: Annotated[Optional[List[str]], typer.Option("--only", help="key=value (matrix, figure, framework, loader, model, gpus, nodes, schedule, repeat); repeatable")] = None,
    data: Annotated[Optional[List[str]], typer.Option(help="the dataset a study's [dataset] asks for: PATH, or ENV=PATH per dataset; repeatable")] = None,
    account: Annotated[Optional[str], typer.Option(help="account/budget; default: the site's account variable")] = None,
    image: Annotated[Optional[str], typer.Option(help="container image for every job; default: images/<stack>-<framework>-<arch> per framework")] = None,
    protocol: ProtocolOption = None,
    stack: StackOption = None,
    allow_large: AllowLarge = False,
) -> int:
    """Submit the jobs of a study that are missing or failed (or print them with --dry-run)."""
    return run_study(find_study(study), site, output, dry_run, only or (), data or (), account, image, protocol, stack,
                     allow_large, listing)


@study_app.command("check")
def study_check_command(
    study: StudyArg,
    site: Annotated[Optional[List[str]], typer.Option("--site", help="profile name, alias or path; repeatable; default: every shipped site (those not of the study's kind are skipped)")] = None,
    protocol: ProtocolOption = None,
    stack: StackOption = None,
) -> int:
    """Render every job of a study for a site and list those that cannot run there (exit 1 if one cannot)."""
    path = find_study(study)
    loaded = load_study(path)
    return print_check(loaded, choose_protocol(loaded, protocol), check_study(path, site or (), protocol, stack))


@study_app.command("status")
def study_status_command(folder: Annotated[Path, typer.Argument(help="study directory")]) -> int:
    """State and figures of every run of a study directory."""
    return show_status(study_runs(folder))


@study_app.command("report")
def study_report_command(
    folder: Annotated[Path, typer.Argument(help="study directory")],
    output: Annotated[Path, typer.Option("--output", "-o", help="folder for report.md and the plots")] = Path("report"),
) -> int:
    """The study's tables and plots, with the published values beside this run's, its protocol and assumptions."""
    return report_study(folder, output)
