"""tools/loadtest/steps.py's arithmetic: one image's steps against the budget the load test's goals leave them. Given
figures, no server, no timing (tests/live/test_classroom.py runs the tool on a server)."""

import pytest

from tools.loadtest import floor as floors
from tools.loadtest import steps
from tools.loadtest.meters import SERVER_PARTS


def cost(count: int, client_s: float = 0.0, **server_s: float) -> steps.StepCost:
    """A StepCost of `count` steps with the given totals (server parts by keyword: forward, pages, events, export)."""
    names = {"forward": "forward lanes", "pages": "page scripts and the rest", "events": "event loop",
             "export": "export lanes"}
    c = steps.StepCost()
    for _ in range(count):
        c.add({names[k]: v / count for k, v in server_s.items()}, client_s / count, 0.01)
    return c


def test_a_step_cost_sums_every_run_and_leaves_the_forwards_out_of_the_rest():
    c = cost(4, client_s=0.04, forward=2.0, pages=0.4, events=0.2)
    assert c.count == 4 and set(c.server) == set(SERVER_PARTS)
    assert c.per_step(c.server["forward lanes"]) == pytest.approx(0.5)
    assert c.besides_forwards_s == pytest.approx(0.6) and c.per_step(c.client_s) == pytest.approx(0.01)
    assert steps.StepCost().per_step(1.0) != steps.StepCost().per_step(1.0)  # no steps: NaN, not a division error


def test_one_image_is_every_step_but_the_first_page_load_shared_over_the_sessions_images():
    """One session of two images: two uploads (forwards 0.6 s each, alone), the Attention tab once, 8 control changes,
    two downloads. Besides the forwards the server took 0.2 + 0.1 + 0.16 + 0.14 = 0.6 s and the client 0.1 s: 0.3 and
    0.05 s an image, 0.7 x t = 0.5 s. The first page load (1 s here) is no image's."""
    costs = {"first page load": cost(1, client_s=0.5, pages=1.0),
             "new image": cost(2, client_s=0.04, forward=1.2, pages=0.2),
             "Attention tab": cost(1, client_s=0.02, pages=0.1),
             "control change": cost(8, client_s=0.02, pages=0.12, events=0.04),
             "download": cost(2, client_s=0.02, export=0.1, events=0.04)}
    lines = steps.report_lines(costs, sessions=1, images=2, capture_s=0.5, cores=2, idle_server_s=0.0)
    image = next(line for line in lines if line.startswith("one image as the load test sends it"))
    assert ("besides its forward (600 ms of CPU alone), the server 300 ms and the client 50 ms: 0.70 x t = 500 ms,"
            " the server's alone 0.60 x") in image
    assert not any(line.startswith("the same steps with every figure cached") for line in lines)  # none measured
    table = {line.split("  ")[0].strip(): line for line in lines[2:]
             if not line.startswith(("one image", "the load test's goals"))}
    assert set(table) == {"first page load", "new image", "Attention tab", "control change", "download"}
    assert table["control change"].split()[2] == "8"  # the count column, then the forward's 0.0 ms
    assert float(table["control change"].split()[-3]) == pytest.approx(20.0)  # server* a step: (0.12 + 0.04) / 8


def test_with_every_figure_cached_one_image_is_a_whole_rerun_its_changes_and_a_download():
    """A whole rerun 40 ms (server 30, client 10), a cached control change 15 ms (12 + 3), the same download again
    35 ms (27 + 8): 40 + 4 x 15 + 35 = 135 ms, 0.27 x t = 0.5 s."""
    costs = {"new image": cost(2, forward=1.0),
             "control change, figures cached": cost(10, client_s=0.03, pages=0.08, events=0.04),
             "whole rerun, figures cached": cost(10, client_s=0.1, pages=0.2, events=0.1),
             "the same download again": cost(10, client_s=0.08, export=0.2, events=0.07)}
    lines = steps.report_lines(costs, sessions=1, images=2, capture_s=0.5, cores=2, idle_server_s=0.0)
    assert ("the same steps with every figure cached (a whole rerun, 4 control changes, a download), server and"
            " client: 135 ms, 0.27 x t") in lines


def test_the_budget_is_what_the_share_the_goals_need_leaves_beside_the_forwards():
    needed, allowed = steps.budget_per_image(capture_s=0.5, cores=2)
    storm = steps.LOAD_TEST
    assert needed == floors.share_needed(floors.Floor(0.5, storm["sessions"], 2), storm["images"], storm["stagger_s"])
    assert allowed == pytest.approx((1 - needed) / needed)
    lines = steps.report_lines({"new image": cost(2, forward=1.0)}, 1, 2, 0.5, 2, 0.0)
    assert lines[-1].endswith(f"need the forwards to get {needed:.0%} of the machine: all other work within"
                              f" {allowed:.2f} x the forwards' CPU, {allowed:.2f} x t an image")
