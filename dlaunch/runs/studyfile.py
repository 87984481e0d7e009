"""Study files (`studies/*.toml`): their schema and where they are found. A study file is a recipe, a matrix of runs
and the published data it is compared with; running one is dlaunch/runs/study.py, its commands dlaunch/cli/study.py.

What a study file says beyond the matrix:
- `kind` (gpu or cpu) and `gpu_vendor`: the hardware it needs; `stack`: the image stack each
  framework's default image comes from (`<stack>-<framework>-<arch>`; `--stack` overrides it);
- `figures` of a matrix block: the published figures and tables its runs stand for (printed per job);
- `[protocol.NAME]`: named lengths of the runs (recipe and time overlays per matrix `part`, with
  overrides at some points), `default_protocol` the one used without `--protocol`;
- `[[dataset]]`: data it needs that it cannot name, per loader (e.g. a JPEG folder for the native loader,
  TFRecords for DALI);
- `[[compare]]`: published values to draw beside the measured ones (dlaunch/analysis/published.py);
- `assumptions`: the values the paper leaves unstated that the study fixes (shown in its report).

Pydantic validates the files (as `dlaunch/jobs/sites.py` does site profiles): a schema library gives
field-named errors and typed values without hand-written checks. Studies are found by name in
$DLAUNCH_STUDIES_DIR, then among the shipped ones, or by path.
"""

import itertools
import os
from pathlib import Path
from typing import Annotated, Any, Dict, Iterator, List, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from dlaunch.analysis.published import Compare, known_frameworks
from dlaunch.boundary import display_path, escape, quoted
from dlaunch.errors import DlaunchError
from dlaunch.jobs.request import check_trainer_value
from dlaunch.jobs.sites import load_toml
from dlaunch.paths import REPO, toml_files_by_name
from dlaunch.specs.schema import EnvName, SafeName, StrictModel, parse_time
from dlaunch.train.config import MODELS, SCHEDULES

STUDY_COPY = "study.toml"
STUDY_INFO = "study.json"
# Matrix dimensions: set by the matrix, never by a recipe.
DIMENSIONS = ("framework", "loader", "model", "gpus", "nodes", "schedule")
LOADERS = ("native", "dali")
KINDS = ("gpu", "cpu")

SHIPPED_STUDIES_DIR = REPO / "studies"

LISTS = {
    "framework": "frameworks",
    "loader": "loaders",
    "model": "models",
    "gpus": "gpus",
    "nodes": "nodes",
    "schedule": "schedules",
}  # a dimension -> the matrix's list of its values
Count = Annotated[int, Field(gt=0)]


def _check_recipe(recipe: Dict[str, Any]) -> Dict[str, Any]:
    for name, value in recipe.items():
        if name in DIMENSIONS:
            raise ValueError("%s: set by the matrix (its list of %ss), not by a recipe" % (name, name))
        try:
            check_trainer_value(name, value)
        except DlaunchError as e:
            raise ValueError("%s: %s" % (name, str(e).split(": ", 1)[1])) from None
    return recipe


class Dataset(StrictModel):
    """Data the study needs that this file cannot name (a path on the user's cluster), for `loaders`."""

    description: str
    env: EnvName
    loaders: List[Literal[LOADERS]] = Field(default=list(LOADERS), min_length=1)


class _WithRecipe(StrictModel):
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


class Protocol(StrictModel):
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

    _frameworks = field_validator("frameworks")(known_frameworks)

    @model_validator(mode="after")
    def _counts(self) -> "Matrix":
        if (self.gpus is None) == (self.nodes is None):
            raise ValueError("give exactly one of gpus and nodes")
        lists = self.lists()
        for dimension, values in lists.items():
            twice = [v for v in values if values.count(v) > 1]
            if twice:  # two jobs would get one run directory
                raise ValueError("%s: %s appears twice" % (LISTS[dimension], quoted(twice[0])))
        for i, rule in enumerate(
            self.exclude
        ):  # the matrix has every combination: a rule matches one iff each value is listed
            other = next((key for key in rule if key not in lists), None)
            if other:
                raise ValueError("exclude.%d: %s: the matrix lists %s, not %s" % (i, other, self.count_key, other))
            if not all(value in lists[key] for key, value in rule.items()):
                raise ValueError("exclude.%d: %s matches no job of the matrix" % (i, rule_text(rule)))
        named = [d for d in lists if any(d in rule for rule in self.exclude)]  # only these decide
        if not any(
            not excluded(dict(zip(named, values)), self.exclude)
            for values in itertools.product(*(lists[d] for d in named))
        ):
            raise ValueError("exclude: the exclusions leave no job of the matrix")
        return self

    def lists(self) -> Dict[str, List[Any]]:
        """The matrix's dimensions (framework, loader, model, gpus or nodes, schedule) and their values."""
        return {
            "framework": self.frameworks,
            "loader": self.loaders,
            "model": self.models,
            self.count_key: list(self.gpus or self.nodes or []),
            "schedule": self.schedules,
        }

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
            raise ValueError(
                "dataset: two datasets for loader %s" % next(name for name in covered if covered.count(name) > 1)
            )
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
    return toml_files_by_name(study_dirs())


def find_study(name_or_path: str) -> Path:
    """A study file by path (`x.toml`, or a name with a folder) or by name (aach2023), from any folder."""
    known = available_studies()
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        path = Path(name_or_path)
        if not os.path.lexists(path) and path.stem in known:
            raise DlaunchError(
                "%s: no such file; the study %s is found by its name from any folder (%s)"
                % (escape(name_or_path), path.stem, display_path(known[path.stem]))
            )
        return path
    if name_or_path not in known:
        raise DlaunchError(
            "study %s: no such study (known: %s; or give a path to a .toml)" % (quoted(name_or_path), ", ".join(known))
        )
    return known[name_or_path]


def recorded_study(folder: Path) -> Study:
    """The study file copied into a study directory."""
    if not (folder / STUDY_COPY).is_file():
        raise DlaunchError("%s: not a study directory (no %s; made by `dlaunch study run`)" % (folder, STUDY_COPY))
    return load_study(folder / STUDY_COPY)


def excluded(point: Dict[str, Any], exclusions: Sequence[Dict[str, Any]]) -> bool:
    """Whether a matrix point matches one of the `exclude` rules."""
    return any(all(point.get(k) == v for k, v in rule.items()) for rule in exclusions)


def rule_text(rule: Dict[str, Any]) -> str:
    """An `exclude` rule as a study file writes it, for messages."""
    return "{%s}" % ", ".join("%s = %s" % (k, quoted(v)) for k, v in rule.items())


def choose_protocol(study: Study, protocol: Optional[str]) -> Optional[str]:
    """The protocol a run uses: `--protocol`, else the study's default (None for a study without any)."""
    if protocol is None:
        return study.default_protocol
    if protocol not in study.protocol:
        known = ", ".join(study.protocol) or "none"
        raise DlaunchError(
            "--protocol: study %s has no protocol %r (its protocols: %s)" % (study.name, protocol, known)
        )
    return protocol
