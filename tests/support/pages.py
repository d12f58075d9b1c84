"""The dashboard in real headless Chromium (Debian's, driven by Playwright; never a downloaded
browser): the ``browser`` fixture (re-exported by ``tests/support/gateway.py``), a page on a served
gateway, and screenshots of the views for the README (``docs/screenshots/``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.support import REPO

if TYPE_CHECKING:  # the conftest imports this module for its fixture: no import cycle at run time
    from tests.support.gateway import GatewayServer

CHROMIUM = os.environ.get("RESONTECH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = REPO / "docs" / "screenshots"
"""Where the tests leave a picture of each view (linked from the README)."""
expect.set_options(timeout=10_000)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        await chromium.close()


class Dashboard:
    """A page on the served dashboard; uncaught script errors are collected in ``errors``."""

    def __init__(self, page: Page, server: GatewayServer) -> None:
        self.page = page
        self.server = server
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    async def sign_in(self, key: str) -> None:
        await self.page.fill("#key", key)
        await self.page.click("#sign-in-form button[type=submit]")

    def job(self, job_id: str, column: str) -> Any:
        return self.page.locator(f'tr[data-job="{job_id}"] [data-col="{column}"]')

    async def screenshot(self, name: str) -> Path:
        """A picture of the page as it is now, as ``docs/screenshots/<name>.png``."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        await self.page.screenshot(path=str(path), full_page=False)
        return path


async def open_dashboard(browser: Browser, server: GatewayServer) -> Dashboard:
    page = await browser.new_page(viewport={"width": 1500, "height": 900})
    dashboard = Dashboard(page, server)
    await page.goto(server.url + "/")
    return dashboard
