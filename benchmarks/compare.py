"""mpcore vs the PyTorch peer, side by side: A B A B for several rounds, medians, ratios.

    python benchmarks/compare.py --torch-python /work/torchvenv/bin/python \\
        --policy float32 mixed_bfloat16 mixed_float16 --units 1024 --batch 1024 --rounds 5

Each round runs, for every policy, ``benchmarks/train_step.py`` (mpcore, once per ``--path``:
the custom loop and ``Model.fit``) and then the peer (``shared/peers/torch_mlp.py``) as separate
processes, alternating, so all see the same machine in the same minute. The table gives median
samples/s per path and policy, and these ratios:

- ``vs torch``: mpcore / torch for the same policy (torch's float32, autocast bfloat16, autocast
  float16 + GradScaler), the ratio of the two medians;
- ``paired`` and ``range``: the median, min and max of the per-round ratios (each mpcore run over
  the peer run of its own round). On a shared VM whose speed drifts by tens of percent from
  minute to minute, the paired median is the steadier figure; the range shows the noise. Rounds
  alternate which side runs first, so a drift does not always favour the same side;
- ``vs own f32``: mpcore's policy / mpcore float32 on the same path (when float32 is among the
  policies), the ratio of the medians; ``own paired``: the median of the per-round ratios (each
  run over the float32 run of its own round). float16 on a CPU is bound by conversions, that is
  by memory bandwidth, which a busy neighbour on the host takes more of than it takes compute:
  the paired figure keeps such a slow minute from counting against one policy only.

After the table, the project's speed targets for the CPU (:data:`TARGETS`) are judged on the
paired figures: met, missed, not measured (no peer, say), or not applicable where they are about
16-bit hardware the machine lacks (each mpcore run records whether the backend expects its
policy to be fast here, and why).

``--jit`` runs mpcore's traced steps (``Model.compile(jit_compile=True)``, and
``mp.function`` over the loop's forward and backward).

``--peer-steps`` gives the peer fewer steps for chosen policies (torch's CPU float16 autocast is
~100x slower), e.g. ``--peer-steps mixed_float16=2``.

``--model resnet`` and ``--model transformer`` compare real models instead of the MLP:
``benchmarks/model_step.py`` (mpcore's ``Model.fit``; path ``fit``) against
``benchmarks/peers/torch_resnet.py`` / ``torch_transformer.py``, with the same shape options
on both sides (``--width``, ``--blocks``, ``--d-model`` ...; see ``compare_models.py``) and
``OMP_NUM_THREADS=1`` on both by default (``--threads``; the JSON records it). The speed
targets are the MLP's and are not judged for them.

The last line is one JSON object with every run and the medians. torch is never a dependency of
mpcore: it lives in its own interpreter (``--torch-python``); without one the peer is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import compare_models as cm

HERE = Path(__file__).resolve().parent
TRAIN_STEP = HERE / "train_step.py"
DEFAULT_PEER = HERE.parent.parent / "shared" / "peers" / "torch_mlp.py"
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def run_json(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The last JSON line a command prints (it must exit 0)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} printed no JSON:\n{proc.stdout[-2000:]}")
    return json.loads(lines[-1])


def torch_available(python: str | None) -> str | None:
    """None if ``python`` can import torch, else why not."""
    if not python:
        return "no --torch-python given"
    if shutil.which(python) is None and not Path(python).exists():
        return f"{python} not found"
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        return f"{python} cannot import torch: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def paired_ratios(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[float]:
    """``mine`` / ``theirs`` samples/s for every round in which both ran."""
    peer = {r["round"]: r["samples_per_s"] for r in theirs if r.get("samples_per_s")}
    return [round(r["samples_per_s"] / peer[r["round"]], 3) for r in mine
            if r.get("samples_per_s") and r["round"] in peer]


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


#: The speed targets on the CPU, set for the guide's MLP at :data:`TARGET_SIZE` (units, batch)
#: on 2 cores: (policy, the summary's paired figure, its least value, whether it is about
#: 16-bit hardware and so applies only where the backend says the policy runs fast, the target
#: in words).
TARGET_SIZE = (1024, 1024)
TARGETS = (
    ("float32", "vs_torch_paired", 1.0, False, "float32 >= 1.0x torch float32"),
    ("mixed_bfloat16", "vs_torch_paired", 1.0, True,
     "mixed_bfloat16 >= 1.0x torch autocast bfloat16"),
    ("mixed_bfloat16", "vs_own_float32_paired", 1.5, True,
     "mixed_bfloat16 >= 1.5x mpcore float32"),
    ("mixed_float16", "vs_own_float32_paired", 0.8, False,
     "mixed_float16 >= 0.8x mpcore float32"),
)


def targets_apply(size: tuple[int, int], backends: set[str], peer_device: str,
                  model: str = "mlp") -> str | None:
    """None where :data:`TARGETS` apply to a run of this model and size, these mpcore backends
    and this peer device; else why not."""
    if model != "mlp":
        return "the targets are set for the guide's MLP (--model mlp)"
    if size != TARGET_SIZE:
        return f"the targets are set for units, batch = {TARGET_SIZE}"
    if backends != {"cpu"} or peer_device != "cpu":
        return "the targets are set for the CPU (mpcore's cpu backend, torch on the CPU)"
    return None


def judge_targets(summary: dict[str, dict[str, Any]],
                  runs: dict[str, dict[str, list[dict[str, Any]]]],
                  paths: list[str], not_applicable: str | None = None
                  ) -> list[dict[str, Any]]:
    """Each of :data:`TARGETS` on each path: the figure, the least value and a status (met,
    missed, not run, not measured, or "not applicable: why": ``not_applicable`` for the whole
    run, see :func:`targets_apply`, or a hardware target on a machine whose backend does not
    call the policy fast)."""
    judged = []
    for policy, field, least, needs_fast, text in TARGETS:
        for path in paths:
            entry: dict[str, Any] = {"target": text, "path": path, "at_least": least,
                                     "measured": None}
            if policy not in summary:
                entry["status"] = "not run"
            else:
                entry["measured"] = value = summary[policy][path].get(field)
                slow = next((r for r in runs[policy][path] if r.get("fast") is False), None)
                if not_applicable is not None:
                    entry["status"] = f"not applicable: {not_applicable}"
                elif needs_fast and slow is not None:
                    entry["status"] = f"not applicable: {slow.get('why')}"
                elif value is None:
                    entry["status"] = "not measured"
                else:
                    entry["status"] = "met" if value >= least else "missed"
            judged.append(entry)
    return judged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--path", nargs="+", choices=("loop", "fit"), default=None,
                    help="mpcore's paths (default: loop and fit; only fit for other models)")
    ap.add_argument("--backend", default=None, help="mpcore backend (default: auto-detected)")
    ap.add_argument("--device", default="cpu", help="torch device for the peer")
    ap.add_argument("--units", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=None,
                    help="default: mlp 1024, resnet 128, transformer 32")
    ap.add_argument("--steps", type=int, default=None, help="default: mlp 20, others 10")
    ap.add_argument("--warmup", type=int, default=None, help="default: mlp 3, others 2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--torch-python", default=None,
                    help="an interpreter with torch, e.g. /work/torchvenv/bin/python")
    ap.add_argument("--peer", default=None,
                    help="the peer script (default: shared/peers/torch_mlp.py for mlp, "
                         "benchmarks/peers/torch_<model>.py for the others)")
    ap.add_argument("--peer-policy", nargs="+", choices=POLICIES, default=None,
                    help="policies to run the peer for (default: all; torch's CPU float16 "
                         "autocast is ~100x slower and can take minutes at full size)")
    ap.add_argument("--peer-steps", nargs="+", default=[], metavar="POLICY=STEPS",
                    help="timed steps of the peer for a policy (default: --steps)")
    ap.add_argument("--jit", action="store_true",
                    help="mpcore's traced steps (train_step.py --jit: fit with jit_compile=True)")
    ap.add_argument("--onednn", choices=("auto", "force", "off"), default=None,
                    help="MPCORE_ONEDNN for the mpcore runs (default: inherited)")
    cm.add_arguments(ap)
    a = ap.parse_args(argv)
    cm.apply_defaults(ap, a)
    a.peer = a.peer or str(cm.default_peer(a.model, DEFAULT_PEER))
    peer_steps: dict[str, int] = {}
    for item in a.peer_steps:
        policy, _, count = item.partition("=")
        if policy not in POLICIES or not count.isdigit() or int(count) < 1:
            ap.error(f"--peer-steps takes POLICY=STEPS with a policy of {', '.join(POLICIES)}, "
                     f"got {item!r}")
        peer_steps[policy] = int(count)

    shape = cm.shape_args(a)
    env = cm.thread_env(dict(os.environ), a.threads)
    if a.onednn:
        env["MPCORE_ONEDNN"] = a.onednn
    peer_problem = torch_available(a.torch_python)
    if peer_problem is None and not Path(a.peer).exists():
        peer_problem = f"peer script {a.peer} not found"
    sides = [*a.path, "torch"]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        p: {side: [] for side in sides} for p in a.policy}
    def run_mpcore(policy: str, round_no: int) -> None:
        for path in a.path:
            if a.model != "mlp":
                cmd = cm.mpcore_command(sys.executable, a, policy)
            else:
                cmd = [sys.executable, str(TRAIN_STEP), "--path", path, "--policy", policy,
                       *shape, *(["--jit"] if a.jit else [])]
                if a.backend:
                    cmd += ["--backend", a.backend]
            rec = run_json(cmd, env)
            if "skipped" in rec:
                raise RuntimeError(f"mpcore's run was skipped: {rec['skipped']}")
            rec["round"] = round_no
            runs[policy][path].append(rec)

    def run_peer(policy: str, round_no: int) -> None:
        if peer_problem is not None or (a.peer_policy is not None
                                        and policy not in a.peer_policy):
            return
        assert a.torch_python is not None
        peer_shape = list(shape)
        if policy in peer_steps:
            peer_shape[peer_shape.index("--steps") + 1] = str(peer_steps[policy])
            peer_shape[peer_shape.index("--warmup") + 1] = "1"
        rec = run_json([a.torch_python, a.peer, "--device", a.device, "--policy", policy,
                        *peer_shape, *cm.peer_threads(a)], env)
        rec["round"] = round_no
        runs[policy]["torch"].append(rec)

    for round_no in range(a.rounds):
        for policy in a.policy:
            order = (run_mpcore, run_peer) if round_no % 2 == 0 else (run_peer, run_mpcore)
            for run in order:
                run(policy, round_no)
        print(f"round {round_no + 1}/{a.rounds} done", file=sys.stderr, flush=True)

    summary: dict[str, dict[str, Any]] = {}
    for policy in a.policy:
        theirs = median(runs[policy]["torch"], "samples_per_s")
        summary[policy] = {"torch_samples_per_s": theirs,
                           "torch_ms_per_step": median(runs[policy]["torch"], "ms_per_step")}
        for path in a.path:
            mine = median(runs[policy][path], "samples_per_s")
            paired = paired_ratios(runs[policy][path], runs[policy]["torch"])
            summary[policy][path] = {"mpcore_samples_per_s": mine,
                                     "mpcore_ms_per_step": median(runs[policy][path],
                                                                  "ms_per_step"),
                                     "vs_torch": ratio(mine, theirs),
                                     "vs_torch_rounds": paired,
                                     "vs_torch_paired": (round(statistics.median(paired), 3)
                                                         if paired else None)}
    for path in a.path:
        own_f32 = summary.get("float32", {}).get(path, {}).get("mpcore_samples_per_s")
        f32_runs = runs["float32"][path] if "float32" in runs else []
        for policy in a.policy:
            entry = summary[policy][path]
            entry["vs_own_float32"] = ratio(entry["mpcore_samples_per_s"], own_f32)
            own = paired_ratios(runs[policy][path], f32_runs)
            entry["vs_own_float32_rounds"] = own
            entry["vs_own_float32_paired"] = round(statistics.median(own), 3) if own else None

    mpcore_runs = [r for pol in runs.values() for path in a.path for r in pol[path]]
    providers = sorted({p for r in mpcore_runs for p in r.get("providers", [])})
    shape_text = " ".join(f"{k}={v}" for k, v in cm.shape_record(a).items())
    print(f"\nmodel={a.model} {shape_text} rounds={a.rounds} threads={a.threads or 'inherited'}"
          f" (medians of samples/s; mpcore kernel providers: {providers or 'none'})")
    if peer_problem:
        print(f"peer skipped: {peer_problem}")
    if peer_steps:
        print(f"peer steps: {peer_steps} (others: {a.steps})")
    header = (f"{'path':<6}{'policy':<16}{'mpcore':>12}{'torch':>12}{'vs torch':>10}"
              f"{'paired':>8}{'range':>14}{'vs own f32':>12}{'own paired':>12}")
    print(header)
    print("-" * len(header))

    def fmt(v: float | None, spec: str) -> str:
        return format(v, spec) if v is not None else format("-", f">{spec.split('.')[0]}")

    for path in a.path:
        for policy in a.policy:
            s = summary[policy]
            e = s[path]
            spread = (f"{min(e['vs_torch_rounds']):.2f}-{max(e['vs_torch_rounds']):.2f}"
                      if e["vs_torch_rounds"] else "-")
            print(f"{path:<6}{policy:<16}{fmt(e['mpcore_samples_per_s'], '12.1f')}"
                  f"{fmt(s['torch_samples_per_s'], '12.1f')}{fmt(e['vs_torch'], '10.3f')}"
                  f"{fmt(e['vs_torch_paired'], '8.3f')}{spread:>14}"
                  f"{fmt(e['vs_own_float32'], '12.3f')}{fmt(e['vs_own_float32_paired'], '12.3f')}")
    judged = judge_targets(summary, runs, a.path,
                           targets_apply((a.units, a.batch),
                                         {r.get("backend") for r in mpcore_runs}, a.device,
                                         a.model))
    print("\ntargets (paired figures):")
    for t in judged:
        print(f"  {t['path']:<6}{t['target']:<50}{fmt(t['measured'], '7.3f')}  {t['status']}")
    print(json.dumps({"bench": "compare", "model": a.model, **cm.shape_record(a),
                      "threads": a.threads, "paths": a.path, "jit": a.jit, "rounds": a.rounds,
                      "peer_skipped": peer_problem,
                      "summary": summary, "targets": judged, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
