"""vit_core.plots: the one Fig. 7 (right) builder, shared by the dashboard's Distance tab, the Many images page and
the `dataset` command's PNG."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
from PIL import Image

from vit_core import analyses, plots

GRID, PATCH = (4, 5), (8, 8)


def size_of(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(data)) as im:
        return im.size


def test_each_drawing_is_a_png_and_the_same_arrays_draw_the_same_bytes():
    rng = np.random.default_rng(0)
    mad = rng.uniform(0, 40, size=(3, 4)).astype(np.float32)  # (L, H)
    uniform = analyses.uniform_attention_distance(GRID, PATCH)
    alone = plots.attention_distance_png(mad, uniform, title="one image")
    with_average = plots.attention_distance_png(mad, uniform, average=mad * 0.5, num_images=2, title="t")
    with_spread = plots.attention_distance_png(mad, uniform, spread=mad * 0.1, title="a set")
    for data in (alone, with_average, with_spread):
        width, height = size_of(data)
        assert 400 < width < 3000 and 250 < height < 3000
    assert len({alone, with_average, with_spread}) == 3  # the crosses and the bars are drawn
    assert plots.attention_distance_png(mad, uniform, title="one image") == alone  # heads side by side: no jitter
    assert plots.attention_distance_png(mad, uniform, average=mad, num_images=1, title="one image") == alone  # 1 image


def test_many_heads_and_a_dollar_in_the_title_still_draw():
    mad = np.linspace(1, 60, 12 * 24, dtype=np.float32).reshape(12, 24)  # more heads than the legend names
    assert size_of(plots.attention_distance_png(mad, 30.0, spread=mad * 0.1, title=r"model $\frac{1}{$"))[0] > 400


def test_importing_plots_loads_no_plotting_library_and_no_streamlit():
    code = "import sys, vit_core.plots; print(sorted(m for m in ('matplotlib', 'streamlit') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
