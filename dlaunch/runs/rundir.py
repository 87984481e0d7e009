"""A run directory: `job.sh`, `plan.json`, `site.toml` (the profile text the job was made from), `job_id`,
`state`, logs, `metrics.jsonl`, `checkpoints/`. Its files are read through dlaunch/boundary.py."""

import functools
import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from dlaunch.atomic import write_atomic
from dlaunch.boundary import JOB_ID, display_path, escape, read_json, read_text, whole
from dlaunch.errors import DlaunchError
from dlaunch.paths import JOB_ID_FILE, SITE_PROFILE, STATE_FILE
from dlaunch.train.metrics_schema import METRICS_FILE

if TYPE_CHECKING:
    from dlaunch.jobs.request import LaunchRequest
    from dlaunch.jobs.sites import Site
    from dlaunch.schedulers import Scheduler

# The files a run's snapshot is made from, besides its logs (dlaunch/runs/statuscache.py).
SNAPSHOT_FILES = ("plan.json", JOB_ID_FILE, STATE_FILE, METRICS_FILE, SITE_PROFILE)


def default_run_name() -> str:
    """A time stamp to the millisecond and 4 random hex digits: runs submitted in a loop never collide."""
    now = time.time()
    return "%s-%03d-%s" % (
        time.strftime("%Y%m%d-%H%M%S", time.localtime(now)),
        int(now * 1000) % 1000,
        secrets.token_hex(2),
    )


@functools.lru_cache(maxsize=16)
def _profile_named(site: str) -> "Optional[Site]":
    from dlaunch.jobs.sites import resolve_site

    try:
        return resolve_site(site)
    except DlaunchError:
        return None


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, path: Path) -> "RunDir":
        """A new, empty run directory (refuses to reuse one: use --resume for that)."""
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            raise DlaunchError("run directory %s exists (choose --run-name, or --resume it)" % path) from None
        (path / "checkpoints").mkdir()
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> "RunDir":
        """An existing run directory (one with plan.json)."""
        run = cls(path)
        if not (run.path / "plan.json").is_file():
            raise DlaunchError("%s: not a dlaunch run directory (no plan.json)" % path)
        return run

    def write(self, name: str, text: str, mode: int = 0o644) -> None:
        write_atomic(self.path / name, text, mode)

    def read(self, name: str) -> Optional[str]:
        """A file of the run directory (UTF-8, not through a link, bounded: dlaunch/boundary.py), None when missing."""
        path = self.path / name
        return read_text(path, follow_links=False).strip() if os.path.lexists(path) else None

    def write_plan(self, plan: Dict[str, Any], request: Dict[str, Any]) -> None:
        self.write("plan.json", json.dumps({"plan": plan, "request": request}, indent=2, sort_keys=True) + "\n")

    def plan(self) -> Dict[str, Any]:
        """plan.json, validated (dlaunch/runs/runfiles.py): its `plan` has a known `scheduler` and a `site`."""
        from dlaunch.runs.runfiles import PlanFile

        return read_json(self.path / "plan.json", PlanFile, follow_links=False).model_dump()

    def request(self) -> "LaunchRequest":
        """The request plan.json recorded, every field checked."""
        from dlaunch.runs.runfiles import stored_request

        return stored_request(self.plan()["request"], display_path(self.path / "plan.json"))

    @property
    def job_id(self) -> Optional[str]:
        job_id = self.read(JOB_ID_FILE)
        if job_id is not None and not whole(JOB_ID, job_id):
            raise DlaunchError(
                "%s: %s is not a job id" % (display_path(self.path / JOB_ID_FILE), escape(repr(job_id[:80])))
            )
        return job_id

    @property
    def state(self) -> Optional[str]:
        """The state file's line, control characters escaped (it is shown as it is)."""
        state = self.read(STATE_FILE)
        return escape(state) if state is not None else None

    def profile(self) -> "Optional[Site]":
        """The site profile the run was made from: the text it kept (site.toml), else the profile its
        request names (runs made before they kept one); None when neither can be read."""
        from dlaunch.analysis.stragglers import kept_profile

        try:
            if os.path.lexists(self.path / SITE_PROFILE):
                return kept_profile(self.path)  # None for a link
            return _profile_named(self.request().site)
        except DlaunchError:
            return None

    @functools.cached_property
    def kept(self) -> Tuple[List[Any], Optional[Dict[str, Any]]]:
        """(the files' states as this object first looked, the snapshot the status cache keeps for the run
        if it has ended and its files are unchanged: dlaunch/runs/statuscache.py)."""
        from dlaunch.runs import statuscache

        return statuscache.current().lookup(self.path, SNAPSHOT_FILES)

    def check(self) -> None:
        """Read what a listing of runs reads (plan.json, job_id, state): DlaunchError naming the file
        that is broken, so that the listing rejects this run and shows the others. A run the status
        cache keeps was read whole when it was kept, and has not changed since."""
        if self.kept[1] is None:
            _ = (self.plan(), self.job_id, self.state)

    def set_state(self, state: str) -> None:
        self.write(STATE_FILE, state.replace("\n", " ") + "\n")

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def scheduler(self) -> "Scheduler":
        """The backend that ran the job (plan.json's `scheduler`)."""
        from dlaunch.schedulers import scheduler_for  # pydantic: not for every command's start-up

        return scheduler_for(self.plan()["plan"]["scheduler"])

    def log_files(self) -> List[Path]:
        """The job's logs, oldest first, as its scheduler names them."""
        return self.scheduler.log_files(self.path)


def find_runs(paths: Iterable[Path]) -> List[RunDir]:
    """Run directories at or below each path (output/experiment/run, a study's deeper folders), in
    path order; the folders inside a run directory are not searched (nor listed: a folder holding a
    plan.json is taken without reading the rest of it), nor are linked folders."""
    runs = []
    for path in paths:
        todo = [os.fspath(path)]
        while todo:
            folder = todo.pop()
            try:
                is_run = not stat.S_ISDIR(os.lstat(os.path.join(folder, "plan.json")).st_mode)
            except OSError:
                is_run = False
            if is_run:
                runs.append(RunDir(Path(folder)))
                continue
            try:
                with os.scandir(folder) as entries:
                    subfolders = sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
            except OSError:
                continue
            todo.extend(os.path.join(folder, name) for name in reversed(subfolders))
    return runs


def readable(runs: Iterable[RunDir]) -> Tuple[List[RunDir], List[str]]:
    """(runs whose files a listing can read, one message per run that it cannot, naming the file)."""
    ok, rejected = [], []
    for run in runs:
        try:
            run.check()
        except DlaunchError as e:
            rejected.append(str(e))
            continue
        ok.append(run)
    return ok, rejected


def newest_first(runs: Iterable[RunDir]) -> List[RunDir]:
    """Runs by the time of their last submission (plan.json is written then), newest first."""
    return sorted(runs, key=lambda run: (run.path / "plan.json").lstat().st_mtime, reverse=True)  # a dangling link too
