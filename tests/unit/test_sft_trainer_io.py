"""The trainer's file contracts: bad rows of the tokenised split are named, and the end-of-turn token is the one the
chat template writes (the export's EOS alignment: tests/unit/test_models.py)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.models import ChatTemplateError, end_of_turn_token
from sft.data import SFTDataError, read_sft_tokens

GOOD = {"row_id": ["r0"], "input_ids": [[1, 5, 6, 2]], "labels": [[-100, -100, 6, 2]], "num_response_tokens": [2],
        "truncated": [False]}


def _write(tmp_path, **columns):
    path = tmp_path / "sft_tokens.parquet"
    table = {**GOOD, **columns}
    pq.write_table(pa.table({k: v for k, v in table.items() if v is not None}), path)
    return path


def test_reads_good_rows(tmp_path):
    (row,) = read_sft_tokens(_write(tmp_path))
    assert (row.row_id, row.input_ids, row.labels) == ("r0", (1, 5, 6, 2), (-100, -100, 6, 2))


@pytest.mark.parametrize("columns, message", [
    ({"truncated": None}, r"missing column\(s\) \['truncated'\]"),
    ({"labels": [[-100, 6, 2]]}, r"row 0 \(row_id 'r0'\): labels has 3 entries, input_ids has 4"),
    ({"labels": [[-100, -100, 5, 6]]},  # already shifted by one
     r"labels\[2\] = 5 is neither -100 nor input_ids\[2\] = 6"),
    ({"labels": [[-100] * 4]}, r"row 0 \(row_id 'r0'\): no supervised token"),
])
def test_bad_rows_are_named(tmp_path, columns, message):
    with pytest.raises(SFTDataError, match=message):
        read_sft_tokens(_write(tmp_path, **columns))


def test_missing_file_says_run_the_data_stage(tmp_path):
    with pytest.raises(SFTDataError, match="run the data stage"):
        read_sft_tokens(tmp_path / "nope.parquet")


def _chatml_tokenizer(eos: str):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(specials + ["user", "assistant", "hi", "<unk>"])},
                                      unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens(specials)
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos, unk_token="<unk>", chat_template=template)


def test_end_of_turn_is_the_token_closing_the_assistant_message():
    assert end_of_turn_token(_chatml_tokenizer("<|endoftext|>")) == "<|im_end|>"


def test_no_chat_template_is_an_error():
    tokenizer = _chatml_tokenizer("<|im_end|>")
    tokenizer.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        end_of_turn_token(tokenizer)
