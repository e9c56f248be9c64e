"""Rule scorers on hand-written cases (verl's semantics) and dispatch by data_source."""
import sys
import types

import pytest

from hybridrl.reward import arithmetic, default_compute_score, gsm8k, math_boxed, register_data_source, scoring


@pytest.mark.parametrize("response,truth,expected", [
    ("3 + 4 = 7 apples.\n#### 7", "7", 1.0),
    ("#### 7", "8", 0.0),                       # wrong answer: format_score (0.0)
    ("The answer is 7", "7", 0.0),              # strict needs '#### '
    ("####7", "7", 0.0),                        # ... with the space
    ("#### 1,234", "1234", 1.0),                # commas stripped
    ("#### -12", "-12", 1.0),                   # negative numbers
    ("#### 3 wait, no.\n#### 4", "4", 1.0),     # the last '#### N' counts
    ("#### 3 wait, no.\n#### 4", "3", 0.0),
    ("#### 42.", "42", 0.0),                    # verl: trailing period kept, no match
    ("#### $18", "18", 0.0),                    # verl: '$' right after '####' is not a number
    ("#### 7" + " pad" * 100, "7", 0.0),        # only the last 300 characters are searched
])
def test_gsm8k_strict(response, truth, expected):
    assert gsm8k.compute_score(response, truth) == expected


@pytest.mark.parametrize("response,truth,expected", [
    ("so 3+4 gives 7", "7", 1.0),
    ("first 5 then 6", "5", 0.0),               # the LAST number counts
    ("it is -3 now", "-3", 1.0),
    ("total 1,234", "1234", 0.0),               # verl's flexible mode keeps commas
    ("no numbers here", "1", 0.0),
    ("#### 9 .", "9", 1.0),                     # a lone '.' is skipped
])
def test_gsm8k_flexible(response, truth, expected):
    assert gsm8k.compute_score(response, truth, method="flexible") == expected


