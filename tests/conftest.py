"""Test configuration: the project's own testing kit provides the fixtures."""

pytest_plugins = ["trio_harness.testing"]
