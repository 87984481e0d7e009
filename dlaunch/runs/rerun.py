"""`dlaunch rerun RESULT --site OTHER` (dlaunch/cli/rerun.py): a result (metrics file, run directory, or a run
inside an archive made by `dlaunch archive`) turned back into a job on another site.

The metrics header holds the abstract request (framework, GPU count, trainer options:
`metrics_schema.abstract_request`) apart from the resolved launch (site, image, versions, hosts,
script hash). The request is resolved again against the new site by the run service; what differs
is said attribute by attribute. The new run links its parent: `parent.json` in its run directory
and `DLAUNCH_PARENT_RUN`, which the trainer writes into its header as `parent_run`.
"""

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Tuple

from dlaunch.boundary import escape
from dlaunch.errors import DlaunchError
from dlaunch.jobs.request import FLAGS_BY_NAME, LaunchRequest
from dlaunch.runs import service
from dlaunch.train.metrics_schema import METRICS_FILE, Metrics, MetricsError, abstract_request, read_metrics

PARENT_FILE = "parent.json"


def read_result(result: Path) -> Tuple[Metrics, str]:
    """(metrics, what it is called) of a metrics file, a run directory, or ARCHIVE.tar.gz:RUN/metrics.jsonl."""
    text = str(result)
    if ".tar.gz:" in text:
        from dlaunch.runs.archive import read_member

        archive, member = text.split(".tar.gz:", 1)
        bundle = Path(archive + ".tar.gz")
        return read_member(bundle, member), "%s:%s" % (bundle.resolve(), member)
    if text.endswith(".tar.gz") and result.is_file():
        from dlaunch.runs.archive import archive_runs

        raise DlaunchError(
            "%s: an archive: name the run in it, as %s:EXPERIMENT/RUN (its runs: %s)"
            % (escape(text), escape(text), archive_runs(result))
        )
    path = result / METRICS_FILE if result.is_dir() else result
    if not path.is_file():
        raise DlaunchError(
            "%s: no metrics file (give a metrics.jsonl, a run directory or ARCHIVE.tar.gz:RUN)" % escape(str(result))
        )
    try:
        return read_metrics(str(path)), str(path.resolve())
    except MetricsError as e:
        raise DlaunchError(str(e)) from None


def _typed(name: str, value: Any) -> Any:
    """A header's option value as the launcher's flag takes it (e.g. --zero-stage is a choice of strings)."""
    flag = FLAGS_BY_NAME[name]
    return str(value) if flag.kind is str and not isinstance(value, str) else value


def request_of(
    metrics: Metrics,
    site: str,
    nodes: Optional[int],
    gpus: Optional[int],
    output: Optional[str],
    data: Optional[str],
    allow_large: bool = False,
) -> LaunchRequest:
    """The result's request for `site`: its framework and trainer options, its GPU count unless told otherwise."""
    asked = abstract_request(metrics.header)
    options = {k: _typed(k, v) for k, v in asked["options"].items() if k in FLAGS_BY_NAME}
    if data:
        options["data"] = data
    count = {"nodes": nodes} if nodes else {"gpus": gpus or asked["world_size"]}
    experiment = "rerun-%s" % re.sub(r"[^A-Za-z0-9_.+-]", "-", metrics.header.get("experiment") or "run")[:100]
    return LaunchRequest(
        site=site,
        framework=asked["framework"],
        output=output,
        experiment=experiment,
        trainer=tuple(options.items()),
        allow_large=allow_large,
        **count,
    )


def differences(metrics: Metrics, request: LaunchRequest, plan: Any) -> List[Tuple[str, str, str]]:
    """(attribute, parent, rerun) for every attribute that differs, the request's options included."""
    h = metrics.header
    parent_options = abstract_request(h)["options"]
    per_node = max(1, h["world_size"] // max(1, h["nodes"]))
    pairs: List[Tuple[str, Any, Any]] = [
        ("site", h.get("site"), plan.site),
        ("scheduler", h.get("scheduler"), plan.scheduler),
        ("nodes", h["nodes"], plan.nodes),
        ("processes per node", per_node, plan.nproc_per_node),
        ("GPUs (world size)", h["world_size"], plan.nodes * plan.nproc_per_node),
        (
            "global batch",
            h["global_batch"],
            plan.nodes * plan.nproc_per_node * (request.option("batch-size") or h["batch_per_worker"]),
        ),
        ("image", h.get("image"), plan.image),
        ("dlaunch revision", h.get("git_revision"), dict(plan.env).get("DLAUNCH_GIT_REVISION")),
        ("hosts", ",".join(sorted(set(h["hosts"]))), "allocated when it runs"),
        ("device", h["device"], "known when it runs"),
    ]
    for name in sorted(set(parent_options) | {k for k, _ in request.trainer}):
        pairs.append(("--" + name, parent_options.get(name), request.option(name)))
    for name, version in sorted((h.get("versions") or {}).items()):
        pairs.append(("version " + name, version, "the image's (known when it runs)"))
    return [(a, "-" if p is None else str(p), "-" if r is None else str(r)) for a, p, r in pairs if str(p) != str(r)]


@dataclass(frozen=True)
class Rerun:
    """A result's job for another site, rendered (nothing written): the job (its run directory gets `parent.json`),
    the parent it came from, and what differs from it, attribute by attribute."""

    job: service.Prepared
    parent: str  # the parent's metrics file (or ARCHIVE.tar.gz:RUN/metrics.jsonl)
    differences: List[Tuple[str, str, str]]  # (attribute, parent, rerun)


def prepare_rerun(
    result: Path,
    site: str,
    nodes: Optional[int] = None,
    gpus: Optional[int] = None,
    dry_run: bool = False,
    output: Optional[str] = None,
    data: Optional[str] = None,
    allow_large: bool = False,
) -> Rerun:
    """The result's job on `site` (its request resolved there by the run service), with what differs from the parent;
    `service.submit_all` submits its job."""
    if nodes and gpus:
        raise DlaunchError("--nodes/--gpus: give one of them")
    metrics, parent = read_result(result)
    try:
        asked = request_of(metrics, site, nodes, gpus, output, data, allow_large)
    except DlaunchError as e:  # what the header recorded, not what was typed here
        raise DlaunchError("%s: header: %s" % (escape(parent), e)) from None
    environ = dict(os.environ, DLAUNCH_PARENT_RUN=parent)  # the script exports it: the trainer's `parent_run`
    job = service.prepare(asked, dry_run=dry_run, environ=environ)
    rows = differences(metrics, job.request, job.plan)
    link = (
        json.dumps(
            {
                "parent": parent,
                "run_id": metrics.header["run_id"],
                "differences": [dict(zip(("attribute", "parent", "rerun"), r)) for r in rows],
            },
            indent=2,
        )
        + "\n"
    )
    return Rerun(dataclasses.replace(job, files=((PARENT_FILE, link),)), parent, rows)
