"""Distributed trigger engine: fires cron, interval and one-shot timers from a SQL store.

See README.md for use and docs/design.md for the design.
"""

__version__ = "0.1.0"
