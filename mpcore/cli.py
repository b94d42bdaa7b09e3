"""The ``mpcore`` command: ``mpcore info`` (backends, devices, verdicts) and more.

``mpcore info`` lists every registered backend, available or why not, its devices, and for each
policy whether it is supported and fast and why; the backend auto-detection chose; and every
plugin that failed to load. ``--json`` prints the same for machines; ``--measure`` adds the
measured 16-bit vs float32 matmul speed of every available backend.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mpcore.policy import POLICIES

_SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                              Callable[[argparse.Namespace], int]]] = {}


def subcommand(name: str, help_text: str,
               configure: Callable[[argparse.ArgumentParser], None] | None = None
               ) -> Callable[..., Any]:
    """Register ``mpcore NAME``: decorate a function taking the parsed arguments and returning
    an exit code; ``configure`` adds its arguments to the parser."""
    def deco(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _SUBCOMMANDS[name] = (help_text, configure or (lambda p: None), fn)
        return fn
    return deco


def info_report(measure: bool = False) -> dict[str, Any]:
    """Everything ``mpcore info`` shows, as a dict."""
    from mpcore import registry
    from mpcore.plugins import get_plugins, plugin_errors
    from mpcore.verdict import measure_matmul_speed

    report: dict[str, Any] = {"backends": [], "selected": None, "selection": "",
                              "plugin_errors": []}
    try:
        chosen = registry.get_backend()
        report["selected"] = chosen.name
        report["selection"] = registry.detection_note()
    except Exception as exc:
        report["selection"] = f"no backend: {exc}"
    origins = get_plugins().backend_origin
    for backend in registry.backends():
        entry: dict[str, Any] = {"name": backend.name, "priority": backend.priority,
                                 "plugin": origins.get(backend.name, "?"),
                                 "available": False, "reason": None, "devices": [],
                                 "policies": {}}
        reason = backend.unavailable_reason()
        if reason is not None:
            entry["reason"] = reason
            entry["install"] = backend.install_hint
            report["backends"].append(entry)
            continue
        entry["available"] = True
        try:
            devices = backend.devices()
            entry["devices"] = [d.describe() for d in devices]
            device = backend.device()
            for policy in POLICIES:
                s = backend.policy_support(policy, device)
                entry["policies"][policy] = {"supported": s.supported, "fast": s.fast,
                                             "reason": s.reason}
            if measure:
                entry["measured"] = {}
                for dtype in ("float16", "bfloat16"):
                    m = measure_matmul_speed(backend, dtype)
                    entry["measured"][dtype] = {"n": m.n, "gflops": round(m.gflops, 1),
                                                "float32_gflops": round(m.float32_gflops, 1),
                                                "speedup": round(m.speedup, 3)}
        except Exception as exc:  # a backend that breaks while describing itself is reported
            entry["available"] = False
            entry["reason"] = f"failed while describing devices: {type(exc).__name__}: {exc}"
        report["backends"].append(entry)
    report["plugin_errors"] = [{"plugin": e.plugin, "target": e.target, "error": e.error}
                               for e in plugin_errors()]
    return report


def format_info(report: dict[str, Any]) -> str:
    lines = [f"mpcore backends (selected: {report['selected'] or 'none'}; "
             f"{report['selection']})", ""]
    for b in report["backends"]:
        mark = "*" if b["name"] == report["selected"] else " "
        if not b["available"]:
            hint = f" (install with {b['install']})" if b.get("install") else ""
            lines.append(f"{mark} {b['name']}: not available: {b['reason']}{hint}")
            continue
        lines.append(f"{mark} {b['name']}: available (plugin {b['plugin']}, "
                     f"priority {b['priority']})")
        for d in b["devices"]:
            feats = ", ".join(d.get("features", [])) or "-"
            lines.append(f"    device {d['index']}: {d['name']} [{d['kind']}, {d['vendor']}, "
                         f"{d['capability']}] features: {feats}")
        width = max(len(p) for p in b["policies"]) if b["policies"] else 0
        for policy, s in b["policies"].items():
            state = "fast" if s["fast"] else ("supported" if s["supported"] else "unsupported")
            lines.append(f"    {policy:<{width}}  {state:<11}  {s['reason']}")
        for dtype, m in b.get("measured", {}).items():
            lines.append(f"    measured {dtype} matmul (n={m['n']}): {m['gflops']} GFLOP/s vs "
                         f"float32 {m['float32_gflops']} GFLOP/s = {m['speedup']}x")
    if report["plugin_errors"]:
        lines += ["", "plugins that failed to load:"]
        lines += [f"  {e['plugin']} ({e['target']}): {e['error']}"
                  for e in report["plugin_errors"]]
    return "\n".join(lines)


def _configure_info(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--measure", action="store_true",
                        help="time 16-bit vs float32 matmuls on every available backend")


@subcommand("info", "backends, devices and policy verdicts", _configure_info)
def _info(args: argparse.Namespace) -> int:
    report = info_report(measure=args.measure)
    print(json.dumps(report, indent=2) if args.json else format_info(report))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    _load_more_subcommands()
    parser = argparse.ArgumentParser(prog="mpcore", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, configure, _) in _SUBCOMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return _SUBCOMMANDS[args.command][2](args)


def _load_more_subcommands() -> None:
    """Subcommands that live with their feature (``mpcore demo`` in mpcore.demo)."""
    import importlib

    for module in ("mpcore.demo", "mpcore.conformance"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


if __name__ == "__main__":
    sys.exit(main())
