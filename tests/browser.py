"""Open an HTML page vitlab wrote in a real headless browser (Debian's chromium through chromedriver and Selenium)
and report what a reader would see: images that failed to load, console errors, uncaught exceptions, the text.

The browser is found at VITLAB_CHROMIUM / VITLAB_CHROMEDRIVER or the Debian paths. Where it is missing the tests
that need it are skipped, unless VITLAB_REQUIRE_BROWSER=1 (set by .ci/run, which installs it): then they fail.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("VITLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("VITLAB_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"

# Every <img> on the page: did it decode, and how big is it.
_IMAGES_JS = """return Array.from(document.images).map(function (i) {
  return {src: i.getAttribute('src').slice(0, 48), complete: i.complete, width: i.naturalWidth,
          height: i.naturalHeight, alt: i.getAttribute('alt') || ''};
});"""


@dataclass
class PageView:
    """What the browser saw: `images` (one dict per <img>), `errors` (SEVERE console entries: failed loads,
    console.error, uncaught exceptions), `text` (the visible text), `title`."""

    images: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    text: str = ""
    title: str = ""

    def broken_images(self) -> list[dict]:
        return [i for i in self.images if not i["complete"] or i["width"] == 0 or i["height"] == 0]


def browser_available() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def require_browser() -> None:
    """Skip the calling test when no browser is installed, or fail it where CI promised one."""
    if browser_available():
        pytest.importorskip("selenium", reason="selenium not installed (pip install 'vitlab[test]')")
        return
    message = f"headless chromium not found ({CHROMIUM}, {CHROMEDRIVER}): apt-get install chromium chromium-driver"
    if os.environ.get("VITLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)


class Browser:
    """One headless chromium session; `view(path)` loads a local file and reads it back."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,2000", "--allow-file-access-from-files"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(60)

    def view(self, path: str | Path) -> PageView:
        d = self.driver
        d.get_log("browser")  # drop what an earlier page left
        d.get(Path(path).resolve().as_uri())
        d.execute_async_script(  # wait until every image has either decoded or failed
            "var done = arguments[arguments.length - 1];"
            "Promise.all(Array.from(document.images).map(function (i) {"
            "  return i.complete ? null : new Promise(function (r) { i.onload = i.onerror = r; }); }))"
            ".then(function () { done(); });")
        errors = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
        return PageView(images=d.execute_script(_IMAGES_JS), errors=errors,
                        text=d.find_element("tag name", "body").text, title=d.title)

    def close(self) -> None:
        self.driver.quit()


def assert_page_reads(view: PageView, *, numbers: list[str], min_images: int = 1) -> None:
    """Every image decoded, no console errors, at least `min_images` images, and each of `numbers` visible."""
    assert not view.errors, f"console errors: {view.errors}"
    assert len(view.images) >= min_images, f"{len(view.images)} images on the page, expected >= {min_images}"
    assert not view.broken_images(), f"images that did not load: {view.broken_images()}"
    missing = [n for n in numbers if n not in view.text]
    assert not missing, f"numbers not visible on the page: {missing}"
