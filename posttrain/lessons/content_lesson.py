"""What a lesson is (the Lesson record) and the names of the course's parts. Its own module so the
lesson lists (content_rl_foundations, content_rl_production, content_gpt) and content.py, which
strings them together, all import it without importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Lesson:
    id: str
    number: str
    title: str
    part: str
    idea: str
    why: str
    code: list[str]  # "module:qualname", resolved by pages.code_ref
    widgets: list[str] = field(default_factory=list)  # names in the widget registry

    @property
    def track(self) -> str:
        return "gpt" if self.id.startswith("gpt-") else "rl"


P0 = "Start here · orientation"
P1 = "Part I · the framework: six roles around the loss"
P2 = "Part II · the algorithms: one lineage"
P3 = "Part III · production: signal, data and systems"
P4 = "Part IV · the engineer"
P5 = "Part V · synthesis"
G = "gpt_mini · the whole pipeline on a tiny model"
PARTS = [P0, P1, P2, P3, P4, P5]  # the RL track, in reading order
ALG = "posttrain.algorithms"  # the prefix of most lessons' code references
