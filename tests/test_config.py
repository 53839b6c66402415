import pytest

from race.config.configfile import ConfigError, GridConfig, config_from_dict, load_config, parse_flops, parse_grid


def test_parse_flops_accepts_yaml_strings():
    import yaml

    raw = yaml.safe_load("budget: 2e17\nother: 1.5e16\n")
    assert isinstance(raw["budget"], str)  # the PyYAML trap this guards against
    assert parse_flops(raw["budget"]) == 2e17
    assert parse_flops(raw["other"]) == 1.5e16
    assert parse_flops(3) == 3.0


@pytest.mark.parametrize("bad", ["-1e12", 0, "abc", float("nan"), True, None])
def test_parse_flops_rejects(bad):
    with pytest.raises(ConfigError, match="budget"):
        parse_flops(bad)


def test_parse_grid():
    assert parse_grid("0.7,0.3, 0.5") == (0.3, 0.5, 0.7)
    for bad, what in [("0.3,1.2", "1.2"), ([0.0], "0"), ("0.3,x", "'x'"), ("0.3,0.3", "repeats")]:
        with pytest.raises(ConfigError, match=what):
            parse_grid(bad)


def test_config_from_dict_sections_and_lengths(tmp_path):
    cfg = config_from_dict({"model": "Qwen/Qwen2.5-1.5B-Instruct", "budget": "2e16", "seeds": 3,
                            "lengths": {"prompt": 120, "completion": 900},
                            "schedule": {"n_train": 4}, "lora": {"rank": 16, "targets": "all"},
                            "learning_rate": {"ref": "1e-6", "ref_batch": 1024}})
    assert cfg.budget == 2e16 and cfg.prompt_len == 120 and cfg.completion_len == 900
    assert cfg.schedule.n_train == 4 and cfg.lora.rank == 16 and len(cfg.lora.targets) == 7
    assert cfg.learning_rate.ref == 1e-6
    assert cfg.pilots == 5 * 3


@pytest.mark.parametrize("raw,msg", [
    ({"budget": 1e12}, "no 'model'"),
    ({"model": "m"}, "no 'budget'"),
    ({"model": "m", "budget": 1e12, "bogus": 1}, "'bogus' is not a known setting"),
    ({"model": "m", "budget": 1e12, "schedule": {"n_trian": 4}}, "schedule.n_trian"),
    ({"model": "m", "budget": 1e12, "reward": {"kind": "magic"}}, "reward.kind 'magic'"),
    ({"model": "m", "budget": 1e12, "reward": {"kind": "prm"}}, "needs reward.model"),
    ({"model": "m", "budget": 1e12, "seeds": 0}, "seeds 0"),
    ({"model": "m", "budget": 1e12, "grid": [0.5, 1.5]}, "ρ=1.5"),
    ({"model": "m", "budget": 1e12, "schedule": {"n_train": 8, "n_gen": 4}}, r"n_gen \(4\)"),
    ({"model": "m", "budget": 1e12, "backend": "tpu"}, "backend 'tpu'"),
    ({"model": "m", "budget": 1e12, "vllm_sleep": "sometimes"}, "vllm_sleep 'sometimes' is unknown"),
])
def test_config_errors_name_the_value(raw, msg):
    with pytest.raises(ConfigError, match=msg):
        config_from_dict(raw)


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\nbudget: 1\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_config(str(bad))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_config(str(empty))


def test_with_overrides():
    cfg = GridConfig(model="m", budget=1e12)
    c2 = cfg.with_overrides(budget="3e12", grid="0.4,0.6,0.8", seeds=None)
    assert c2.budget == 3e12 and c2.grid == (0.4, 0.6, 0.8) and c2.seeds == cfg.seeds
    with pytest.raises(ConfigError):
        cfg.with_overrides(budget="-5")


