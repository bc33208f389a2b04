"""One section of the lesson: its printed lines and the numbers a test pins."""

import math
from dataclasses import dataclass, field

import torch


@dataclass
class Section:
    """``key`` names the section in docs/attention.md; ``numbers`` holds what the lesson's tests pin."""

    key: str
    title: str
    lines: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)

    def say(self, line: str = "") -> None:
        self.lines.append(line)

    def table(self, name: str, values: torch.Tensor, digits: int = 3, width: int = 8) -> None:
        """A matrix under its name and shape, one row per line (-inf printed as such)."""
        self.say(f"{name}  shape {tuple(values.shape)}")
        for row in values.tolist():
            self.say("".join(cell(x, digits).rjust(width) for x in row))

    def text(self) -> str:
        return "\n".join(self.lines)


def cell(x: float, digits: int) -> str:
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return f"{x:.{digits}f}"


def rounded(values: torch.Tensor, digits: int) -> list:
    """A tensor as nested lists of Python floats rounded to ``digits`` (how the documents print them)."""
    return torch.round(values.double(), decimals=digits).tolist()


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def beside(label: str, ours: str, theirs: str) -> str:
    """One figure that depends on a random draw the document does not pin: ours, then the document's."""
    return f"{label:<34} ours {ours:>10}   document {theirs:>10}"
