"""`python -m dlaunch.cli ...` is `dlaunch ...`."""

import sys

from dlaunch.cli import main

sys.exit(main())
