"""``python -m laminar_orchestration.cli``: the `laminar` command without the console script."""

from . import main

raise SystemExit(main())
