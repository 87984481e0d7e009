"""A run directory: `job.sh`, `plan.json`, `job_id`, `state`, logs, `metrics.jsonl`, `checkpoints/`."""
import json
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

from launcher.atomic import write_atomic
from launcher.errors import DlaunchError
from train.metrics_schema import METRICS_FILE

if TYPE_CHECKING:
    from launcher.schedulers import Scheduler


def display_path(path: Path) -> str:
    """`path` relative to the working directory when it lies below it."""
    rel = os.path.relpath(path)
    return path.as_posix() if rel.startswith("..") else rel


def default_run_name() -> str:
    """A time stamp to the millisecond and 4 random hex digits: runs submitted in a loop never collide."""
    now = time.time()
    return "%s-%03d-%s" % (time.strftime("%Y%m%d-%H%M%S", time.localtime(now)), int(now * 1000) % 1000,
                           secrets.token_hex(2))


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
        try:
            return (self.path / name).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None

    def write_plan(self, plan: Dict[str, Any], request: Dict[str, Any]) -> None:
        self.write("plan.json", json.dumps({"plan": plan, "request": request}, indent=2, sort_keys=True) + "\n")

    def plan(self) -> Dict[str, Any]:
        try:
            return json.loads(self.read("plan.json") or "")
        except ValueError as e:
            raise DlaunchError("%s: unreadable plan.json: %s" % (self.path, e)) from None

    @property
    def job_id(self) -> Optional[str]:
        return self.read("job_id")

    @property
    def state(self) -> Optional[str]:
        return self.read("state")

    def set_state(self, state: str) -> None:
        self.write("state", state.replace("\n", " ") + "\n")

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def scheduler(self) -> "Scheduler":
        """The backend that ran the job (plan.json's `scheduler`)."""
        from launcher.schedulers import scheduler_for  # pydantic: not for every command's start-up

        return scheduler_for(self.plan()["plan"]["scheduler"])

    def log_files(self) -> List[Path]:
        """The job's logs, oldest first, as its scheduler names them."""
        return self.scheduler.log_files(self.path)


def find_runs(paths: Iterable[Path]) -> List[RunDir]:
    """Run directories at or below each path (output/experiment/run, a study's deeper folders), in
    path order; the folders inside a run directory are not searched."""
    runs = []
    for path in paths:
        for folder, subfolders, files in os.walk(path):
            if "plan.json" in files:
                runs.append(RunDir(Path(folder)))
                subfolders.clear()
            subfolders.sort()
    return runs


def newest_first(runs: Iterable[RunDir]) -> List[RunDir]:
    """Runs by the time of their last submission (plan.json is written then), newest first."""
    return sorted(runs, key=lambda run: (run.path / "plan.json").stat().st_mtime, reverse=True)
