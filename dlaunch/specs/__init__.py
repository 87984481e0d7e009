"""The job's building blocks, below the backends (dlaunch/schedulers/, dlaunch/runtimes/) and the job layer
(dlaunch/jobs/): the neutral job and its typed script lines (`job.py`), the validated parts of site profiles
(`schema.py`), a backend's row in its registry (`registration.py`)."""
