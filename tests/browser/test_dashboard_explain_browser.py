"""The Interventions tab in a real browser: clicking a patch on the image toggles it in the dropped set
(AppTest can't click a plotly chart). Uses tests/browser/conftest.py's server (the tiny test model) and page;
skipped like it where no chromium is installed."""

from __future__ import annotations

from support.browser import ARTIFACTS, no_exception, settle


def chosen_patches(browser_page) -> list[str]:
    box = browser_page.locator('[data-testid="stMultiSelect"]').filter(has_text="Patches (or click the image)")
    return [line for line in box.inner_text().split("\n") if line.startswith("patch ")]


def target_probability(browser_page) -> str:
    return browser_page.locator('[data-testid="stMetric"]').first.locator('[data-testid="stMetricValue"]').inner_text()


def click_patch(browser_page, k: int) -> None:
    chart = browser_page.locator('[data-testid="stPlotlyChart"]').first
    chart.scroll_into_view_if_needed()
    chart.locator(".scatterlayer .point").nth(k).click(force=True)
    settle(browser_page)


def panel_text(browser_page) -> str:
    return browser_page.locator('[role="tabpanel"]:visible').inner_text()


def test_clicking_a_patch_drops_it_and_clicking_again_brings_it_back(page, server):
    page.goto(f"{server}/?view=Interventions")
    settle(page)
    no_exception(page)
    original = target_probability(page)
    assert chosen_patches(page) == []

    click_patch(page, 20)
    no_exception(page)
    assert chosen_patches(page) == ["patch 20"]
    assert "After: 1 patch(es) dropped" in panel_text(page)
    click_patch(page, 21)
    assert chosen_patches(page) == ["patch 20", "patch 21"]
    assert "After: 2 patch(es) dropped" in panel_text(page) and "the blocks see 195 tokens" in panel_text(page)
    page.screenshot(path=str(ARTIFACTS / "view_interventions_clicked.png"), full_page=True)

    click_patch(page, 20)  # a second click on the same patch: a new event (a fresh chart), not a deselection
    assert chosen_patches(page) == ["patch 21"]
    assert "After: 1 patch(es) dropped" in panel_text(page)
    page.get_by_role("button", name="Reset").click()
    settle(page)
    assert chosen_patches(page) == [] and target_probability(page) == original
    assert "After: no intervention" in panel_text(page)
