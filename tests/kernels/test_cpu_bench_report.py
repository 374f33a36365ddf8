"""benchmarks/run_cpu.py's roofline section: the ADAN loop's instruction mix read from the compiled
loop, the bound computed from it and the measured instruction rates, and the step's flop floor."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import run_cpu  # noqa: E402


def test_loop_bounds_take_the_larger_of_the_fma_and_divider_times():
    ceilings = ("instructions per ns, one thread: vfmadd zmm 4.00, vfmadd ymm 8.00, vsqrtps ymm 2.000, "
                "vdivps ymm 4.000, vrcpps ymm 8.00, vsqrtps zmm 0.500, vdivps zmm 1.000, vrcp14ps zmm 4.00")
    loop = ("ADAN fit, 307200 elements, 25 iterations, one thread: 9.60 ms, 50.0 cycles per 16 elements per "
            "iteration at 2.60 GHz (checksum 1)")
    # 9.6 ms over 307200 / 16 * 25 = 480,000 vector iterations: 20 ns each
    text = run_cpu.loop_bounds(ceilings, loop, {"fma-unit": 40, "vsqrtps": 3, "vdivps": 4, "memory": 30}, "avx512")
    assert "The loop takes 20.0 ns" in text
    assert "the FMA units need 10.0 ns" in text and "the divider 10.0 ns" in text  # 3 / 0.5 + 4 / 1
    assert "at 50% of its throughput bound" in text
    text = run_cpu.loop_bounds(ceilings, loop, {"fma-unit": 60, "vsqrtps": 3, "vdivps": 0, "memory": 30}, "avx512")
    assert "the FMA units need 15.0 ns" in text and "at 75% of its throughput bound" in text
    # the AVX2 loop: 8 lanes a vector, so twice the vector iterations (10 ns each), at the ymm rates
    text = run_cpu.loop_bounds(ceilings, loop, {"fma-unit": 40, "vsqrtps": 4, "vdivps": 8, "memory": 30}, "avx2")
    assert "Per 8 lanes (avx2)" in text and "The loop takes 10.0 ns" in text
    assert "the FMA units need 5.0 ns" in text and "the divider 4.0 ns" in text  # 4 / 2 + 8 / 4
    assert "at 50% of its throughput bound" in text


def test_flop_floor_compares_the_peak_time_with_what_the_target_allows():
    # 1000 flops x 200,000 elements = 200 MFLOP: 2.00 ms at 100 GFLOP/s; 50x of 0.1 s / 0.2 s allows 2 / 4 ms
    text = run_cpu.flop_floor(200_000, 1000, 100.0, "FMA peak", [0.1, 0.2])
    assert "200 MFLOP for 200,000 elements take 2.00 ms" in text
    assert "allows 2.00 ms (fastest call) and 4.00 ms (median call)" in text
    assert "that is 100% and 50% of the peak's rate" in text


@pytest.mark.parametrize("target", sorted(run_cpu.ADAN_LOOP_TARGETS))
def test_adan_loop_mix_counts_the_compiled_loop(target):
    assert shutil.which("g++") is not None  # (the extension is built with it)
    mix = run_cpu.adan_loop_mix(target)  # (compiled to assembly only: any x86-64 host can count it)
    # per vector and iteration: three square roots, and three divisions or none (reciprocal
    # estimates instead), around 50-70 other arithmetic instructions; vector moves are not counted
    assert mix["vsqrtps"] == 3 and mix["vdivps"] in (0, 3)
    assert 45 <= mix["fma-unit"] <= 80 and mix["memory"] >= 21


def test_fma_peak_takes_the_better_vector_width():
    ceilings = "instructions per ns, one thread: vfmadd zmm 3.50, vfmadd ymm 7.25, vsqrtps zmm 0.35"
    assert run_cpu.fma_peak_gflops(ceilings, 2) == 7.25 * 8 * 2 * 2  # 256-bit wins: 232 GFLOP/s
    assert run_cpu.fma_peak_gflops(ceilings.replace("3.50", "5.50"), 1) == 5.5 * 16 * 2


def test_target_rooflines_multiply_lanes_flops_rate_and_threads():
    ceilings = "instructions per ns, one thread: vfmadd zmm 5.00, vfmadd ymm 6.00, vsqrtps zmm 0.100"
    roofs = run_cpu.target_rooflines(ceilings, threads=2, ghz=2.5)
    assert roofs["avx512"][0] == 16 * 2 * 5.0 * 2 and roofs["avx2"][0] == 8 * 2 * 6.0 * 2
    assert roofs["sse2"][0] == 4 * 1 * 6.0 * 2  # (no FMA instruction: one flop per lane)
    assert "2.00 units x 2.50 GHz" in roofs["avx512"][1]
    assert run_cpu.target_rooflines(None, 2, 2.5) == {}


def test_an_avx2_host_has_no_avx512_roofline_and_its_peak_is_the_256_bit_one():
    # vector_ceilings.cpp built with -march=native on a CPU without AVX-512 measures no zmm rates
    ceilings = "instructions per ns, one thread: vfmadd ymm 5.85, vsqrtps ymm 0.586, vdivps ymm 0.923, vrcpps ymm 5.80"
    roofs = run_cpu.target_rooflines(ceilings, threads=2, ghz=2.45)
    assert sorted(roofs) == ["avx2", "baseline", "sse2"] and roofs["avx2"][0] == 8 * 2 * 5.85 * 2
    assert run_cpu.fma_peak_gflops(ceilings, 2) == 5.85 * 8 * 2 * 2


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v4"])
def test_vector_ceilings_compiles_with_and_without_avx512(march):
    # (it failed to compile on AVX2 hosts with -march=native, where run_cpu.py builds it)
    src = Path(run_cpu.__file__).parent / "cpp" / "vector_ceilings.cpp"
    done = subprocess.run(["g++", f"-march={march}", "-std=c++17", "-S", "-o", "/dev/null", str(src)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
