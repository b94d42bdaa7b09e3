"""``mpcore conformance NAME`` and ``python -m mpcore.conformance NAME``: run the kit on a
registered backend and print the report (a table, or JSON); the exit status is 0 when the
backend conforms, 1 when it does not, 2 for a backend name that is not registered or an
``--only`` pattern that matches no check.

The subcommand comes in through the ``mpcore_commands`` hook, as a third party's would.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mpcore.conformance.plan import check, check_names
from mpcore.plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from mpcore.cli.app import Subcommands

HELP = "check a backend against the kernel and plugin contract"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("backend", help="the registered backend name to check")
    parser.add_argument("--reference", default="cpu", help="reference backend (default: cpu)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller inputs and samples (a few seconds)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--only", action="append", metavar="PATTERN",
                        help="run only checks whose name contains or matches PATTERN "
                             "(repeatable)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")


def run(args: argparse.Namespace) -> int:
    if args.list:
        print("\n".join(check_names(args.quick)))
        return 0
    try:
        report = check(args.backend, reference=args.reference, quick=args.quick,
                       only=args.only)
    except ValueError as exc:
        print(f"mpcore conformance: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format_table())
    return 0 if report.ok else 1


@hookimpl
def mpcore_commands(subcommands: Subcommands) -> None:
    subcommands.add("conformance", HELP, run, configure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpcore.conformance",
                                     description="Check an mpcore backend against the contract "
                                                 "(the CPU backend is the reference).")
    configure(parser)
    return run(parser.parse_args(argv))
