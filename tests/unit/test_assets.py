"""The README's pictures (assets/*.png, made by tools/make_assets.py from the real app) show today's app: the tab
labels and the sidebar's pages recorded beside them when they were made are the app's labels now. When this fails,
run `.venv/bin/python -m tools.make_assets` (offline, a few minutes) and commit the new pictures."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from dashboard.views import VIEWS

REPO = Path(__file__).resolve().parents[2]


def page_titles() -> list[str]:
    """The st.Page titles of dashboard/app.py, in order (read from its source: importing it would run the app)."""
    tree = ast.parse((REPO / "dashboard" / "app.py").read_text())
    return [kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Page"
            for kw in node.keywords if kw.arg == "title"]


def test_the_pictures_show_todays_tab_labels_and_pages():
    shown = json.loads((REPO / "assets" / "labels.json").read_text())
    assert shown["tabs"] == list(VIEWS), "the tabs changed since assets/*.png were made: run tools/make_assets"
    assert shown["pages"] == page_titles(), "the pages changed since assets/*.png were made: run tools/make_assets"
