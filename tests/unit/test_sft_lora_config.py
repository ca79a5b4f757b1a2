"""``sft.lora``: validation naming the key, the run identity, and the refusal of adapted heads/embeddings."""
from __future__ import annotations

import pytest

from common.config import ConfigError, compose
from common.paths import sft_run


def test_lora_is_off_by_default_and_leaves_existing_run_identities_unchanged():
    cfg = compose(["sft/method=eksft"])
    assert cfg.sft.lora.enabled is False
    assert "lora" not in sft_run(cfg).config["sft"]


def test_lora_settings_enter_the_run_identity():
    plain = sft_run(compose(["sft/method=eksft"]))
    lora = sft_run(compose(["sft/method=eksft", "sft.lora.enabled=true"]))
    rank8 = sft_run(compose(["sft/method=eksft", "sft.lora.enabled=true", "sft.lora.rank=8"]))
    assert lora.config["sft"]["lora"]["enabled"] is True
    assert len({plain.directory, lora.directory, rank8.directory}) == 3


@pytest.mark.parametrize("target", ["lm_head", "embed_tokens", "model.embed_tokens"])
def test_adapting_the_head_or_the_embeddings_is_refused_in_one_line_naming_the_key(target):
    with pytest.raises(ConfigError, match=rf"^sft.lora.target_modules: '{target}' is refused: .*leave lm_head and "
                                          "embed_tokens out$"):
        compose(["sft.lora.enabled=true", f"sft.lora.target_modules=[q_proj,{target}]"])


@pytest.mark.parametrize("override, key", [("sft.lora.rank=0", "sft.lora.rank"),
                                           ("sft.lora.alpha=0", "sft.lora.alpha"),
                                           ("sft.lora.dropout=1.0", "sft.lora.dropout"),
                                           ("sft.lora.target_modules=[]", "sft.lora.target_modules")])
def test_bad_lora_settings_name_their_key(override, key):
    with pytest.raises(ConfigError, match=rf"^{key}"):
        compose(["sft.lora.enabled=true", override])
