"""A real headless Chromium for page tests: Playwright driving Debian's ``chromium`` (``scripts/setup.sh``
installs it; Playwright's own browser builds cannot be downloaded here)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = os.environ.get("LITELLM_KV_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium() -> Iterator[Any]:
    """A started browser (``playwright.sync_api.Browser``), closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def sign_in(page: Any, proxy_url: str, key: str) -> None:
    """Open the admin page of the proxy at ``proxy_url`` and sign in with ``key`` (what follows is the test's)."""
    page.goto(proxy_url + "/litellm-kv/ui")
    page.fill("#admin-key", key)
    page.click("#signin-form button[type=submit]")


def admin_tab(browser: Any, proxy_url: str, key: str, tab: str) -> Any:
    """A new page of ``browser`` signed in to the proxy's admin page with ``key``, on ``tab`` (``owner``, ``fleet``)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, proxy_url, key)
    page.wait_for_selector("#app:not([hidden])")
    page.click(f"#tab-{tab}")
    return page
