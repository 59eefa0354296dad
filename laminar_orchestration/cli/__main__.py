"""``python -m laminar_orchestration.cli``: the `laminar` command without the console script."""

from laminar_orchestration.cli import run

if __name__ == "__main__":  # not when a tool walks the package and imports every module
    run()
