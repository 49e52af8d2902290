"""The load test's attacker (tools/loadtest/attacker.py): its files are tools/hostile's, each round's bytes differ while
the picture (and so its cost) stays, and its canvas value is what dashboard.draw refuses."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from dashboard import draw
from tools.loadtest.attacker import Outcome, attack_lines, canvas_value, hostile_attacks, varied
from vit_core import ImageError

ATTACKS = hostile_attacks()


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # the 169 MP header, opened on purpose
@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_each_round_sends_other_bytes_of_the_same_picture(attack):
    first, second = varied(attack.data, 0), varied(attack.data, 1)
    assert first != second != attack.data
    with Image.open(io.BytesIO(attack.data)) as original, Image.open(io.BytesIO(second)) as again:  # headers only
        assert (again.format, again.size) == (original.format, original.size)


def test_the_canvas_attack_is_a_value_the_app_refuses_unopened():
    canvas = [a for a in ATTACKS if a.via == "canvas"]
    assert canvas
    for attack in canvas:
        url = canvas_value(varied(attack.data, 3))["drawing"]["data"]
        with pytest.raises(ImageError, match="13000 x 13000"):
            draw.canvas_png(url)


def test_the_report_counts_outcomes_per_kind():
    lines = attack_lines([Outcome("a", 0.1, "refused", "x.png: no."), Outcome("a", 0.3, "refused", "x.png: no."),
                          Outcome("b", 2.0, "shown")])
    assert "n=2" in lines[0] and "refused 2" in lines[0] and "median  0.20 s" in lines[0]
    assert any("n=1" in line and "shown 1" in line for line in lines)
