"""A page opened in a real browser, headless, for tests that check what it shows and what it asks for.

The browser is Debian's Chromium (`make test` installs it when it is missing), driven by
Playwright: Playwright's own browser builds are never used (`playwright install` downloads them, and
this machine reaches no such host). Chromium's flags keep it from calling home at start (without
`--disable-background-networking` and its kin it tries to reach Google's services), and let it run as
root (`--no-sandbox`) without a GPU. Every request the page makes is recorded; any that is not for a
local file is aborted.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image
from playwright.sync_api import ConsoleMessage, Page, Route, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Visit:
    """One page loaded in the browser, and what happened while it loaded."""

    page: Page
    url: str
    console_errors: list[str] = field(default_factory=list)
    """Console messages of type error, and uncaught exceptions (a violation of the page's
    Content-Security-Policy shows here too)."""
    requests: list[str] = field(default_factory=list)
    """The URL of every request the page made, its own included."""
    aborted: list[str] = field(default_factory=list)
    """Requests for anything but a local file: aborted."""

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    def _route(self, route: Route) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            self.aborted.append(route.request.url)
            route.abort()


@contextlib.contextmanager
def visit(path: Path, width: int = 1280, height: int = 900) -> Iterator[Visit]:
    """`path` opened in headless Chromium, loaded; the browser is closed when the block ends."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's package", pytrace=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            seen = Visit(page, path.resolve().as_uri())
            page.on("console", seen._console)
            page.on("pageerror", lambda error: seen.console_errors.append(f"uncaught: {error}"))
            page.on("request", lambda request: seen.requests.append(request.url))
            page.route("**/*", seen._route)
            page.goto(seen.url, wait_until="load")
            yield seen
        finally:
            browser.close()


def colours(png: bytes) -> dict[tuple[int, int, int], int]:
    """How many pixels of each colour a screenshot has."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    counts = image.getcolors(maxcolors=image.width * image.height) or []
    return {colour: count for count, colour in counts}


def has_colour(counts: dict[tuple[int, int, int], int], hex_colour: str, pixels: int = 20) -> bool:
    """Whether at least `pixels` pixels are of `hex_colour` (#rrggbb), give or take 2 in each channel."""
    wanted = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    near = sum(
        n for colour, n in counts.items() if all(abs(a - b) <= 2 for a, b in zip(colour, wanted, strict=True))
    )
    return near >= pixels
