"""race.flops.architectures: every supported model type counted exactly, LoRA targets as peft builds
them, transformers' config defaults, and refusal (or a warned opt-in) for everything else.

The accuracy test builds each model type from a small config at random weights (eager
attention, eager experts), applies peft LoRA with the module names RACE gives it, and compares
forward / full fwd+bwd / LoRA fwd+bwd FLOPs with FlopCounterMode and parameter counts with the
model and peft. A line per model type is printed in the test session's summary.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from race.flops import formulas as F
from race.flops.architectures import (FAMILIES, SUPPORTED_MODEL_TYPES, UnsupportedArchitecture, adaptable_modules,
                                check_adapted_modules, peft_target_modules, read_arch, resolve_lora_targets,
                                sliding_window_warning)

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "race" / "assets" / "tiny-arith"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("flop_accuracy", ROOT / "bench" / "flop_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield module
    torch.set_num_threads(threads)


def test_every_supported_type_is_measured():
    spec = importlib.util.spec_from_file_location("fa", ROOT / "bench" / "flop_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    measured = {model_type for model_type, _ in module.ARCHS.values()}
    assert set(SUPPORTED_MODEL_TYPES) <= measured
    assert len(SUPPORTED_MODEL_TYPES) >= 12


BENCH_ARCHS = ["qwen2", "llama", "mistral", "qwen3", "gemma", "gemma2", "gemma3_text", "granite", "olmo2", "phi3",
               "starcoder2", "phi", "gpt_neox", "mixtral", "qwen2_moe", "qwen2_moe_dense0", "qwen3_moe"]


@pytest.mark.parametrize("arch_name", BENCH_ARCHS)
def test_model_type_counts_exactly(bench, arch_name, record_property):
    """Forward, full fwd+bwd, LoRA fwd+bwd ≤ 1 % (in practice exact); parameters and peft's
    trainable parameters equal."""
    errors = {}
    for quantity in bench.CORE_QUANTITIES:
        counted, predicted = bench.measure(arch_name, quantity)
        errors[quantity] = (predicted - counted) / counted
    model, spec = bench.build_model(arch_name)
    params = sum(p.numel() for p in model.parameters())
    peft_model, lora = bench.add_lora(model, spec)
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    # printed by tests/conftest.py's terminal summary (a report property: it reaches pytest-xdist's controller)
    row = (f"{arch_name:<17} " + "  ".join(f"{q} {e:+.1e}" for q, e in errors.items())
           + f"  params {F.param_count(spec)}/{params}  lora {F.lora_param_count(spec, lora)}/{trainable}")
    record_property("flop_accuracy_row", (BENCH_ARCHS.index(arch_name), row))
    assert all(abs(e) <= 0.01 for e in errors.values()), errors
    assert F.param_count(spec) == params
    assert F.lora_param_count(spec, lora) == trainable


def test_the_ungated_mlp_is_not_counted_as_gated(bench):
    """The bug this table fixes: Starcoder2 read as Llama was ≈ 26 % too high."""
    counted, predicted = bench.measure("starcoder2", "forward")
    model, spec = bench.build_model("starcoder2")
    as_gated = F.ArchSpec(**{**spec.to_dict(), "gated_mlp": True})
    wrong = 2 * F.forward_flops(as_gated, bench.PROMPT_LEN + bench.COMPLETION_LEN, causal=False)
    assert predicted == counted and wrong > 1.1 * counted


def test_defaults_are_transformers_defaults():
    """A saved config omits keys equal to the class default: the table must know them."""
    from transformers import AutoConfig

    for model_type, family in FAMILIES.items():
        reference = AutoConfig.for_model(model_type).to_dict()
        for key, value in family.defaults.items():
            if key == "num_key_value_heads" and value is None:     # None: one KV head per query head
                assert reference.get(key) in (None, reference["num_attention_heads"]), model_type
                continue
            if key in ("num_experts", "num_local_experts"):      # the name moved between versions
                assert value in (reference.get("num_experts"), reference.get("num_local_experts")), model_type
                continue
            assert reference.get(key) == value, (model_type, key, reference.get(key), value)


def test_a_config_that_omits_defaults_reads_as_transformers_builds_it():
    from transformers import AutoConfig

    # Gemma's head_dim (256) and Mistral's KV heads (8) are defaults, not hidden // heads
    gemma = read_arch({"model_type": "gemma", "hidden_size": 64, "num_attention_heads": 4,
                       "num_key_value_heads": 4, "intermediate_size": 96, "num_hidden_layers": 2,
                       "vocab_size": 101}).arch
    assert gemma.head_dim == AutoConfig.for_model("gemma").head_dim == 256 and gemma.tie_word_embeddings
    mistral = read_arch({"model_type": "mistral", "hidden_size": 256, "num_attention_heads": 16,
                         "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 101}).arch
    assert mistral.num_kv_heads == 8
    star = read_arch({"model_type": "starcoder2", "hidden_size": 64, "num_attention_heads": 4,
                      "intermediate_size": 96, "num_hidden_layers": 2, "vocab_size": 101}).arch
    assert star.tie_word_embeddings and not star.gated_mlp and star.qkv_bias and star.mlp_bias
    neox = read_arch({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "intermediate_size": 96, "num_hidden_layers": 2,
                      "vocab_size": 101}).arch
    assert neox.num_kv_heads == 4 and neox.fused_qkv and neox.parallel_residual


def test_an_unknown_model_type_is_refused_in_one_line_or_warned_when_allowed():
    cfg = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
           "num_hidden_layers": 2, "vocab_size": 101}
    with pytest.raises(UnsupportedArchitecture, match="'falcon' is not in RACE's architecture table") as err:
        read_arch(cfg)
    assert "\n" not in str(err.value) and "--allow-approximate" in str(err.value)
    reading = read_arch(cfg, allow_approximate=True)
    assert reading.family is None and len(reading.warnings) == 1 and "falcon" in reading.warnings[0]
    assert read_arch({**cfg, "model_type": "llama"}).warnings == ()


def test_lora_targets_are_roles_or_module_names_and_must_match():
    phi3 = read_arch({"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                      "intermediate_size": 96, "vocab_size": 101}).arch
    assert peft_target_modules(phi3, F.LORA_TARGETS) == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    assert resolve_lora_targets(phi3, ["qkv_proj"]) == ("q_proj", "k_proj", "v_proj")
    with pytest.raises(ValueError, match="part of the fused module 'qkv_proj'"):
        resolve_lora_targets(phi3, ["q_proj", "v_proj"])
    star = read_arch({"model_type": "starcoder2", "hidden_size": 64, "num_attention_heads": 4,
                      "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 101}).arch
    assert resolve_lora_targets(star, ["c_fc"]) == resolve_lora_targets(star, ["up_proj"]) == ("up_proj",)
    assert peft_target_modules(star, ["up_proj", "down_proj"]) == ["c_fc", "c_proj"]
    with pytest.raises(ValueError, match="'gate_proj' matches no module of starcoder2"):
        resolve_lora_targets(star, ["gate_proj"])
    with pytest.raises(ValueError, match="'c_attn' is not a module of starcoder2"):
        resolve_lora_targets(star, ["c_attn"])
    mixtral = read_arch({"model_type": "mixtral", "hidden_size": 64, "num_attention_heads": 4,
                         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 101,
                         "num_local_experts": 4, "num_experts_per_tok": 2}).arch
    assert set(adaptable_modules(mixtral)) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    with pytest.raises(ValueError, match="routed experts"):
        resolve_lora_targets(mixtral, ["down_proj"])


def test_sliding_window_is_warned_only_when_shorter_than_the_sequences():
    base = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "intermediate_size": 96, "vocab_size": 101}
    mistral = read_arch({**base, "sliding_window": 4096}).arch
    assert sliding_window_warning(mistral, 2048) is None
    assert "2 of 2 layers" in sliding_window_warning(mistral, 8192)
    qwen = read_arch({**base, "model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}).arch
    assert sliding_window_warning(qwen, 10 ** 6) is None
    from race.flops.catalog import load_arch
    for name in ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"):   # window set, not used
        assert sliding_window_warning(load_arch(name), 10 ** 6) is None


def test_check_adapted_modules_refuses_a_mismatch():
    arch = read_arch({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                      "intermediate_size": 96, "vocab_size": 101}).arch
    lora = F.LoRASpec(rank=4, target_modules=("q_proj", "v_proj"))
    good = [f"model.layers.{i}.self_attn.{m}" for i in range(2) for m in ("q_proj", "v_proj")]
    check_adapted_modules(arch, lora, good)
    with pytest.raises(UnsupportedArchitecture, match="peft adapted 3 modules"):
        check_adapted_modules(arch, lora, good[:3])


def test_peft_module_paths_picks_full_names_by_their_last_part():
    from race.flops.architectures import peft_module_paths
    names = ["", "model", "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.experts",
             "model.layers.0.mlp.shared_expert.down_proj", "model.layers.0.mlp.shared_expert.down_proj.x"]
    assert peft_module_paths(["q_proj", "down_proj"], names) == [
        "model.layers.0.self_attn.q_proj", "model.layers.0.mlp.shared_expert.down_proj"]
    assert peft_module_paths(["gate_proj"], names) == []


def test_the_pilot_loader_keeps_peft_off_a_moes_routed_experts(bench):
    """peft ≥ 0.22 maps a bare ``down_proj`` on a Qwen2-MoE onto the fused experts' parameters too;
    the paths the pilot loader gives it adapt exactly the linear modules RACE counts."""
    from peft import LoraConfig, get_peft_model

    from race.engine.loading import _check_peft_adapters, _peft_targets
    model, arch = bench.build_model("qwen2_moe")
    lora = F.LoRASpec(rank=4, target_modules=resolve_lora_targets(arch, F.LORA_TARGETS))
    paths = _peft_targets(arch, lora, model)
    assert all("experts." not in p for p in paths) and any("shared_expert.down_proj" in p for p in paths)
    policy = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=paths))
    _check_peft_adapters(arch, lora, policy)
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert trainable == F.lora_param_count(arch, lora)
    assert not [n for n, p in policy.named_parameters() if p.requires_grad and ".experts." in n]
    from race.flops.architectures import lora_note            # what plans and reports say of it
    assert lora_note(arch, lora.target_modules) == (
        "LoRA on qwen2_moe: the routed experts are not adapted (RACE adapts linear modules; the experts are 3-D "
        "parameters); the MLP roles reach the shared expert's MLP")
    assert lora_note(arch, ("q_proj", "v_proj")) is None
    from race.engine.backends.vllm import policy_adapter      # the adapter vLLM gets names modules as before
    assert policy_adapter(policy)[3] == tuple(sorted(peft_target_modules(arch, lora.target_modules)))


@pytest.mark.parametrize("arch_name", [a for a in BENCH_ARCHS if not a.startswith("qwen2_moe")])
def test_a_recipes_target_modules_adapt_in_peft_what_race_counts(bench, tmp_path, arch_name):
    """The trainer's peft, given a recipe's ``target_modules``, adapts the modules RACE's split counts: the
    family's names (``qkv_proj`` on a Phi-3; role names reached only ``o_proj`` and ``down_proj`` there).
    Qwen2-MoE is left out: under peft ≥ 0.22 those names reach its routed experts, and the recipe says so
    (tests/test_recipe.py)."""
    from peft import LoraConfig, get_peft_model

    from race.config import presets
    from race.fullrun.recipes import recipe
    bench.hf_config(arch_name).save_pretrained(tmp_path)
    rec = recipe({**dict(presets.DEFAULT), "model": str(tmp_path)}, trainer="trl", rho=0.6, full_run_budget=6e12)
    model, arch = bench.build_model(arch_name)
    policy = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=rec.model["lora_target_modules"]))
    lora = F.LoRASpec(rank=4, target_modules=resolve_lora_targets(arch, F.LORA_TARGETS))
    assert sum(p.numel() for p in policy.parameters() if p.requires_grad) == F.lora_param_count(arch, lora)


def _tiny_model_folder(tmp_path: Path, model_type: str, **extra) -> str:
    """A random model of ``model_type`` with the shipped tiny policy's tokenizer, saved as a user's
    model is: ``save_pretrained`` (which drops values equal to the class defaults)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    vocab = json.loads((TINY / "config.json").read_text())["vocab_size"]
    cfg = AutoConfig.for_model(model_type, vocab_size=vocab, hidden_size=32, intermediate_size=48,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
    torch.manual_seed(0)
    folder = tmp_path / model_type
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY / f, folder / f)
    return str(folder)


