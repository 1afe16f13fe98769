"""What ``litellm-kv doctor`` found: one :class:`Finding` per check, printed as it is made (progress), and
the whole :class:`Report` as text or JSON at the end."""

from __future__ import annotations

import enum
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO


class Status(str, enum.Enum):
    OK = "ok"
    WARN = "warn"  # works, but not as well as it could (slower path, a blind spot): exit code stays 0
    ERROR = "error"  # routing would not be exact, or a part is unreachable: exit code 1
    SKIP = "skip"  # could not be checked because an earlier check failed


@dataclass(slots=True)
class Finding:
    """One check's outcome."""

    check: str  # stable id, e.g. "engine.prefix_caching"
    target: str  # what was checked: "config", a group, "group/replica", "redis", an indexer URL, a key
    status: Status
    detail: str  # what was seen
    fix: str = ""  # what to do about it (errors and warnings)


_MARK = {Status.OK: "ok   ", Status.WARN: "WARN ", Status.ERROR: "ERROR", Status.SKIP: "skip "}


@dataclass(slots=True)
class Report:
    """Every finding, in the order the checks ran. ``progress`` (a stream or None) gets each line at once."""

    progress: TextIO | None = None
    findings: list[Finding] = field(default_factory=list)
    _section: str = ""

    def section(self, title: str) -> None:
        """Start a group of checks (printed as a heading, so a slow check shows what it is waiting on)."""
        self._section = title
        self._print(f"\n== {title}")

    def add(self, check: str, target: str, status: Status, detail: str, fix: str = "") -> Finding:
        f = Finding(check, target, status, detail, fix)
        self.findings.append(f)
        line = f"  {_MARK[status]} {check:<28} {detail}"
        if fix and status in (Status.ERROR, Status.WARN):
            line += f"\n  {'':5} {'':<28} fix: {fix}"
        self._print(line)
        return f

    def _print(self, text: str) -> None:
        if self.progress is not None:
            print(text, file=self.progress, flush=True)

    def count(self, status: Status) -> int:
        return sum(1 for f in self.findings if f.status is status)

    @property
    def exit_code(self) -> int:
        return 1 if self.count(Status.ERROR) else 0

    def summary(self) -> str:
        errors, warns = self.count(Status.ERROR), self.count(Status.WARN)
        if errors:
            return f"{errors} problem(s) to fix, {warns} warning(s): see the ERROR lines above."
        if warns:
            return f"no errors, {warns} warning(s)."
        return f"all {self.count(Status.OK)} checks passed."

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.exit_code == 0,
            "errors": self.count(Status.ERROR),
            "warnings": self.count(Status.WARN),
            "findings": [{**asdict(f), "status": f.status.value} for f in self.findings],
        }


def write_json(report: Report, out: TextIO = sys.stdout) -> None:
    json.dump(report.to_json(), out, indent=2)
    out.write("\n")
