"""What `mpcore demo` settles before it trains: the mixed policy for the device (a pure
function of a device description, checked for CPUs with and without bf16 and on this CPU), and
its arguments and backend (every bad one an error up front, naming it, with no traceback)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpcore_cpu import CpuBackend

import mpcore as mp
from mpcore.cli import demo
from mpcore.core.backend import Device

SKYLAKE = frozenset({"avx2", "fma", "f16c", "avx512f"})
COOPER_LAKE = SKYLAKE | {"avx512_bf16"}
SAPPHIRE_RAPIDS = COOPER_LAKE | {"amx_tile", "amx_bf16", "avx512_fp16", "amx_fp16"}
BF16_KERNEL = {"bfloat16": "a bf16 GEMM"}
BOTH_KERNELS = {"bfloat16": "a bf16 GEMM", "float16": "an fp16 GEMM"}
NOT_FAST = "no mixed policy is fast on this device; mixed_bfloat16 is supported (emulated)"


class _Cpu(CpuBackend):
    """The CPU backend with a given set of fast 16-bit kernel providers, whatever is
    installed here (a plugin KernelSet's ``fast_dtypes``, as oneDNN's)."""

    name = "cpu-choose-policy-test"

    def __init__(self, fast: dict[str, str]) -> None:
        self.fast = fast

    def fast_dtypes_from_plugins(self) -> dict[str, str]:
        return dict(self.fast)


@pytest.mark.parametrize(("features", "kernels", "policy", "why"), [
    (SKYLAKE, {}, "mixed_bfloat16", NOT_FAST),
    (COOPER_LAKE, {}, "mixed_bfloat16", NOT_FAST),          # NumPy has no bf16 GEMM
    (SKYLAKE, BF16_KERNEL, "mixed_bfloat16", NOT_FAST),     # the kernel would be emulated
    (COOPER_LAKE, BF16_KERNEL, "mixed_bfloat16", "mixed_bfloat16 is fast on this device"),
    (COOPER_LAKE, BOTH_KERNELS, "mixed_bfloat16", "mixed_bfloat16 is fast on this device"),
    (SAPPHIRE_RAPIDS, BOTH_KERNELS, "mixed_float16", "mixed_float16 is fast on this device"),
])
def test_choose_policy_for_described_cpus(features: frozenset[str], kernels: dict[str, str],
                                          policy: str, why: str) -> None:
    device = Device(name="described", features=features)
    chosen, reason = demo.choose_policy(_Cpu(kernels), device)
    assert chosen == policy and reason.startswith(why)


def test_choose_policy_on_this_cpu() -> None:
    cpu = mp.get_backend("cpu")
    device = cpu.device()
    policy, why = demo.choose_policy(cpu)
    assert (policy, why) == demo.choose_policy(cpu, device)
    kernels = cpu.fast_dtypes_from_plugins()
    fast16 = "float16" in kernels and {"avx512_fp16", "amx_fp16"} & device.features
    fast_bf16 = "bfloat16" in kernels and {"avx512_bf16", "amx_bf16"} & device.features
    if fast16:
        assert (policy, why) == ("mixed_float16", "mixed_float16 is fast on this device")
    elif fast_bf16:  # this Zen 4 (avx512_bf16) with the oneDNN provider
        assert (policy, why) == ("mixed_bfloat16", "mixed_bfloat16 is fast on this device")
    else:            # a CPU without bf16 (or without a bf16 kernel)
        assert policy == "mixed_bfloat16" and why.startswith(NOT_FAST)
    assert mp.check_policy(policy, cpu).fast is bool(fast16 or fast_bf16)


def run_demo(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "MPCORE_BACKEND"}
    return subprocess.run([sys.executable, "-m", "mpcore", "demo", *args], capture_output=True,
                          text=True, timeout=120, env={**environ, **env})


def _bad_plots(tmp_path: Path) -> list[tuple[str, str]]:
    (tmp_path / "a-file").write_text("")
    in_file, txt, bare = (str(tmp_path / name) for name in ("a-file/x.png", "p.txt", "p"))
    return [
        ("/proc/nope/x.png", "the folder of '/proc/nope/x.png' ('/proc/nope') does not exist"),
        (in_file, f"the folder of {in_file!r} ({str(tmp_path / 'a-file')!r}) is not a folder"),
        (str(tmp_path), f"{str(tmp_path)!r} is a folder; give a file name in it"),
        (txt, f"{txt!r} must end in one of .png, .pdf, .svg, .jpg, .jpeg (the format"),
        (bare, f"{bare!r} must end in one of"),
        ("/proc/x.png", "cannot write a file in the folder of '/proc/x.png': "),
    ]


BAD_NUMBERS = [
    (["--units", "0"], "argument --units: must be a whole number >= 1, got 0"),
    (["--units", "-1"], "argument --units: must be a whole number >= 1, got -1"),
    (["--units", "ten"], "argument --units: must be a whole number >= 1, got 'ten'"),
    (["--batch-size", "-5"], "argument --batch-size: must be a whole number >= 1, got -5"),
    (["--epochs", "0"], "argument --epochs: must be a whole number >= 1, got 0"),
    (["--epochs", "1.5"], "argument --epochs: must be a whole number >= 1, got '1.5'"),
    (["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["--verbose", "5"], "argument --verbose: invalid choice: 5"),
    (["--policy", "float8"], "argument --policy: invalid choice: 'float8'"),
]


def test_bad_arguments_stop_the_demo_before_any_work(tmp_path: Path) -> None:
    cases = BAD_NUMBERS + [(["--plot", path], f"argument --plot: {text}")
                           for path, text in _bad_plots(tmp_path)]
    for args, message in cases:
        # a valid rest: the bad argument alone must stop it, before training
        proc = run_demo("--epochs", "1", "--verbose", "0", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stdout == "", args
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("mpcore demo: error: ") and message in last, (args, last)
        assert "Traceback" not in proc.stderr


def test_a_bad_mpcore_backend_is_one_clear_paragraph() -> None:
    proc = run_demo("--epochs", "1", MPCORE_BACKEND="nonsense")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("mpcore demo: MPCORE_BACKEND=nonsense: unknown backend "
                                  "'nonsense'; registered backends: cuda, opencl, cpu.")
    assert "  cpu: available" in proc.stderr
    assert "\n\n" not in proc.stderr.strip() and "Traceback" not in proc.stderr


@given(st.integers())
def test_positive_int_accepts_exactly_the_whole_numbers_from_1(value: int) -> None:
    if value >= 1:
        assert demo.positive_int(f" {value}") == value
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=f"must be a whole number >= 1, "
                                                             f"got {value}$"):
            demo.positive_int(str(value))


@given(st.text())
def test_positive_int_rejects_what_is_not_a_whole_number(text: str) -> None:
    try:
        int(text)
    except ValueError:
        pass
    else:
        return  # int() reads it (" 12", "1_0", "١٢"): the rule above applies
    with pytest.raises(argparse.ArgumentTypeError, match="must be a whole number >= 1, got"):
        demo.positive_int(text)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"units": 0}, "units must be a whole number >= 1, got 0"),
    ({"epochs": 0}, "epochs must be a whole number >= 1, got 0"),
    ({"batch_size": -5}, "batch_size must be a whole number >= 1, got -5"),
    ({"batch_size": 2.5}, "batch_size must be a whole number >= 1, got 2.5"),
    ({"policy": "float32"}, "policy must be a mixed policy, one of mixed_float16, "
                            "mixed_bfloat16, mixed_float8, got 'float32'"),
    ({"verbose": 3}, "verbose must be 0, 1 or 2, got 3"),
    ({"plot": "/proc/nope/x.png"}, "plot: the folder of '/proc/nope/x.png'"),
])
def test_run_checks_its_arguments_before_any_work(kwargs: dict, message: str) -> None:
    lines: list[str] = []
    with pytest.raises(ValueError) as info:
        demo.run(out=lines.append, **kwargs)
    assert str(info.value).startswith(message)
    assert lines == []  # nothing printed, no backend asked, no data loaded


def test_a_corrupt_mnist_file_ends_the_demo_in_one_line(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    from mpcore.cli import app as cli
    from mpcore.datasets import mnist

    images = tmp_path / "t10k-images-idx3-ubyte.gz"
    images.write_bytes(gzip.compress(b"garbage\n"))
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"x\n")   # truncated: not gzip
    monkeypatch.setenv("MPCORE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cli.main(["demo", "--epochs", "1", "--verbose", "0"]) == 1
    err = capsys.readouterr().err
    assert err == (f"mpcore demo: {images} has md5 {mnist.md5sum(images)}, not the published "
                   f"md5 {mnist.FILES[images.name]} of {images.name}: it is corrupt, incomplete "
                   f"or another file; delete {images} so that mpcore downloads a fresh copy (or "
                   "put the original file there). For another data set in MNIST's format (e.g. "
                   "Fashion-MNIST), pass md5s={file name: md5} with its md5s.\n")
