"""``extract_answer`` keeps only the last match of ``pattern``: it listed every match first, so a
pattern that matches often (``(\\d*)`` matches at every position) held one match object per character
of the policy's text: 144 MB for 1 MB of text, in the process that scores it."""

from __future__ import annotations

import re
import tracemalloc

from harnessrl.tasks.answers import extract_answer


def _peak_bytes(text: str, pattern: str) -> tuple[str | None, int]:
    tracemalloc.start()
    try:
        answer = extract_answer(text, re.compile(pattern), "none")
        return answer, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_pattern_matching_everywhere_holds_no_list_of_its_matches():
    text = "x" * 200_000 + " Answer: 7"
    answer, peak = _peak_bytes(text, r"(\d*)")
    assert answer == ""  # the last match: the empty one at the end
    assert peak < 2_000_000, f"peak {peak} bytes for {len(text)} characters"
    # the control: the last match is still the one read
    assert _peak_bytes("Answer: 3 then Answer: 7.", r"Answer:\s*(\d+)")[0] == "7"
