"""A figure of a graph page: the page in headless Chromium, its most influential feature clicked, as a PNG.

    python recipes/graph_figure.py graph.html figure.png
"""

import shutil
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright


def main(page_path: str, out: str) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                             args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1500, "height": 980})
        page.goto(Path(page_path).resolve().as_uri())
        page.wait_for_selector("body[data-paints]")  # the canvas is drawn
        top = page.evaluate("""() => {
            const features = window.anatomyGraph.nodes.map((n, i) => [n, i]).filter(([n]) => n.kind === "feature");
            features.sort((a, b) => (a[0].influence ?? 1) - (b[0].influence ?? 1));
            return features.length ? features[0][1] : null;
        }""")
        if top is not None:  # clicked where the page drew it, as a reader would
            box = page.evaluate("(i) => window.anatomyGraph.clientBox(i)", top)
            page.mouse.click(box["x"], box["y"])
            page.mouse.move(5, 5)
        page.screenshot(path=out)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
