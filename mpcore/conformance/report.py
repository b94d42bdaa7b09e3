"""The result of a conformance run: one :class:`CheckResult` per check, gathered in a
:class:`Report` that says whether the backend conforms and prints as a table or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mpcore.core.backend import REQUIRED_KERNELS

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass(frozen=True)
class CheckResult:
    name: str
    group: str
    status: str          # "pass", "fail" or "skip"
    detail: str
    seconds: float
    kernels: tuple[str, ...] = ()


@dataclass
class Report:
    """Every check run against ``backend``, in order."""

    backend: str
    reference: str
    quick: bool
    results: list[CheckResult] = field(default_factory=list)
    only: tuple[str, ...] = ()   # the --only patterns, if the run was filtered

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAIL]

    @property
    def ok(self) -> bool:
        """No check failed, and at least one passed (unless ``only`` chose checks that all
        skip: a filtered run proves only what it selected)."""
        return not self.failures and (bool(self.only)
                                      or any(r.status == PASS for r in self.results))

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in (PASS, FAIL, SKIP)}

    def covered_kernels(self) -> set[str]:
        """Kernels exercised by a check that passed."""
        return {k for r in self.results if r.status == PASS for k in r.kernels}

    def result(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        names = ", ".join(r.name for r in self.results)
        raise KeyError(f"no check named {name!r}; checks: {names}")

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "reference": self.reference, "quick": self.quick,
                "only": list(self.only), "ok": self.ok, "counts": self.counts(),
                "uncovered_required_kernels": sorted(set(REQUIRED_KERNELS)
                                                     - self.covered_kernels()),
                "results": [{**asdict(r), "kernels": list(r.kernels),
                             "seconds": round(r.seconds, 4)} for r in self.results]}

    def format_table(self) -> str:
        width = max([len(r.name) for r in self.results] + [5])
        lines = [f"mpcore conformance: backend {self.backend!r} against {self.reference!r}"
                 f"{' (quick)' if self.quick else ''}", "",
                 f"{'status':<6}  {'check':<{width}}  {'ms':>7}  detail"]
        for r in self.results:
            lines.append(f"{r.status.upper():<6}  {r.name:<{width}}  {r.seconds * 1e3:7.1f}  "
                         f"{r.detail}")
        c = self.counts()
        lines += ["", f"{c[PASS]} passed, {c[FAIL]} failed, {c[SKIP]} skipped: "
                  + ("CONFORMS" if self.ok else "DOES NOT CONFORM")
                  + (f" (only the checks matching {', '.join(self.only)})" if self.only else "")]
        uncovered = sorted(set(REQUIRED_KERNELS) - self.covered_kernels())
        if uncovered and not self.only:
            lines.append("required kernels not proven by a passing check: "
                         + ", ".join(uncovered))
        return "\n".join(lines)

