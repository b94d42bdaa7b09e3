"""The benchmark scripts run on tiny sizes and print valid JSON (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO_ROOT, SHARED

import mpcore as mp

ROOT = REPO_ROOT
BENCH = ROOT / "benchmarks"
TORCH_PYTHON = Path("/work/torchvenv/bin/python")
PEER_SCRIPT = SHARED / "peers" / "torch_mlp.py"


def run(script: str, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"{script} printed nothing"
    return [json.loads(ln) for ln in lines if ln.startswith("{")]


def test_kernels_quick() -> None:
    records = run("kernels.py", "--quick", "--backend", "cpu")
    matmuls = [r for r in records if r["bench"] == "matmul"]
    assert {r["dtype"] for r in matmuls} == {"float32", "float16", "bfloat16"}
    for r in matmuls:
        assert r["gflops"] > 0 and r["ms"] > 0
    memory = {r["bench"]: r for r in records if "units" in r}
    assert memory["unscale_and_check"]["gbps"] > 0
    for name in ("sgd_update", "rmsprop_update", "adam_update"):
        assert (("gbps" in memory[name] and "bound_gbps" in memory[name])
                or "skipped" in memory[name])
    casts = [r for r in records if r["bench"] == "cast"]
    assert {(r["from"], r["to"]) for r in casts} == {
        ("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "float16"),
        ("float16", "float32")}
    assert all(r["kernel_us"] > 0 and r["astype_us"] > 0 for r in casts)


def test_train_step_loop_every_policy() -> None:
    records = run("train_step.py", "--quick", "--path", "loop", "--backend", "cpu")
    assert [r["policy"] for r in records] == ["float32", "mixed_float16", "mixed_bfloat16"]
    for r in records:
        assert r["path"] == "loop" and r["backend"] == "cpu"
        for key in ("ms_per_step", "samples_per_s", "gflops", "peak_traced_mb", "max_rss_mb"):
            assert r[key] > 0, key
        assert r["loss"] is not None and 0 < r["loss"] < 10  # ~ln(10) for random labels
        # the backend's own verdict on the policy, as mp.check_policy gives it
        verdict = mp.check_policy(r["policy"], "cpu")
        assert (r["fast"], r["why"]) == (verdict.fast, verdict.reason)


@pytest.mark.parametrize("path", ["loop", "fit"])
def test_train_step_interleaved_pairs_rounds_with_float32(path: str) -> None:
    records = run("train_step.py", "--quick", "--path", path, "--interleave", "3",
                  "--policy", "mixed_float16", "float32")
    assert [r["policy"] for r in records] == ["mixed_float16", "float32"]
    f16, f32 = records
    for r in records:
        assert r["rounds"] == 3 and len(r["ms_per_step_rounds"]) == 3
        assert sorted(r["ms_per_step_rounds"])[1] == r["ms_per_step"]   # the median
        assert r["loss"] is not None and 0 < r["loss"] < 10
    assert f32["vs_float32_rounds"] == [1.0, 1.0, 1.0]
    expected = [round(a / b, 3) for a, b in zip(f32["ms_per_step_rounds"],
                                                f16["ms_per_step_rounds"])]
    # ratios of unrounded times: within rounding of the ms figures
    assert f16["vs_float32_rounds"] == pytest.approx(expected, abs=0.01)
    assert sorted(f16["vs_float32_rounds"])[1] == f16["vs_float32_paired"]


def test_train_step_fit_runs_or_says_why_not() -> None:
    records = run("train_step.py", "--quick", "--path", "fit", "--policy", "float32")
    (r,) = records
    assert r["path"] == "fit"
    assert "samples_per_s" in r or r["skipped"]


def test_train_step_mixed_float8_against_mixed_bfloat16() -> None:
    """Issue 35's CPU cost figure: FP8 (emulated) paired round by round with the first policy
    given; the loop path, which has no Dense layer, refuses it naming the valid path."""
    records = run("train_step.py", "--quick", "--path", "fit", "--interleave", "3",
                  "--policy", "mixed_bfloat16", "mixed_float8", "--backend", "cpu")
    bf16, fp8 = records
    assert fp8["policy"] == "mixed_float8" and fp8["fast"] is False
    assert "emulated" in fp8["why"] and 0 < fp8["loss"] < 10
    assert bf16["vs_first_rounds"] == [1.0, 1.0, 1.0] and fp8["vs_first"] == "mixed_bfloat16"
    expected = [round(a / b, 3) for a, b in zip(bf16["ms_per_step_rounds"],
                                                fp8["ms_per_step_rounds"])]
    assert fp8["vs_first_rounds"] == pytest.approx(expected, abs=0.01)
    proc = subprocess.run([sys.executable, str(BENCH / "train_step.py"), "--quick",
                           "--policy", "mixed_float8"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2 and "valid paths for it: fit" in proc.stderr


def test_train_step_jit_traces_both_paths_and_reports_the_program() -> None:
    records = run("train_step.py", "--quick", "--path", "loop", "fit", "--policy", "float32",
                  "mixed_float16", "--jit")
    assert len(records) == 4
    for r in records:
        assert r["jit"] is True and r["program_ops"] > 5, r
        assert r["us_per_recorded_op"] > 0 and r["samples_per_s"] > 0


def test_unknown_backend_is_reported_not_raised() -> None:
    (r,) = run("train_step.py", "--quick", "--policy", "float32", "--backend", "nonesuch")
    assert "nonesuch" in r["skipped"]


@pytest.mark.parametrize("with_torch", [False, True])
def test_compare_prints_a_table_and_json(with_torch: bool) -> None:
    args = ["--policy", "float32", "mixed_bfloat16", "--units", "16", "--batch", "8",
            "--steps", "1", "--warmup", "1", "--rounds", "2"]
    if with_torch:
        if not TORCH_PYTHON.exists():
            pytest.skip(f"no torch interpreter at {TORCH_PYTHON}")
        if not PEER_SCRIPT.exists():  # a checkout without ../shared beside it
            pytest.skip(f"no peer script at {PEER_SCRIPT}")
        args += ["--torch-python", str(TORCH_PYTHON)]
    proc = subprocess.run([sys.executable, str(BENCH / "compare.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vs torch" in proc.stdout
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "compare"
    assert result["paths"] == ["loop", "fit"]   # both paths by default
    summary = result["summary"]
    for path in ("loop", "fit"):
        assert len(result["runs"]["float32"][path]) == 2
        assert summary["float32"][path]["vs_own_float32"] == 1.0
        assert summary["float32"][path]["vs_own_float32_rounds"] == [1.0, 1.0]
        bf16 = summary["mixed_bfloat16"][path]
        assert bf16["mpcore_samples_per_s"] > 0
        # each round's run over the float32 run of the same round
        f32 = {r["round"]: r["samples_per_s"] for r in result["runs"]["float32"][path]}
        assert bf16["vs_own_float32_rounds"] == [
            round(r["samples_per_s"] / f32[r["round"]], 3)
            for r in result["runs"]["mixed_bfloat16"][path]]
        assert min(bf16["vs_own_float32_rounds"]) <= bf16["vs_own_float32_paired"] \
            <= max(bf16["vs_own_float32_rounds"])
        assert f"\n{path:<6}mixed_bfloat16" in proc.stdout
    # tiny sizes: every target is named, none is judged
    assert {(t["target"], t["path"]) for t in result["targets"]} >= {
        ("float32 >= 1.0x torch float32", "loop"), ("mixed_bfloat16 >= 1.5x mpcore float32", "fit")}
    assert all(t["status"].startswith("not applicable: the targets are set for")
               or t["status"] == "not run" for t in result["targets"])
    assert "\ntargets (paired figures):" in proc.stdout
    if with_torch:
        assert result["peer_skipped"] is None
        for path in ("loop", "fit"):
            entry = summary["float32"][path]
            assert entry["vs_torch"] > 0 and len(entry["vs_torch_rounds"]) == 2
            assert min(entry["vs_torch_rounds"]) <= entry["vs_torch_paired"] \
                <= max(entry["vs_torch_rounds"])
        # rounds alternate which side runs first
        assert [r["round"] for r in result["runs"]["float32"]["torch"]] == [0, 1]
    else:
        assert "no --torch-python" in result["peer_skipped"]
        assert summary["float32"]["loop"]["vs_torch_paired"] is None


def test_step_gemms_quick() -> None:
    records = run("step_gemms.py", "--quick", "--backend", "cpu")
    gemms = [r for r in records if r["bench"] == "step_gemm"]
    assert len(gemms) == 8 and all(r["mpcore_ms"] > 0 for r in gemms)
    (total,) = [r for r in records if r["bench"] == "step_gemms_total"]
    assert total["mpcore_ms"] > 0


def test_step_gemms_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both engines of the CPU backend with oneDNN's provider: NumPy's and oneDNN's GEMM."""
    import mpcore_onednn

    try:
        mpcore_onednn.library()
    except mpcore_onednn.DnnlError as exc:
        pytest.skip(f"oneDNN cannot be loaded here: {exc}")
    monkeypatch.setenv("MPCORE_ONEDNN", "force")
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "on")
    records = run("step_gemms.py", "--quick", "--backend", "cpu", "--engines")
    gemms = [r for r in records if r["bench"] == "step_gemm"]
    assert len(gemms) == 8 and all(r["numpy_ms"] > 0 and r["onednn_ms"] > 0 for r in gemms)
    # each engine is the one it names: oneDNN's primitives run for one only
    sys.path.insert(0, str(BENCH))
    try:
        import step_gemms
    finally:
        sys.path.remove(str(BENCH))
    from mpcore_cpu import CpuBackend

    matmul = CpuBackend().kernels()["matmul"]
    a = np.ones((8, 4), np.float32)
    for engine, runs in (("numpy", 0), ("onednn", 1)):
        before = matmul.cache.hits + matmul.cache.misses
        step_gemms._engine(matmul, engine)(a, a, True, False)
        assert matmul.cache.hits + matmul.cache.misses == before + runs, engine
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "off")   # float32 left on NumPy: refused
    proc = subprocess.run([sys.executable, str(BENCH / "step_gemms.py"), "--quick", "--backend",
                           "cpu", "--engines"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert proc.returncode != 0 and "MPCORE_ONEDNN_FLOAT32=off" in proc.stderr


def _compare_module() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import compare
    finally:
        sys.path.remove(str(BENCH))
    return compare


def _entry(vs_torch: float | None, vs_own: float | None) -> dict[str, Any]:
    return {"vs_torch_paired": vs_torch, "vs_own_float32_paired": vs_own}


@pytest.mark.parametrize("bf16_fast", [False, True])
def test_compare_judges_the_targets(bf16_fast: bool) -> None:
    compare = _compare_module()
    summary = {"float32": {"loop": _entry(1.04, 1.0), "fit": _entry(0.97, 1.0)},
               "mixed_bfloat16": {"loop": _entry(1.2, 1.6), "fit": _entry(None, 1.4)}}
    runs = {"float32": {"loop": [{"fast": True}], "fit": [{"fast": True}]},
            "mixed_bfloat16": {path: [{"fast": bf16_fast, "why": "no avx512_bf16"}]
                               for path in ("loop", "fit")}}
    judged = {(t["target"], t["path"]): t
              for t in compare.judge_targets(summary, runs, ["loop", "fit"])}
    assert len(judged) == 2 * len(compare.TARGETS)
    f32 = "float32 >= 1.0x torch float32"
    assert (judged[f32, "loop"]["status"], judged[f32, "fit"]["status"]) == ("met", "missed")
    assert judged[f32, "fit"]["measured"] == 0.97 and judged[f32, "fit"]["at_least"] == 1.0
    assert judged["mixed_float16 >= 0.8x mpcore float32", "loop"]["status"] == "not run"
    vs_torch = judged["mixed_bfloat16 >= 1.0x torch autocast bfloat16", "fit"]
    vs_own = judged["mixed_bfloat16 >= 1.5x mpcore float32", "loop"]
    if bf16_fast:
        assert (vs_torch["status"], vs_own["status"]) == ("not measured", "met")
    else:  # a hardware target where the hardware is missing: not judged, and why
        assert vs_torch["status"] == vs_own["status"] == "not applicable: no avx512_bf16"
    # another size, another backend or torch on another device: not judged, and why
    assert compare.targets_apply((1024, 1024), {"cpu"}, "cpu") is None
    for why in (compare.targets_apply((256, 128), {"cpu"}, "cpu"),
                compare.targets_apply((1024, 1024), {"cuda"}, "cuda"),
                compare.targets_apply((1024, 1024), {"cpu"}, "cuda")):
        assert why is not None
        other = compare.judge_targets(summary, runs, ["loop"], why)
        assert {t["status"] for t in other} == {f"not applicable: {why}", "not run"}


def test_inspect_numerics_cost() -> None:
    (record,) = run("inspect_numerics.py", "--units", "8", "--batch", "16", "--rounds", "2",
                    "--repeat", "1", "--dtypes", "float16", "float8_e5m2")
    assert record["dtypes"] == ["float16", "float8_e5m2"]
    for key in ("train_step_ms", "inspect_ms"):
        assert 0 < record[key]["min"] <= record[key]["median"] <= record[key]["max"]
    low, high = record["inspect_vs_step_range"]
    assert 0 < low <= record["inspect_vs_step_median"] <= high


def test_data_parallel_quick() -> None:
    pytest.importorskip("mpi4py", reason='pip install -e ".[mpi-mpich]" (in the test extra)')
    records = run("data_parallel.py", "--quick")
    rounds, summary = records[:-1], records[-1]
    assert len(rounds) == 1 and len(rounds[0]["ranks"]) == 2 and len(rounds[0]["ceiling"]) == 2
    assert summary["bench"] == "data_parallel" and summary["speedup"]["median"] > 0
    assert 0 < summary["allreduce_share_rank0"]["median"] < 1
    assert summary["max_rss_mb_per_rank"]["median"] > 0 and summary["gradient_mb"] > 0


def test_traced_vs_eager() -> None:
    (record,) = run("traced_vs_eager.py", "--units", "8", "--batch", "16", "--rounds", "2",
                    "--policy", "float32")
    assert record["policy"] == "float32" and record["program_steps"] > 0
    assert record["eager_ms_per_step"] > 0 and record["traced_ms_per_step"] > 0
    low, high = record["traced_vs_eager_range"]
    assert 0 < low <= record["traced_vs_eager_median"] <= high
    assert record["traced_us_per_program_step"] == pytest.approx(
        record["traced_ms_per_step"] * 1e3 / record["program_steps"])
    assert record["saved_us_per_program_step"] == pytest.approx(
        (record["eager_ms_per_step"] - record["traced_ms_per_step"]) * 1e3
        / record["program_steps"])
    assert set(record["peak_traced_mb"]) == {"eager", "traced"}


def _opencl_or_skip() -> None:
    pytest.importorskip("pyopencl", reason='pip install -e ".[pocl]" (in the test extra)')
    try:
        mp.get_backend("opencl")
    except mp.BackendUnavailableError as exc:
        pytest.skip(f"opencl: {exc}")


def test_cuda_profile_breaks_a_step_into_kernels() -> None:
    """On the CPU (the host times each kernel); on a GPU CUDA events do (backends/cuda
    checklist)."""
    records = run("cuda_profile.py", "--backend", "cpu", "--units", "8", "--batch", "16",
                  "--steps", "2", "--warmup", "1", "--policy", "float32", "mixed_float16",
                  "--peak-tflops", "1")
    assert [r["policy"] for r in records] == ["float32", "mixed_float16"]
    for r in records:
        names = [k["kernel"] for k in r["kernels"]]
        assert "matmul" in names and "rmsprop_update" in names
        assert r["gemm_ms"] > 0 and r["kernels_ms"] >= r["gemm_ms"] and r["gemm_ms_at_peak"] > 0
        assert next(k for k in r["kernels"] if k["kernel"] == "matmul")["calls_per_step"] == 8
    assert "cast" in [k["kernel"] for k in records[1]["kernels"]]


def test_cuda_profile_spin_kernel_compiles_with_nvrtc() -> None:
    """The GPU spin that keeps each timed kernel's launch ahead of the GPU (no GPU needed)."""
    try:
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as exc:  # CuPy or NVRTC missing: the CUDA tests skip for the same reason
        pytest.skip(f"NVRTC is not usable here: {type(exc).__name__}")
    sys.path.insert(0, str(BENCH))
    try:
        import cuda_profile
    finally:
        sys.path.remove(str(BENCH))
    prog = nvrtc.createProgram(cuda_profile.SPIN, "spin.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["--gpu-architecture=sm_80"])
        assert len(nvrtc.getCUBIN(prog)) > 0
    finally:
        nvrtc.destroyProgram(prog)


def test_opencl_step_profile() -> None:
    _opencl_or_skip()
    (record,) = run("opencl_step_profile.py", "--units", "8", "--batch", "16", "--steps", "2")
    names = [k["kernel"] for k in record["kernels"]]
    assert any(n.startswith("gemm") for n in names) and "take_rows" in names  # rows of 784
    assert record["device_us_per_step"] > 0 and record["launches_per_step"] > 0


def test_packed_gemm_opencl() -> None:
    _opencl_or_skip()
    records = run("packed_gemm_opencl.py", "--rounds", "2", "--shapes", "t13x9x17", "7x5x3t",
                  "--config", "rows=4,group=1x1", "--config", "a=0,b=0")
    assert [(r["shape"], r["config"]) for r in records] == [
        (s, c) for c in ("device", "rows=4,group=1x1", "a=0,b=0") for s in ("t13x9x17", "7x5x3t")]
    assert all(r["us_median"] > 0 and r["gemm_us_median"] > 0 for r in records)
    assert "-DWPM=4" in records[2]["packed_shape"] and "group=1x1" in records[2]["packed_shape"]
    assert records[4]["pack_us_median"] > 0  # both operands packed


def test_data_prefetch() -> None:
    (record,) = run("data_prefetch.py", "--units", "8", "--batch", "16", "--steps", "4",
                    "--epochs", "2", "--sleep-ms", "1")
    assert record["benchmark"] == "data_prefetch"
    for key in ("step_ms", "serial_ms", "prefetch_ms", "serial_sum_ms"):
        assert record[key] > 0
    assert record["prefetch_vs_serial_sum"] > 0
