"""Configuration problems, collected so that every one of them is reported at once."""

from dataclasses import dataclass

from tuneforge.errors import TuneforgeError


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: the field path (`train.lr`), where it was set, what is wrong and the fix."""

    path: str
    message: str
    fix: str = ""
    location: str = ""

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        field = f"{self.path}: " if self.path else ""
        fix = f"\n    fix: {self.fix}" if self.fix else ""
        return f"{where}{field}{self.message}{fix}"


class ConfigError(TuneforgeError):
    """One or more configuration problems; `issues` lists them all."""

    def __init__(self, issues: list[ConfigIssue], source: str = "") -> None:
        self.issues = list(issues)
        self.source = source
        count = len(self.issues)
        head = f"{source}: " if source else ""
        noun = "problem" if count == 1 else "problems"
        lines = [f"{head}{count} configuration {noun}:"]
        lines += [f"  - {issue}".replace("\n", "\n  ") for issue in self.issues]
        super().__init__("\n".join(lines))
