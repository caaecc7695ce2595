"""The trigger engine's load generator: ``python -m bench <workload>`` (see bench/README.md)."""
