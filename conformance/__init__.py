"""Conformance harness for guided generation: the JSON Schema Test Suite, MaskBench and
JSONSchemaBench measured against our matcher (see `python -m conformance.run --help`)."""
