"""Benchmarks are run by hand (python tests/bench/<name>.py), never collected by pytest."""

collect_ignore_glob = ["*"]
