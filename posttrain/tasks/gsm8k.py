"""GSM8K's answer reward, as verl scores it: `task.reward=posttrain.tasks.gsm8k:compute_score`.

verl's rule (verl/utils/reward_score/gsm8k.py, volcengine/verl at b178a3cd, 2026-01-29; its
quickstart's reward): the answer is the number after the LAST "#### " in the response's final 300
characters (strict: the model must write "#### 42"), with commas and dollar signs removed; score 1
when it equals the ground truth as a string, `format_score` (0) when a number is there but wrong,
0 when there is none. `method="flexible"` takes the last number anywhere instead.

The ground truth: verl's preprocessing (examples/data_preprocess/gsm8k.py) stores the number after
"#### " of the dataset's `answer` column, commas removed. Rows read straight from `openai/gsm8k`
carry the whole worked solution there, so an answer that holds "#### " is cut the same way here
first; a bare number (a verl-preprocessed parquet's `reward_model.ground_truth`) is used as it is.
tests/test_gsm8k.py checks every case against verl's code.
"""

from __future__ import annotations

import re

_SOLUTION_CLIP_CHARS = 300  # verl: "the final answer is usually at the end"
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The response's final answer as verl extracts it (None: no answer in the required form)."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method={method!r}: use strict or flexible")
    text = solution_str[-_SOLUTION_CLIP_CHARS:]
    if method == "strict":  # "#### N", the last one: this also tests the format
        found = _STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    numbers = _FLEXIBLE.findall(text)  # the last that is not "" or "." (verl: else the first found)
    return next((n for n in reversed(numbers) if n not in ("", ".")), numbers[0] if numbers else None)


def ground_truth_of(answer) -> str:
    """The gold number: after "#### " (the dataset's worked solution, commas removed, as verl's
    preprocessing stores it), else the answer as a string."""
    text = str(answer)
    found = _STRICT.search(text)
    return found.group(1).replace(",", "") if found else text.strip()


def compute_score(
    data_source, solution_str, ground_truth, extra_info=None, method="strict", format_score=0.0, score=1.0
) -> float:
    """verl's signature (tasks/rewards.py calls it per sample): `score` for the right number,
    `format_score` for a wrong one, 0 for none."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answer == ground_truth_of(ground_truth) else float(format_score)
