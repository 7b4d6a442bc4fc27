"""The scenarios, each registered with harness.suite.scenario as its module is imported:
they run in this order."""

from harness.scenarios import basic, exits, culprits, mps, many  # noqa: F401
