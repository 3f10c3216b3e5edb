"""Every contract a docstring states is graded: tests of the tests for chapters 8 and 10.

An exercise's docstring is the contract a student codes against. Each sentence of it that
says "must", "returns" or "in this order" is a rule, and a rule must be held by a hidden
test, with a known mistake that breaks it (so that the test is seen to fail when the rule
is broken). ``CONTRACTS`` maps each such sentence, by a phrase it contains, to
``(hidden test id, known mistake name)`` pairs. The tests below fail on a sentence no phrase
of the table matches, on a phrase no sentence contains any more, on a test or mistake that
does not exist, and on a mistake that passes the hidden test the table pairs it with.

Only chapters 8 and 10 are held to this so far (issue 61); the other chapters' docstrings
have sentences of the same form that no table maps yet. A sentence that is advice, not a
rule, is worded without these words ("do not form the (n, n) matrix, so that...").
"""

import ast
import re

import jupytext
import pytest

from autograder import paths
from autograder.grading.judging.spec import load_chapter_tests
from tests.answers import verdicts

RULE = re.compile(r"\bmust\b|\breturns\b|\bin this order\b", re.IGNORECASE)

# chapter -> exercise -> phrase of the sentence -> the (hidden test, known mistake) pairs
# that hold it
CONTRACTS: dict[str, dict[str, dict[str, list[tuple[str, str]]]]] = {
    "08_efficient_attention": {
        "chunked_attention": {
            "Returns: out: (..., n_q, d_v).": [("ea_chunked", "last chunk dropped")],
        },
        "flash_attention": {
            "equal to softmax(q k^T / sqrt(d)) v (with the causal mask)": [
                ("ea_flash", "accumulator not rescaled"),
                ("ea_flash_causal", "causal ignored"),
            ],
        },
        "flash_attention_with_bias": {
            "Returns: out: (..., h, n_q, d_v).": [
                ("ea_flash_bias", "tile offset ignored")
            ],
        },
        "sliding_window_mask": {
            "Returns: (n, n) bool tensor, True = may attend.": [
                ("ea_window_mask", "not bool"),
                ("ea_window_mask", "window off by one"),
            ],
        },
        "local_attention": {
            "Returns: out: (..., n, d_v).": [("ea_local", "padding attended")],
        },
        "linear_attention": {
            "Returns: out: (..., n_q, d_v).": [("ea_linear", "not normalised")],
        },
        "performer_features": {
            "Returns: features: (..., n, m), all positive.": [
                ("ea_performer_features", "no norm term")
            ],
        },
        "performer_attention": {
            "Returns: out: (..., n_q, d_v).": [("ea_performer", "not normalised")],
        },
        "linformer_attention": {
            "Returns: out: (..., n_q, d_v).": [("ea_linformer", "E and F swapped")],
        },
        "grouped_query_attention": {
            "Returns: out: (B, h, n_q, d_v).": [("ea_gqa", "key/value heads averaged")],
        },
        "kv_cache_step": {
            "the new keys and values appended after the old ones": [
                ("ea_kv_cache", "prepended"),
                ("ea_kv_cache", "cache not updated"),
            ],
        },
        "FlashAttentionFunction": {
            "Returns out (..., n_q, d_v) = softmax(q k^T / sqrt(d)) v.": [
                ("ea_flash_grad", "running sum not rescaled"),
                ("ea_flash_grad", "gradients of q and k unscaled"),
            ],
        },
        "flash_attention_autograd": {
            "Returns FlashAttentionFunction.apply(q, k, v, causal, block_size)": [
                ("ea_flash_autograd", "D from one tile")
            ],
        },
    },
    "10_language_model": {
        "CausalSelfAttention": {
            "the rotated keys and the values of all t + n tokens": [
                ("lm_attention_cache", "cache re-rotated"),
                ("lm_attention", "rotary on the values"),
            ],
        },
        "TransformerLM": {
            "Returns logits (B, n, vocab_size) when caches is None": [
                ("lm_model", "no final norm")
            ],
        },
        "cross_entropy": {
            "Returns a scalar tensor.": [("lm_cross_entropy", "one loss per position")],
            "logits of size 1e4 must give a finite loss": [
                ("lm_cross_entropy", "naive softmax")
            ],
        },
        "sample": {
            "returns an integer tensor (...)": [
                ("lm_sample", "draws kept as (rows, 1)")
            ],
            "Otherwise, in this order": [
                ("lm_sample", "temperature ignored"),
                ("lm_sample_top_p", "top-p before the temperature"),
                ("lm_sample_top_p", "top-p before top-k"),
                ("lm_sample_top_p", "top-p drops the crossing token"),
                ("lm_sample_top_p", "top-p keeps the token at exactly p"),
            ],
        },
        "generate": {
            "each returns (logits, caches)": [
                ("lm_generate", "sequence fed twice"),
                ("lm_generate", "positions restart at 0"),
            ],
            "tokens: (B, n + max_new_tokens), the prompt followed by the new tokens": [
                ("lm_generate", "logits of the first position"),
                ("lm_generate", "logits divided by the temperature"),
                ("lm_generate", "filtered logits"),
            ],
        },
        "MultiHeadLatentAttention": {
            "kv_rank + rope_dim numbers per token (no head axis, no full keys or values)": [
                ("lm_mla_cache", "cache holds full keys and values")
            ],
        },
    },
}


