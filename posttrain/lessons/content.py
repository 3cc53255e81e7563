"""The course's structure: each lesson's id, number, title, part and track, where its code lives
(links computed from the live source) and which widgets it carries. A lesson's text is
text/<id>.md (rendered by markdown.py); the short `idea`/`why` strings here stand in for a lesson
that has no text file yet, and give the gpt_mini index its one-line summaries. The lessons
themselves are listed by part in content_rl_foundations, content_rl_production and content_gpt."""

from __future__ import annotations

from pathlib import Path

from posttrain.errors import UsageError
from posttrain.lessons.content_gpt import GPT_LESSONS
from posttrain.lessons.content_lesson import PARTS, G, Lesson  # noqa: F401  (content.G and content.PARTS, read by pages)
from posttrain.lessons.content_rl_foundations import FOUNDATIONS
from posttrain.lessons.content_rl_production import PRODUCTION
from posttrain.lessons.decisions import DECISIONS  # noqa: F401  (content.DECISIONS, read by pages)

TRACKS = {
    "rl": ("RL post-training, from first principles", "index.html"),  # track → (title, its index page)
    "gpt": ("gpt_mini: post-training a tiny model", "gpt_mini.html"),
}
TEXT_DIR = Path(__file__).resolve().parent / "text"  # text/<lesson-id>.md; gpt-index.md is the gpt_mini index

INTRO = (
    "Each page explains one idea of RL post-training and lets you turn its knobs. The plots are "
    "computed by posttrain's own functions (the same ones the trainer runs), so what you see is what "
    "the framework does. Every widget has at least one setting that breaks training; the page says which."
)

LESSONS: list[Lesson] = FOUNDATIONS + PRODUCTION + GPT_LESSONS  # the RL track's parts in order, then gpt_mini

LINEAGE = [
    ("rl-09", "REINFORCE", "−A·log π with A = R; unbiased, high variance"),
    ("rl-10", "PPO", "+ learned critic and GAE as the baseline, + the clipped ratio"),
    ("rl-11", "GRPO", "critic replaced by the group mean/std of G samples per prompt"),
    ("rl-12", "RLOO", "baseline = mean of the other G−1 samples (unbiased), no clip"),
    ("rl-13", "DAPO", "clip-higher, dynamic sampling, token-level loss, overlong shaping"),
    ("rl-14", "Dr. GRPO", "no /std, no /|y_i|"),
]

PATHS = [
    ("I am new here", ["rl-00", "rl-01", "rl-07"]),
    ("I want to understand sampling", ["rl-02", "rl-20", "rl-21"]),
    ("I want to change the algorithm", ["rl-04", "rl-11", "rl-14"]),
    ("I want a better reward", ["rl-03", "rl-15", "rl-18", "rl-18a"]),
    ("I want to size a cluster", ["rl-19", "rl-22", "rl-22a"]),
]

NOT_YET = [
    "Lesson 22's planner widget shows one colocated pool; split placements (separate trainer, reference "
    "and rollout pools) are a knob only in lesson 24's sizing widget (and in `posttrain memory`).",
]


def track(lesson: Lesson) -> list[Lesson]:
    """The lessons of the track the lesson belongs to, in reading order."""
    return [ls for ls in LESSONS if ls.track == lesson.track]


def text_path(page_id: str) -> Path:
    return TEXT_DIR / f"{page_id}.md"


def by_id(lesson_id: str) -> Lesson:
    for ls in LESSONS:
        if ls.id == lesson_id:
            return ls
    raise UsageError(f"no lesson {lesson_id!r}; lessons: {', '.join(ls.id for ls in LESSONS)}")