def test_gsm8k_format_score_and_score():
    assert gsm8k.compute_score("#### 5", "6", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no answer", "6", format_score=0.1) == 0.0
    assert gsm8k.compute_score("#### 6", "6", score=2.0) == 2.0
    assert gsm8k.compute_score("#### 6", 6) == 1.0  # a non-string ground truth is compared as str
    assert gsm8k.extract_solution("a #### 1,000,000 b") == "1000000"
    with pytest.raises(ValueError, match="method must be 'strict' or 'flexible'"):
        gsm8k.compute_score("#### 1", "1", method="loose")


@pytest.mark.parametrize("text,boxed", [
    ("so \\boxed{\\frac{1}{2}} done", "\\boxed{\\frac{1}{2}}"),
    ("\\boxed{1} then \\boxed{{a}_{b}}", "\\boxed{{a}_{b}}"),
    ("$\\boxed 5$ ok", "\\boxed 5"),
    ("\\fbox{7}", "\\fbox{7}"),
    ("\\boxed{unclosed", None),
    ("nothing", None),
])
def test_last_boxed(text, boxed):
    assert math_boxed.last_boxed_only_string(text) == boxed


@pytest.mark.parametrize("raw,normalized", [
    ("\\frac12", "\\frac{1}{2}"),
    ("\\frac1{72}", "\\frac{1}{72}"),
    ("\\dfrac{3}{4}", "\\frac{3}{4}"),
    ("3/4", "\\frac{3}{4}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("\\sqrt3", "\\sqrt{3}"),
    ("5 \\text{ cm}", "5"),
    ("10\\%", "10"),
    ("90^\\circ", "90"),
    ("x = 5", "5"),
    ("\\$4.50", "4.50"),
    (".5", "\\frac{1}{2}"),
    ("0.5", "\\frac{1}{2}"),
    ("0.25", "0.25"),
    ("a\nb", "ab"),
])
def test_normalize_answer(raw, normalized):
    assert math_boxed.normalize_answer(raw) == normalized


@pytest.mark.parametrize("response,truth,expected", [
    ("Thus \\boxed{\\frac{1}{2}}.", "\\frac12", 1.0),
    ("Thus \\boxed{\\dfrac{1}{2}}.", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})", 1.0),
    ("\\boxed{1} no wait \\boxed{2}", "2", 1.0),
    ("\\boxed{1} no wait \\boxed{2}", "1", 0.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),
    ("\\boxed{x = 5}", "5", 1.0),
    ("the answer is 5", "5", 0.0),             # no boxed answer
    ("\\boxed{5", "5", 0.0),                   # unbalanced
    ("\\boxed{6}", "5", 0.0),
])
def test_math_score(response, truth, expected):
    assert math_boxed.compute_score(response, truth) == expected


def test_math_decimal_vs_fraction_needs_math_verify():
    if math_boxed.math_verify_available():
        assert math_boxed.compute_score("\\boxed{0.25}", "\\frac{1}{4}") == 1.0
    else:
        assert math_boxed.compute_score("\\boxed{0.25}", "\\frac{1}{4}") == 0.0


def test_math_verify_is_used_when_importable(monkeypatch):
    calls = []
    fake = types.ModuleType("math_verify")
    fake.parse = lambda s: s
    fake.verify = lambda gold, pred: calls.append((gold, pred)) or (gold == "\\boxed{\\frac{1}{4}}" and "0.25" in pred)
    monkeypatch.setitem(sys.modules, "math_verify", fake)
    monkeypatch.setattr(math_boxed, "math_verify_available", lambda: True)
    assert math_boxed.compute_score("\\boxed{0.25}", "\\frac{1}{4}") == 1.0
    assert calls == [("\\boxed{\\frac{1}{4}}", "\\boxed{0.25}")]
    assert math_boxed.compute_score("\\boxed{0.5}", "\\frac{1}{3}") == 0.0
    fake.verify = lambda gold, pred: 1 / 0  # an internal failure falls back to the string comparison
    assert math_boxed.compute_score("\\boxed{\\frac12}", "\\frac{1}{2}") == 1.0
    assert math_boxed.compute_score("\\boxed{0.3}", "\\frac{1}{3}") == 0.0


@pytest.mark.parametrize("response,truth,expected", [
    ("7", "7", 1.0), (" 7\n", "7", 1.0), ("-3", "-3", 1.0), ("07", "7", 1.0),
    ("8", "7", 0.0), ("7 7", "7", 0.0), ("#### 7", "7", 0.0), ("", "7", 0.0), ("seven", "7", 0.0),
])
def test_arithmetic_score(response, truth, expected):
    assert arithmetic.compute_score(response, truth) == expected


def test_arithmetic_format_score():
    assert arithmetic.compute_score("8", "7", format_score=0.1) == 0.1
    assert arithmetic.compute_score("x", "7", format_score=0.1) == 0.0


@pytest.mark.parametrize("source,response,truth,expected", [
    ("openai/gsm8k", "#### 12", "12", 1.0),
    ("openai/gsm8k", "\\boxed{12}", "12", 0.0),
    ("lighteval/MATH", "\\boxed{\\frac12}", "\\frac{1}{2}", 1.0),
    ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{3}", "3", 1.0),
    ("HuggingFaceH4/MATH-500", "\\boxed{3}", "4", 0.0),
    ("HuggingFaceH4/MATH-500", "#### 3", "3", 0.0),
    ("arithmetic", "9", "9", 1.0),
])
def test_default_compute_score_dispatch(source, response, truth, expected):
    assert default_compute_score(source, response, truth, extra_info={"index": 0}) == expected


def test_unknown_data_source_says_how_to_add_one(monkeypatch):
    with pytest.raises(NotImplementedError) as e:
        default_compute_score("my/dataset", "x", "y")
    assert "data_source='my/dataset'" in str(e.value) and "custom_reward_function.path" in str(e.value)
    monkeypatch.setattr(scoring, "_SCORERS", dict(scoring._SCORERS))
    register_data_source("my/dataset", lambda s, gt: float(s == gt))
    assert default_compute_score("my/dataset", "y", "y") == 1.0
    with pytest.raises(ValueError, match="already has a scorer"):
        register_data_source("my/dataset", lambda s, gt: 0.0)
