"""Fixtures of the process-level tests beyond tests/conftest.py's servers: the gateway in process (``api``),
served (``gateway_server``, ``serve_gateway``) and the browser (:mod:`tests.support.gateway`,
:mod:`tests.support.pages`). Every test beneath this folder carries the ``e2e`` marker: speed is told
by folder, so ``-m "not e2e"`` runs the unit tests alone."""

from pathlib import Path

import pytest

from tests.support.gateway import api, gateway_server, gateway_settings, operator_key, serve_gateway
from tests.support.pages import browser

__all__ = ["api", "browser", "gateway_server", "gateway_settings", "operator_key", "serve_gateway"]


HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
