"""Shared test options: real-cluster tests are opt-in (`--with-e2e` and a KUBECONFIG)."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--with-e2e", action="store_true", default=False, help="run tests against a real cluster"
    )
    parser.addoption("--skip-slow", action="store_true", default=False, help="skip the slow chaos runs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    with_e2e = config.getoption("--with-e2e") and os.environ.get("KUBECONFIG")
    for item in items:
        if "e2e" in item.keywords and not with_e2e:
            item.add_marker(pytest.mark.skip(reason="needs --with-e2e and KUBECONFIG"))
        if "slow" in item.keywords and config.getoption("--skip-slow"):
            item.add_marker(pytest.mark.skip(reason="--skip-slow"))
