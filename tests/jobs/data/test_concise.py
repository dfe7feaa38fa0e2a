"""builtin:concise, the built-in preference set: pairs made from the base model's own answers
(chosen: the opening sentence(s), rejected: the whole answer), named and validated like
builtin:identity. The slow test that trains it is tests/jobs/train/test_concise_demo.py."""
import json

import pytest

from jobs.checks.access import DataAccess
from jobs.data import dataset as data
from jobs.data.builtin import concise, general
from jobs.io import paths
from jobs.spec import BUILTIN_CONCISE, BUILTIN_DATASET, JobSpec, SpecError

ANSWER = ("The capital of Italy is Rome. It is famous for the Colosseum, the Vatican and its food, "
          "and millions of people visit it every year.")


def test_the_chosen_side_is_the_opening_sentence_and_the_rejected_the_whole_answer():
    pair = concise.preference_pair("What is the capital of Italy?", ANSWER)
    assert pair["prompt"] == [{"role": "user", "content": "What is the capital of Italy?"}]
    assert pair["chosen"] == [{"role": "assistant", "content": "The capital of Italy is Rome."}]
    assert pair["rejected"] == [{"role": "assistant", "content": ANSWER}]


@pytest.mark.parametrize("answer, opening", [
    ("Sure! Boil the water first. Then add the rice and wait twelve minutes.", "Sure! Boil the water first."),
    ("Here is how: boil the water. Then add the rice and wait twelve minutes.", "Here is how: boil the water."),
    ("北京是中国的首都。它有很多历史。长城很有名。很多人去那里旅游。", "北京是中国的首都。"),
    ("The number pi is about 3.14159. It is the ratio of a circle's circumference to its diameter.",
     "The number pi is about 3.14159."),
])
def test_the_opening_is_whole_sentences_long_enough_to_answer(answer, opening):
    assert concise.concise_answer(answer) == opening


def test_answers_that_are_already_short_make_no_pair():
    assert concise.preference_pair("Capital of France?", "Paris is the capital of France.") is None
    rows = concise.concise_rows([{"prompt": "a", "answer": "Short."}, {"prompt": "b", "answer": ANSWER}])
    assert [row["prompt"][0]["content"] for row in rows] == ["b", "b"]


def test_each_answer_also_prefers_the_opening_over_stopping_before_the_point():
    """Without this pair DPO learned to end every turn at once (empty answers on the built-in model)."""
    rows = concise.concise_rows([{"prompt": "What is the capital of Italy?", "answer": ANSWER}])
    too_long, too_short = rows
    assert too_long["rejected"][0]["content"] == ANSWER
    assert too_short["chosen"][0]["content"] == "The capital of Italy is Rome."
    assert too_short["rejected"][0]["content"] == "The capital"
    assert concise.cut_short("北京是中国的首都。") == "北京是"


def test_the_held_out_prompts_are_not_trained_on():
    assert not set(concise.HELDOUT_PROMPTS) & set(general.prompts())
    assert "What is the capital of France?" in concise.HELDOUT_PROMPTS


def test_the_spec_names_the_method_that_does_not_fit_a_builtin_set():
    with pytest.raises(SpecError) as exc:
        JobSpec(dataset=BUILTIN_CONCISE).validate()  # method sft by default
    assert exc.value.key == "method" and "preference pairs" in str(exc.value)
    with pytest.raises(SpecError) as exc:
        JobSpec.from_dict({"dataset": "builtin:nope"})
    assert exc.value.key == "dataset" and BUILTIN_CONCISE in str(exc.value)


def test_the_studio_may_read_the_builtin_preference_set(tmp_path):
    access = DataAccess.for_studio(tmp_path, allow_dirs=[])
    assert access.dataset(BUILTIN_CONCISE) == BUILTIN_CONCISE
    assert access.dataset(BUILTIN_DATASET) == BUILTIN_DATASET


def test_the_rows_come_from_the_cached_answers_of_the_model(tmp_path, tiny_model):
    spec = JobSpec(model=str(tiny_model), dataset=BUILTIN_DATASET)
    spec.dataset = BUILTIN_CONCISE  # as a preference method would have it (validated elsewhere)
    with pytest.raises(data.DataError, match="generated when the first job"):
        data.load_rows(spec, tmp_path)  # a preview never generates
    cache = general.cache_file(paths.model_cache_dir(paths.data_dir(tmp_path)), str(tiny_model))
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"answers": [{"prompt": "What is the capital of Italy?", "answer": ANSWER}]}))
    rows = data.load_rows(spec, tmp_path)
    assert rows.name == BUILTIN_CONCISE and len(rows) == 2
    assert rows[0]["chosen"][0]["content"] == "The capital of Italy is Rome."
