"""Example processors, each a real program: run one with ``laminar init --schema examples/<name>.yaml
--processor examples.<name>:processor`` (see the README)."""
