"""Loads Ordeal's pytest plugin for the suites and the tests."""

pytest_plugins = ["fixtures.plugin"]
