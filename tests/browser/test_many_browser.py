"""The "Many images" page in a real browser: opened from the navigation, a small Shapes batch run, its figure
and downloads seen, then back to the single-image page. Uses tests/browser/conftest.py's server (the tiny test
model) and page; skipped like it where no chromium is installed. Screenshot: tests/artifacts/many_images.png."""

from __future__ import annotations

from support.browser import ARTIFACTS, no_exception, settle


def main_text(browser_page) -> str:
    return browser_page.locator('[data-testid="stMain"]').inner_text()


def test_a_small_shapes_batch_runs_and_shows_its_figure(page, server):
    page.goto(server)
    settle(page)
    page.get_by_role("link", name="Many images").click()
    settle(page)
    no_exception(page)
    assert page.url.endswith("/many-images")
    count = page.get_by_role("spinbutton", name="How many images")
    count.fill("16")
    count.press("Enter")
    settle(page)
    page.get_by_role("button", name="Run").click()
    settle(page)
    no_exception(page)
    text = main_text(page)
    assert "16 images analysed (16 drawn Shapes (seed 0))" in text and "vit_tiny_patch16_224" in text
    figure = page.locator('[data-testid="stMain"] [data-testid="stImage"] img')
    assert figure.count() == 1 and figure.first.evaluate("img => img.complete && img.naturalWidth > 0")
    downloads = page.locator('[data-testid="stDownloadButton"]')
    names = {downloads.nth(i).inner_text().split()[-1] for i in range(downloads.count())}  # after the icon's name
    assert names == {"dataset.npz", "dataset.json", "mean_attention_distance.png", "images.csv"}, names  # no labels here
    page.screenshot(path=str(ARTIFACTS / "many_images.png"), full_page=True)

    page.get_by_role("link", name="One image").click()  # the single-image page is still there, with its tabs
    settle(page)
    no_exception(page)
    assert page.get_by_role("tab", name="5 Attention", exact=True).count() == 1
