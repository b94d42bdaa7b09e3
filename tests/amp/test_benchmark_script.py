"""benchmarks/amp_rewrite.py runs on tiny sizes and prints one JSON record per configuration,
paired with float32 round by round (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_amp_rewrite_quick() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "amp_rewrite.py"),
                           "--quick", "--dtype", "bfloat16"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["config"] for r in records] == ["float32", "rewrite", "mixed_bfloat16"]
    for r in records:
        assert r["ms_per_step"] > 0 and len(r["vs_float32_rounds"]) == r["rounds"] == 2
        low, high = r["ms_per_step_range"]
        assert low <= r["ms_per_step"] <= high
    assert records[0]["vs_float32_rounds"] == [1.0, 1.0]
    assert records[1]["rewrite"].startswith("mixed precision graph rewrite (bfloat16): ")
