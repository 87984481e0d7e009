"""`dlaunch run --repeat N` (and `sweep --repeat N`, per count): N runs of one request in one experiment, for medians
and their spread.

The runs are `<run name>-r1` ... `<run name>-rN` (the run name defaults to a time stamp, as for one
run; a sweep's is its count's, `n0004`), side by side in the experiment's folder, so `dlaunch report` groups them at
one GPU count and gives the median and spread of each figure. They are submitted as every command submits runs
(dlaunch/runs/service.py: every run directory checked free first, a refusal stops the rest); on
`--site local` they run one after the other.
"""

import dataclasses
from typing import List

from dlaunch.jobs.request import LaunchRequest
from dlaunch.runs.rundir import default_run_name


def repeat_names(base: str, repeats: int) -> List[str]:
    """`base-r1` ... `base-rN`: deterministic, sorted in submission order up to 9 repeats (r01.. beyond)."""
    width = len(str(repeats)) if repeats > 9 else 1
    return ["%s-r%0*d" % (base, width, i) for i in range(1, repeats + 1)]


def repeat_requests(request: LaunchRequest, repeats: int) -> List[LaunchRequest]:
    """`repeats` copies of `request`, named by `repeat_names`."""
    base = request.run_name or default_run_name()
    return [dataclasses.replace(request, run_name=name) for name in repeat_names(base, repeats)]
