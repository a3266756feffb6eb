"""Stop tokens, stop strings, max tokens and held-back text, with a fake decoder (no model)."""
from __future__ import annotations

from strata.engine.sampling import SamplingParams
from strata.engine.sequence import Sequence, StopConditions


class Letters:
    """Token i decodes to chr(ord('a') + i); token 99 to two bytes of one character, split."""

    def push(self, t: int) -> str:
        return chr(ord("a") + t)

    def flush(self) -> str:
        return ""


def _seq(**stop) -> Sequence:
    return Sequence(0, [1, 2], SamplingParams(), StopConditions(**stop), Letters())


def test_max_tokens_ends_with_length():
    s = _seq(max_tokens=3)
    deltas = [s.append(t) for t in (0, 1, 2)]
    assert deltas == ["a", "b", "c"] and s.finish_reason == "length" and s.output_ids == [0, 1, 2]


def test_stop_token_is_not_part_of_the_output():
    s = _seq(stop_token_ids=frozenset({5}))
    assert [s.append(t) for t in (0, 5)] == ["a", ""]
    assert s.finish_reason == "stop" and s.output_ids == [0] and s.text == "a"


def test_stop_string_cuts_the_text_and_held_back_text_is_released_when_it_is_not_one():
    s = _seq(stop_strings=("cde",))
    assert s.append(0) == "a"
    assert s.append(2) == ""  # 'c' may start 'cde'
    assert s.append(3) == ""  # 'cd' too
    assert s.append(0) == "cda"  # 'cda' is not 'cde': released
    assert s.append(2) == "" and s.append(3) == "" and s.append(4) == ""
    assert s.finish_reason == "stop" and s.text == "acda"


def test_stop_string_spanning_tokens_and_held_text_flushed_at_length():
    s = _seq(stop_strings=("xyz",), max_tokens=2)
    assert s.append(23) == "" and s.append(24) == "xy"  # 'x', 'y' held, then released at max_tokens
    assert s.finish_reason == "length" and s.text == "xy"


def test_pending_ids_follow_the_cache():
    s = _seq()
    assert s.pending_ids == [1, 2]
    s.n_cached = 2
    s.append(7)
    assert s.pending_ids == [7] and s.all_ids == [1, 2, 7]
