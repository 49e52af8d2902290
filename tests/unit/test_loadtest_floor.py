"""The class load test's floor and ratios (tools/loadtest/floor.py; docs/performance.md, "Reading a ratio"), the goals' verdicts,
and the CPU line read from lscpu's output. Pure arithmetic on given figures: no server, no timing."""

import numpy as np
import pytest

from tools.loadtest import floor as floors

LSCPU = """Architecture:                            x86_64
CPU(s):                                   2
Model name:                               AMD EPYC 7B13
Flags:                                    fpu vme sse sse2 avx avx2 fma bmi2 sha_ni
"""


def test_the_floor_is_half_the_burst_for_the_median_and_the_whole_burst_for_the_last():
    """t = 0.52 s on 2 cores, 30 captures: 7.8 s for all of them, 3.9 s for the median one."""
    f = floors.Floor(capture_s=0.52, n=30, cores=2)
    assert f.all_s == pytest.approx(7.8) and f.median_s == pytest.approx(3.9)


def test_ratios_divide_by_the_floor_measured_in_the_same_run_and_judge_the_goals():
    f = floors.Floor(capture_s=0.5, n=4, cores=2)  # floor_median 0.5 s, floor_all 1.0 s
    new_images = [0.6, 0.7, 0.8, 1.4]
    r = floors.ratios(f, new_images, first_images=[0.6, 0.7], control=[0.05, 0.1, 0.3], mismatches=0)
    assert r.new_image_median == pytest.approx(0.75 / 0.5)
    assert r.new_image_p95 == pytest.approx(np.percentile(new_images, 95) / 1.0)
    assert r.first_image_median == pytest.approx(0.65 / 0.5)
    assert r.every_image_median == pytest.approx(0.75 / (2 * 0.5 / 2))  # 4 new images: their median's floor 0.5 s
    assert r.control_median_s == pytest.approx(0.1)
    assert r.met() == {"new-image median": True, "new-image p95": True, "control-change median": True,
                       "mismatches": True}
    slow = floors.ratios(f, [2.0, 2.0, 2.0], [2.0], [0.5], mismatches=1)
    assert not any(slow.met().values())
    lines = floors.report_lines(f, slow)
    assert "NOT MET" in lines[1] and "floor_median = (N/2) x t / C = 0.50 s" in lines[0]


def test_the_percentile_is_numpys_linear_one():
    samples = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in (0, 50, 90, 95, 100):
        assert floors.percentile(samples, q) == pytest.approx(np.percentile(samples, q))


def test_the_cpu_line_names_the_model_the_cpus_and_the_instruction_sets_kernels_are_chosen_by():
    assert floors.cpu_description(LSCPU) == "AMD EPYC 7B13, 2 CPUs, flags: avx avx2 fma"
    with_512 = LSCPU.replace("sha_ni", "avx512f avx512bw avx512vl avx512_vnni")
    assert floors.cpu_description(with_512).endswith("flags: avx avx2 fma avx512f avx512bw avx512vl avx512_vnni")


