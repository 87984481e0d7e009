"""Where runstate.py and doctor.py still import a run's network check from: `network_problems` and
`describe` are dlaunch/jobs/network.py's (beside the profile's `[network]` they judge, below both
dlaunch/runs/ and dlaunch/analysis/). The two imports move there next, and this module goes."""
from dlaunch.jobs.network import describe, network_problems

__all__ = ["describe", "network_problems"]