@pytest.mark.parametrize("model_type", ["phi3", "starcoder2"])
def test_a_pilot_policy_gets_the_adapters_the_count_assumes(tmp_path, model_type):
    """load_policy gives peft the family's module names and checks what it built."""
    from race.config.configfile import config_from_dict
    from race.flops.grid import lora_spec, policy_arch
    from race.engine.loading import load_policy

    folder = _tiny_model_folder(tmp_path, model_type)
    cfg = config_from_dict({"model": folder, "budget": 1e9, "lora": {"rank": 4}})
    _, policy, _ = load_policy(cfg)
    arch = policy_arch(cfg)
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert trainable == F.lora_param_count(arch, lora_spec(cfg, arch)) > 0


def _race(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "race", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _falcon_config(tmp_path: Path) -> Path:
    """A folder holding a config of a model type outside the table (Falcon)."""
    folder = tmp_path / "falconish"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
        "num_hidden_layers": 2, "vocab_size": 101}))
    return folder


def test_cli_refuses_an_unknown_type_with_exit_2_and_allows_it_with_a_warning(tmp_path):
    folder = _falcon_config(tmp_path)
    for cmd in (["flops", "--model", str(folder)],
                ["init", "--model", str(folder), "--task", "arithmetic-easy", "--full-run", "1e13"]):
        out = _race(*cmd, cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert "falcon" in lines[-1] and "Traceback" not in out.stderr
    config = tmp_path / "grid.yaml"
    config.write_text(f"model: {folder}\nbudget: 1e11\n")
    out = _race("plan", str(config), cwd=tmp_path)
    assert out.returncode == 2 and "falcon" in out.stderr
    out = _race("pilot", str(config), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert out.returncode == 2 and "falcon" in out.stderr and not (tmp_path / "run").exists()
    config.write_text(f"model: {folder}\nbudget: 1e12\n")
    out = _race("plan", str(config), "--allow-approximate", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert any("falcon" in w for w in plan["flop_warnings"])
    out = _race("plan", str(config), "--allow-approximate", cwd=tmp_path)
    assert "warning: model type 'falcon'" in out.stdout
    out = _race("flops", "--model", str(folder), "--allow-approximate", "--json", cwd=tmp_path)
    assert out.returncode == 0 and "warning: model type 'falcon'" in out.stderr
    assert json.loads(out.stdout)["warnings"]


def test_an_approximate_policy_runs_with_the_opt_in_and_every_report_carries_the_warning(tmp_path):
    """OLMo (1) is not in the table: refused without the opt-in, nothing written; with it the
    pilots run and text / Markdown / LaTeX / JSON reports and results.json carry the warning."""
    folder = _tiny_model_folder(tmp_path, "olmo")
    config = tmp_path / "grid.yaml"
    config.write_text(f"model: {folder}\nbudget: 1.5e9\ngrid: [0.5, 0.65, 0.8]\nseeds: 1\n"
                      "grpo: {max_completion_len: 4}\n"
                      "eval: {prompts: 8, samples: 2}\n")
    out = _race("pilot", str(config), "--out", str(tmp_path / "refused"), "--quiet", cwd=tmp_path)
    assert out.returncode == 2 and "'olmo' is not in RACE's architecture table" in out.stderr
    assert not (tmp_path / "refused").exists()
    run = tmp_path / "run"
    out = _race("pilot", str(config), "--out", str(run), "--quiet", "--allow-approximate", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    warning = "model type 'olmo' is not in RACE's architecture table"
    assert warning in out.stdout
    results = json.loads((run / "results.json").read_text())
    assert any(warning in w for w in results["flop_warnings"])
    assert any(warning in w for w in results["plan"]["flop_warnings"])
    assert any(warning in w for w in results["diagnosis"]["meta"]["flop_warnings"])
    for fmt in ("md", "latex", "json"):
        report = _race("report", str(run), "--format", fmt, cwd=tmp_path)
        assert report.returncode == 0 and warning in report.stdout, fmt


def test_the_python_api_raises_for_an_unknown_type_before_any_pilot(tmp_path):
    import race

    folder = _falcon_config(tmp_path)
    with pytest.raises(UnsupportedArchitecture, match="'falcon'"):
        race.diagnose(model=str(folder), budget=1e12, out_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run" / "results.json").exists()
    # a judge model outside the table is refused the same way
    from race.config.configfile import ConfigError, config_from_dict
    from race.flops.grid import flop_warnings

    cfg = config_from_dict({"model": "race/tiny-arith", "budget": 1e12, "eval": {"judge_model": str(folder)}})
    with pytest.raises(UnsupportedArchitecture, match="judge model type 'falcon'"):
        flop_warnings(cfg)
    with pytest.raises(ConfigError, match="lora.targets entry 'c_fc'"):
        flop_warnings(config_from_dict({"model": "race/tiny-arith", "budget": 1e12, "lora": {"targets": ["c_fc"]}}))
