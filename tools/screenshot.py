"""``python -m tools.screenshot docs/inspector.png``: shoot the README's picture of the inspector with Chromium.

The live page on the bundled model, 1440 px wide, whole page: a story prompt, layer 2's query head 3
attention weights with its equation and code line, that head ablated (the next-token distribution before
and after), the logit lens and the direct attribution. The PNG keeps, in a text chunk, the labelled
sections the page showed when it was shot (``glassllm-sections``); tests/test_readme_figures.py checks them
against the page's sections, so a panel added to the page asks for a new picture.
"""

from __future__ import annotations

import io
import sys
import tempfile

PROMPT = "Once upon a time, there was a little dog named Max. He liked to run and play with his red ball."
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
KEY = "glassllm-sections"


def sections(page) -> list[str]:
    """The aria-labels of the page's visible cards, top to bottom."""
    return page.evaluate("""() => [...document.querySelectorAll("section[aria-label]")]
        .filter((s) => s.offsetParent !== null).map((s) => s.getAttribute("aria-label"))""")


def shoot(path) -> list[str]:
    from PIL import Image, PngImagePlugin
    from playwright.sync_api import sync_playwright

    from glassllm.checkpoint import load_bundled
    from glassllm.files import atomic_write
    from glassllm.inspector import Inspector, create_app
    from glassllm.inspector.server import Server

    model, tokenizer, meta = load_bundled()
    server = Server(create_app(Inspector(model, tokenizer, meta=meta), prompt=PROMPT), "127.0.0.1", 0).start()
    try:
        with tempfile.TemporaryDirectory(prefix="glassllm-chromium-") as profile, sync_playwright() as p:
            context = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=ARGS,
                                                           viewport={"width": 1440, "height": 1000},
                                                           device_scale_factor=1, bypass_csp=True)
            page = context.new_page()
            page.goto(server.url)
            page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=120_000)
            page.evaluate("() => window.glass.select({name: 'attn.softmax', layer: 2, head: 3})")
            page.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 2, head: 3})")
            page.evaluate("() => window.glass.idle()")
            shown = sections(page)
            png = page.screenshot(full_page=True)
            context.close()
    finally:
        server.stop()
    image = Image.open(io.BytesIO(png))
    info = PngImagePlugin.PngInfo()
    info.add_text(KEY, "\n".join(shown))
    out = io.BytesIO()
    image.save(out, format="png", pnginfo=info, optimize=True)
    atomic_write(path, out.getvalue())
    return shown


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tools.screenshot docs/inspector.png")
    print("sections shown:", ", ".join(shoot(sys.argv[1])))