def test_first_come_first_served_puts_every_second_image_behind_the_first_images_still_queued():
    """30 sessions at once on 2 cores, t = 1 s: the first images end at 1, 1, 2, 2, ..., 15, 15 s; each session's second
    image, sent as its first is done, waits for the first images still queued, then for the second images sent before
    it: every one of them takes 15 s. Their median is twice floor_median, their p95 floor_all."""
    latencies = floors.first_come_first_served(sessions=30, images=2, capture_s=1.0, cores=2)
    firsts, seconds = latencies[:30], latencies[30:]
    assert firsts == [float(k // 2 + 1) for k in range(30)]
    assert seconds == pytest.approx([15.0] * 30)
    f = floors.Floor(capture_s=1.0, n=30, cores=2)
    best = floors.ratios(f, latencies, firsts, [], 0)
    assert best.new_image_median == pytest.approx(2.0) and best.new_image_p95 == pytest.approx(1.0)
    assert best.first_image_median == pytest.approx(8.0 / 7.5)  # the 15th and 16th first images end at 8 s
    one = floors.first_come_first_served(sessions=30, images=1, capture_s=1.0, cores=2)
    assert floors.ratios(f, one, one, [], 0).new_image_median == pytest.approx(8.0 / 7.5)


def test_first_come_first_served_serves_images_sent_apart_at_once_and_the_report_says_what_it_gives():
    latencies = floors.first_come_first_served(sessions=3, images=1, capture_s=1.0, cores=1, stagger_s=5.0)
    assert latencies == [1.0, 1.0, 1.0]  # each sent after the last was done: none waits
    f = floors.Floor(capture_s=1.0, n=3, cores=1)
    r = floors.ratios(f, [2.0, 2.0, 2.0], [2.0], [0.1], 0)
    best = floors.ratios(f, latencies, latencies, [], 0)
    last = floors.report_lines(f, r, best)[-1]
    assert "first come first served: new-image median / floor_median 0.67, p95 / floor_all 0.33" in last


def test_the_servers_cpu_is_split_by_the_kernels_names_of_its_threads():
    """Two readings of the server's threads ({tid: (name, CPU-s)}): each lane's and the main thread's time between them;
    a thread started meanwhile counts whole, one that ended is in the rest (the process's total keeps its time)."""
    from tools.loadtest.meters import server_parts
    from vit_core.serving.priority import EXPORT_LANE_NAME, FORWARD_LANE_NAME

    begin = {100: ("python", 5.0), 101: (FORWARD_LANE_NAME, 2.0), 102: (FORWARD_LANE_NAME, 1.0), 103: ("python", 0.5)}
    end = {100: ("python", 8.0), 101: (FORWARD_LANE_NAME, 12.0), 102: (FORWARD_LANE_NAME, 9.0),
           104: (EXPORT_LANE_NAME, 1.5), 105: ("python", 0.7)}
    parts = server_parts(100, begin, end, server_s=30.0, children_s=2.0)
    assert parts == {"forward lanes": 18.0, "export lanes": 1.5, "event loop": 3.0, "decode processes": 2.0,
                     "page scripts and the rest": 30.0 - 18.0 - 1.5 - 3.0 - 2.0}


def test_a_first_come_first_served_server_given_a_share_of_the_machine_takes_its_forwards_that_much_longer():
    half = floors.first_come_first_served(sessions=4, images=2, capture_s=1.0, cores=2, stagger_s=0.3, share=0.5)
    assert half == floors.first_come_first_served(sessions=4, images=2, capture_s=2.0, cores=2, stagger_s=0.3)


def test_the_share_the_goals_need_is_the_smallest_at_which_both_ratios_are_met():
    f = floors.Floor(capture_s=0.5, n=30, cores=2)

    def ratios_at(share):
        latencies = floors.first_come_first_served(30, 2, 0.5, 2, 0.2, share)
        return floors.ratios(f, latencies, latencies[:30], [], 0)

    needed = floors.share_needed(f, images=2, stagger_s=0.2)
    assert 0.5 < needed < 1.0
    at, below = ratios_at(needed), ratios_at(needed - floors.SHARE_STEP)
    assert at.new_image_median <= 1.5 and at.new_image_p95 <= 1.5
    assert below.new_image_median > 1.5 or below.new_image_p95 > 1.5
    # sent all at once, two images a session: the median is 2 x floor_median at best, whatever the share
    assert floors.share_needed(f, images=2, stagger_s=0.0) is None


def test_the_report_says_what_the_runs_share_allowed_and_what_the_goals_need():
    f = floors.Floor(capture_s=0.5, n=30, cores=2)
    share = floors.forwards_share(f, images=2, stagger_s=0.2, forwards_cpu_s=30.0, storm_s=30.0)  # half the machine
    assert share.share == pytest.approx(0.5)
    latencies = floors.first_come_first_served(30, 2, 0.5, 2, 0.2, share=0.5)
    expected = floors.ratios(f, latencies, latencies[:30], [], 0)
    assert (share.at_this_share.new_image_median, share.at_this_share.new_image_p95) == (
        expected.new_image_median, expected.new_image_p95)
    first, second = share.lines()
    assert "the forwards got 50% of the machine in the storm (30.0 of 60.0 CPU-s)" in first
    assert f"at least {share.needed:.0%}" in second and "where this run took 1.00 x" in second
    alone = floors.forwards_share(floors.Floor(0.5, 30, 2), images=2, stagger_s=0.0, forwards_cpu_s=30.0, storm_s=30.0)
    assert "even all of the machine would not" in alone.lines()[-1]
