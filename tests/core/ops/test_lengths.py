"""``armor_core.ops.lengths``: a response's length, DAPO's overlong penalty and the target band, by hand."""

from __future__ import annotations

import pytest

from armor_core.ops.lengths import band_score, overlong_penalty, response_length


def test_response_length_in_tokens_or_chars():
    assert response_length("abcd", {"response_length": 2}, "tokens") == 2
    assert response_length("abcd", {}, "chars") == 4
    with pytest.raises(ValueError, match="overlong_unit='chars'"):
        response_length("abcd", {}, "tokens", param="overlong_unit")
    with pytest.raises(ValueError, match="unit='words'"):
        response_length("abcd", {}, "words")


@pytest.mark.parametrize("length, expected", [(80, 0.0), (90, -0.25), (100, -0.5), (500, -0.5)])
def test_overlong_penalty_falls_linearly_in_the_buffer(length, expected):
    assert overlong_penalty(length, 100, 20, factor=0.5) == pytest.approx(expected)


@pytest.mark.parametrize(
    "length, target_min, target_max, falloff, expected",
    [
        (15, 10, 20, None, 1.0),
        (5, 10, 20, None, 0.5),
        (30, 10, 20, None, 0.5),
        (23, 10, 20, 6, 0.5),
        (40, None, 20, 6, 0.0),
    ],
)
def test_band_score_by_hand(length, target_min, target_max, falloff, expected):
    assert band_score(length, target_min, target_max, falloff) == pytest.approx(expected)
