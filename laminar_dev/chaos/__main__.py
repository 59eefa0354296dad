"""``python -m laminar_dev.chaos``: run the chaos suite from a checkout of the repository."""

from .suite import main

if __name__ == "__main__":  # not when a tool walks the package and imports every module
    raise SystemExit(main())