def _squash(text: str) -> str:
    return " ".join(text.split())


def _rule_sentences(chapter: str) -> dict[str, list[str]]:
    """Exercise name -> the sentences of its docstring that state a rule."""
    notebook = jupytext.read(paths.chapter_source(chapter))
    found: dict[str, list[str]] = {}
    for cell in notebook.cells:
        if cell.cell_type != "code" or "exercise" not in cell.metadata.get("tags", []):
            continue
        for node in ast.parse(cell.source).body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef):
                continue
            doc = ast.get_docstring(node) or ""
            sentences = re.split(r"(?<=[.;])\s+(?=[A-Z])", _squash(doc))
            found[node.name] = [s for s in sentences if RULE.search(s)]
    return found


@pytest.mark.parametrize("chapter", sorted(CONTRACTS))
def test_every_rule_of_a_docstring_is_in_the_table(chapter):
    table = CONTRACTS[chapter]
    unmapped, stale = [], []
    sentences = _rule_sentences(chapter)
    for exercise, rules in sentences.items():
        for sentence in rules:
            if not any(phrase in sentence for phrase in table.get(exercise, {})):
                unmapped.append(f"{exercise}: {sentence}")
    for exercise, phrases in table.items():
        for phrase in phrases:
            if not any(phrase in s for s in sentences.get(exercise, [])):
                stale.append(f"{exercise}: {phrase}")
    assert not unmapped, f"rules no hidden test is known to hold: {unmapped}"
    assert not stale, f"table phrases no docstring rule contains any more: {stale}"


def _pairs(chapter):
    return [
        pytest.param(chapter, exercise, test_id, mistake, id=f"{test_id}-{mistake}")
        for exercise, phrases in CONTRACTS[chapter].items()
        for pairs in phrases.values()
        for test_id, mistake in pairs
    ]


@pytest.mark.parametrize(
    "chapter, exercise, test_id, mistake_name",
    [p for chapter in sorted(CONTRACTS) for p in _pairs(chapter)],
)
def test_the_known_mistake_fails_the_hidden_test_that_holds_the_rule(
    chapter, exercise, test_id, mistake_name
):
    tests = load_chapter_tests(chapter)
    test = tests.test(test_id)  # raises when the id does not exist
    assert test.exercise == exercise, (test_id, test.exercise)
    mistakes = [m for m in tests.mistakes_for(exercise) if m.name == mistake_name]
    assert mistakes, f"no known mistake {mistake_name!r} of {exercise}"
    namespace = {**vars(tests.reference()), exercise: mistakes[0].impl}
    result = verdicts(tests, namespace, 0, [test])[test_id]
    assert not result.passed, f"{mistake_name!r} passes {test_id}"