def test_vllm_sleep_reads_yaml_on_and_off():
    import yaml

    for text, want in (("on", "on"), ("off", "off"), ("auto", "auto"), ("true", "on")):
        raw = yaml.safe_load(f"model: m\nbudget: 1e12\nvllm_sleep: {text}\n")
        assert config_from_dict(raw).vllm_sleep == want
    assert config_from_dict({"model": "m", "budget": 1e12}).vllm_sleep == "auto"


def test_dot_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    from race.config.configfile import load_config

    sub = tmp_path / "cfg"
    sub.mkdir()
    (sub / "g.yaml").write_text("model: race/tiny-arith\nbudget: 1e10\ntask: ./data/p.jsonl\n")
    (sub / "h.yaml").write_text("model: race/tiny-arith\nbudget: 1e10\ntask: p.jsonl\n")
    monkeypatch.chdir(tmp_path)
    assert load_config(str(sub / "g.yaml")).task == str(sub / "data" / "p.jsonl")
    assert load_config(str(sub / "h.yaml")).task == "p.jsonl"        # a bare name: as given (cwd, or HF)


@pytest.mark.parametrize("section,kw,msg", [
    ("grpo", {"beta": "x"}, "grpo.beta 'x' is not valid: expected a number"),
    ("grpo", {"top_p": 5.0}, "grpo.top_p 5.0 is not valid: expected a number ≤ 1"),
    ("grpo", {"temperature": float("nan")}, "grpo.temperature nan is not valid: expected a finite number"),
    ("lora", {"targets": 5}, "lora.targets 5 is not valid: expected a list"),
    ("reward", {"trust_remote_code": "false"}, "reward.trust_remote_code 'false' is not valid: expected true or false"),
    ("eval", {"judge_trust_remote_code": "no"}, "eval.judge_trust_remote_code 'no' is not valid"),
    ("learning_rate", {"ref": float("inf")}, "learning_rate.ref inf is not valid: expected a finite number"),
    ("schedule", {"prefix_shared": "no"}, "schedule.prefix_shared 'no' is not valid: expected true or false"),
])
def test_a_config_built_in_python_is_checked_as_a_config_file_is(section, kw, msg):
    """GridConfig(...) with its sections built directly: the schema's types, finiteness and strict booleans hold
    there too (a string 'false' never opts into remote code)."""
    from race.config import configfile

    cls = {"grpo": configfile.GRPOSettings, "lora": configfile.LoRASettings, "reward": configfile.RewardSettings,
           "eval": configfile.EvalSettings, "learning_rate": configfile.LearningRate,
           "schedule": configfile.ScheduleKnobs}[section]
    with pytest.raises(ConfigError) as e:
        GridConfig(model="race/tiny-arith", budget=5e12, **{section: cls(**kw)})
    assert msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("raw,msg", [
    ({"schedule": {"prompts_per_step": 10**9}}, "schedule.prompts_per_step 1000000000 is more than 16,384"),
    ({"schedule": {"max_mu": 10**9}}, "schedule.max_mu 1000000000 is more than 64"),
    ({"schedule": {"max_n_gen": 10**9}}, "schedule.max_n_gen 1000000000 is more than 1,024"),
    ({"schedule": {"mu": 10**400}}, "schedule.mu 1000"),
    ({"reward": {"kind": "custom", "function": "m:f", "timeout": 1e300}}, "reward.timeout 1e+300 is more than 86,400"),
    ({"grpo": {"max_completion_len": 10**400}}, "grpo.max_completion_len 1000"),
    ({"eval": {"samples": 10**9}}, "eval.samples 1000000000 is more than 1,024"),
    ({"grid": [10**400]}, "grid value 1000"),
])
def test_sizes_past_their_bound_are_refused_before_the_planner_runs(raw, msg):
    """An untrusted config cannot make the planner run for minutes or allocate without bound, nor overflow a
    float: each size has an upper bound, and the error is one line."""
    with pytest.raises(ConfigError) as e:
        config_from_dict({"model": "race/tiny-arith", "budget": 6e11, **raw})
    assert msg in str(e.value) and "\n" not in str(e.value)
