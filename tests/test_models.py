"""race.flops.catalog: shipped configs, lookup rules, error messages, published sizes."""
from __future__ import annotations

import json

import pytest

from race.flops.formulas import param_count
from race.flops.catalog import known_models, load_arch, load_hf_config, load_reward_model

SHIPPED = ["Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct",
           "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-Math-PRM-7B", "meta-llama/Llama-3.1-8B"]


def test_known_models_lists_the_shipped_configs():
    assert set(SHIPPED) <= set(known_models())
    assert known_models() == sorted(known_models())


def test_lookup_is_case_insensitive():
    assert load_hf_config("qwen/QWEN2.5-1.5b-instruct") == load_hf_config(
        "Qwen/Qwen2.5-1.5B-Instruct")
    assert load_arch("META-LLAMA/llama-3.1-8b").name == "meta-llama/Llama-3.1-8B"


def test_folder_and_json_file(tmp_path):
    cfg = {"model_type": "qwen2", "hidden_size": 128, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
           "vocab_size": 15, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = load_arch(str(tmp_path))
    assert arch.name == tmp_path.name and param_count(arch) == 740_864  # REFERENCES' model
    assert load_hf_config(str(tmp_path / "config.json")) == cfg


def test_unknown_name_and_empty_folder(tmp_path):
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5': expected one of "
                                         r".*Qwen/Qwen2.5-1.5B-Instruct.* or a folder with "
                                         r"a config.json"):
        load_arch("gpt-5")
    with pytest.raises(ValueError, match="has no config.json"):
        load_arch(str(tmp_path))


@pytest.mark.parametrize("hf_id, billions", [
    ("Qwen/Qwen2.5-0.5B-Instruct", 0.49),   # published: 0.49B
    ("Qwen/Qwen2.5-1.5B-Instruct", 1.54),   # 1.54B
    ("Qwen/Qwen2.5-3B-Instruct", 3.09),     # 3.09B
    ("Qwen/Qwen2.5-7B-Instruct", 7.61),     # 7.61B
    ("meta-llama/Llama-3.1-8B", 8.03),      # 8.03B
])
def test_published_parameter_counts(hf_id, billions):
    assert param_count(load_arch(hf_id)) / 1e9 == pytest.approx(billions, abs=0.006)


def test_exact_counts():
    assert param_count(load_arch("Qwen/Qwen2.5-1.5B-Instruct")) == 1_543_714_304
    assert param_count(load_arch("meta-llama/Llama-3.1-8B")) == 8_030_261_248


def test_prm_reward_spec():
    prm = load_reward_model("Qwen/Qwen2.5-Math-PRM-7B")
    assert (prm.num_labels, prm.head_hidden_size) == (2, 3584)
    assert prm.arch.num_kv_heads == 4 and not prm.arch.tie_word_embeddings
    assert load_reward_model("Qwen/Qwen2.5-1.5B-Instruct").num_labels == 1
