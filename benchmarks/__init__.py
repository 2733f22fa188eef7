"""Benchmarks of guided generation (`python -m benchmarks.guided`)."""
