"""QA rewards on hand-worked cases."""

from dart_jax.data.text import normalize_answer
from dart_jax.rewards.qa import em, em_format_reward, em_reward, extract_answer, retrieval_correct, valid_sequence

GOOD = ("<think>need author</think>\n<search> war and peace author </search>\n\n<information>Doc 1(Title: "
        "\"War and Peace\") War and Peace is a novel by Leo Tolstoy.</information>\n\n<think>Tolstoy."
        "</think>\n<answer> Leo Tolstoy </answer>")


def test_normalisation_and_em():
    assert normalize_answer("  The  Beatles!! ") == "beatles"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("theater") == "theater"  # articles only as whole words
    assert em("the Leo Tolstoy.", ["Leo Tolstoy"]) == 1.0
    assert em("Tolstoy", ["Leo Tolstoy"]) == 0.0
    assert em(None, ["x"]) == 0.0


def test_answer_from_response_only_and_last():
    assert extract_answer("<answer> a </answer> then <answer> Paris </answer>") == "Paris"
    assert extract_answer("no answer here") is None
    assert em_reward(GOOD, ["leo tolstoy", "Tolstoy"]) == 1.0
    # the prompt's example "<answer> Beijing </answer>" is not in the response, so it never counts
    assert em_reward("<think>x</think> I give up", ["Beijing"]) == 0.0


def test_retrieval_accuracy():
    assert retrieval_correct(GOOD, ["Leo Tolstoy"])
    assert not retrieval_correct(GOOD, ["Dostoevsky"])
    assert not retrieval_correct("<answer>Leo Tolstoy</answer>", ["Leo Tolstoy"])


def test_format_reward_cases():
    assert valid_sequence(GOOD)
    assert not valid_sequence("<answer> x </answer>")                      # no think first
    assert not valid_sequence("<think>a</think> junk <answer>x</answer>")  # text between blocks
    assert not valid_sequence(GOOD + " trailing")
    assert em_format_reward(GOOD, ["Leo Tolstoy"]) == 1.0
    assert em_format_reward(GOOD, ["Dostoevsky"]) == 0.2
    assert abs(em_format_reward(GOOD.replace("Leo Tolstoy </answer>", "Pushkin </answer>"), ["Leo Tolstoy"])
               - 0.3) < 1e-9
    assert em_format_reward("<answer> Leo Tolstoy </answer>", ["Leo Tolstoy"]) == 0.8
    assert em_format_reward("<answer> no </answer>", ["Leo Tolstoy"]) == 0.1
    assert em_format_reward("nothing", ["Leo Tolstoy"]) == 0.0
