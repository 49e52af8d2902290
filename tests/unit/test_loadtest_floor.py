"""The class load test's floor and ratios (tools/loadtest/floor.py): the formulas of issue 31, the goals' verdicts,
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
    """Issue 31's example: t = 0.52 s on 2 cores, 30 captures: 7.8 s for all of them, 3.9 s for the median one."""
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
