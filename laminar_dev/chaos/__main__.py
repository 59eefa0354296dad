"""``python -m laminar_dev.chaos``: run the chaos suite from a checkout of the repository."""

from .suite import main

raise SystemExit(main())
