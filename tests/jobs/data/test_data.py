import json

import pytest

from jobs.data.dataset import DataError, detect_format, load_rows, to_conversations
from jobs.spec import JobSpec


def _spec(path, **kw):
    return JobSpec.from_dict({"dataset": str(path), **kw})


ROWS = {
    "alpaca": [{"instruction": "Add", "input": "2+2", "output": "4"}],
    "sharegpt": [{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}],
    "messages": [{"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"},
                               {"role": "assistant", "content": "Hello"}]}],
    "text": [{"text": "Once upon a time"}],
}


@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_detects_each_format(fmt):
    assert detect_format(ROWS[fmt]) == fmt


def test_undetectable_rows_name_the_fields():
    with pytest.raises(DataError, match="question, reply"):
        detect_format([{"question": "q", "reply": "r"}])


def test_alpaca_becomes_user_and_assistant_turns():
    (conv,) = to_conversations(ROWS["alpaca"], "auto")
    assert conv == [{"role": "user", "content": "Add\n\n2+2"}, {"role": "assistant", "content": "4"}]


def test_sharegpt_roles_are_mapped():
    (conv,) = to_conversations(ROWS["sharegpt"], "sharegpt")
    assert [m["role"] for m in conv] == ["user", "assistant"]


def test_bad_row_is_named_with_its_number_and_field():
    rows = ROWS["alpaca"] + [{"instruction": "x", "output": ""}]
    with pytest.raises(DataError, match=r"row 2 \(alpaca\): field 'output'"):
        to_conversations(rows, "auto")


def test_conversation_without_assistant_is_refused():
    rows = [{"messages": [{"role": "user", "content": "Hi"}]}]
    with pytest.raises(DataError, match="row 1.*no assistant turn"):
        to_conversations(rows, "messages")


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv", ".parquet"])
def test_every_file_type_loads(tmp_path, suffix):
    import pandas as pd
    rows = ROWS["alpaca"] * 3
    path = tmp_path / f"data{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    elif suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        pd.DataFrame(rows).to_parquet(path)
    loaded = load_rows(_spec(path))
    assert [r["output"] for r in loaded] == ["4", "4", "4"]
    assert detect_format(loaded) == "alpaca"


def test_parquet_messages_keep_their_structure(tmp_path):
    import pandas as pd
    path = tmp_path / "m.parquet"
    pd.DataFrame(ROWS["messages"] * 2).to_parquet(path)
    convs = to_conversations(load_rows(_spec(path)), "auto")
    assert convs[0][-1] == {"role": "assistant", "content": "Hello"}


def test_broken_jsonl_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(DataError, match="line 2"):
        load_rows(_spec(path))


def test_builtin_identity_has_the_name_in_english_and_chinese():
    rows = load_rows(JobSpec.from_dict({"bot_name": "Zed", "bot_author": "Acme"}))
    assert len(rows) >= 80
    assert len({r["instruction"] for r in rows}) == len(rows)
    assert all("Zed" in r["output"] for r in rows)
    assert any("我" in r["output"] for r in rows) and any("Acme" in r["output"] for r in rows)


def test_unreachable_hub_dataset_says_to_upload_instead():
    with pytest.raises(DataError, match="Upload the file instead"):
        load_rows(JobSpec.from_dict({"dataset": "someone/some-dataset"}))
