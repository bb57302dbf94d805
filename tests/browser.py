"""A headless Chromium for the browser tests: Debian's ``chromium`` package driven by Playwright's
Python API (``executable_path``; Playwright's own browser download is never used). When the binary
is missing the tests skip with a message naming the package; ``.ci/run`` installs it.

``console_errors(page)`` collects what the page logs as errors (console ``error``, uncaught
exceptions, failed requests), so a test can assert there are none.
"""

from __future__ import annotations

import os
import shutil

CHROMIUM = os.environ.get("INFER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def chromium_missing() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"needs a chromium binary at {CHROMIUM}: apt-get install chromium"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "needs playwright (pip install playwright; its browser download is not needed)"
    return None


def console_errors(page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url} {req.failure}"))
    return errors


def save_screenshot(page, path, colors: int = 64, full_page: bool = True) -> None:
    """A PNG of the page, reduced to a small palette so it stays small in the repository."""
    from io import BytesIO

    from PIL import Image

    image = Image.open(BytesIO(page.screenshot(full_page=full_page))).convert("RGB")
    image.quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
