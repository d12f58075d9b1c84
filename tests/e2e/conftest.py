"""Fixtures of the process-level tests beyond tests/conftest.py's servers: the gateway in process (``api``),
served (``gateway_server``, ``serve_gateway``) and the browser (:mod:`tests.support.gateway`,
:mod:`tests.support.pages`)."""

from tests.support.gateway import api, gateway_server, gateway_settings, operator_key, serve_gateway
from tests.support.pages import browser

__all__ = ["api", "browser", "gateway_server", "gateway_settings", "operator_key", "serve_gateway"]
