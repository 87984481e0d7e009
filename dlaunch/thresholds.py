"""The straggler threshold's default, below the layers that apply it: a site profile's
`straggler_threshold` (dlaunch/jobs/sites.py) and the judgement of a run without a profile or option
(dlaunch/analysis/stragglers.py: threshold_of). Reading a profile (`dlaunch run --dry-run`) imports no analysis."""

# A rank whose forward pass takes more than this fraction longer than the median rank's (a real rank: of 2 the
# faster; stragglers.forward_excess) is a straggler; a GPU whose clock is below (1 - this) of its maximum, with a
# throttle reason, is throttled.
DEFAULT_THRESHOLD = 0.10
