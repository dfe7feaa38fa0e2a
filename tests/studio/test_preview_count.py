"""The identity preview says how many rows the job trains on, not only the three it shows."""
import html
import json

import pytest

from jobs.data.builtin import identity
from jobs.data.builtin.general import cache_file, prompts
from jobs.io import paths
from jobs.spec import BUILTIN_DATASET, JobSpec
from studio import form
from studio.data_preview import preview_data
from tests.tiny import make_tiny_model


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("studio-data")
    make_tiny_model(root / "models" / "tiny")
    return root


def identity_preview(data_dir, lang="en"):
    names = form.form_names()
    values = form.spec_to_values(JobSpec(), names)
    values[names.index("model")] = str(data_dir / "models" / "tiny")
    values[names.index("dataset")] = BUILTIN_DATASET
    return preview_data(data_dir, names, values, lang)


def test_identity_preview_counts_every_row_before_and_after_the_general_answers(data_dir):
    before = identity_preview(data_dir)
    assert before.count('class="ft-preview-row"') == 3
    rows = len(identity.IDENTITY_SYSTEMS) * len(identity.QUESTIONS_EN + identity.QUESTIONS_ZH)   # 336
    assert f"{rows} identity rows" in before and f"answers to {len(prompts())} general prompts" in before
    assert "generated when the first job" in before
    answers = [{"prompt": f"q{i}", "answer": f"a{i}"} for i in range(17)]
    cache = cache_file(paths.model_cache_dir(paths.data_dir(data_dir)), str(data_dir / "models" / "tiny"))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"answers": answers}), encoding="utf-8")
    after = html.unescape(identity_preview(data_dir))
    assert f"{rows + 17} rows in all: {rows} identity rows and the base model's answers to 17 general prompts" in after
    assert f"共 {rows + 17} 行" in identity_preview(data_dir, "zh-CN")
