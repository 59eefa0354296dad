"""Operator tools: audits, the ownership report, the anti-entropy sweep and the demo.

May import every layer below: `control`, `dataplane`, `protocol`, `store` and
the package root. Never the CLI.
"""
