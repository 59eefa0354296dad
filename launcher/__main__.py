"""``python -m launcher``: the run-worker pool process (see `launcher.pool`)."""

import sys

from launcher.pool import main

sys.exit(main())
