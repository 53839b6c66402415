"""The full-run watch (race.fullrun.watch): the pilots' instability rule on a run's held-out evaluations —
by hand, over logged scores (verl / OpenRLHF), and inside a real TRL GRPOTrainer run on CPU that
must catch an injected collapse (a diverging learning rate) and leave a stable run alone."""
from __future__ import annotations

import pytest

from race.fullrun.watch import Watch, WatchError, check_scores


def test_due_steps_are_the_pilots_log_spaced_fractions():
    w = Watch(total_steps=128)
    assert w.steps == [2, 4, 7, 12, 22, 40, 71, 128]      # ceil(f · 128) for f = 1/64 … 1
    assert w.due(0) and not w.due(5)
    w.record(0, [0.5] * 10)
    assert not w.due(1) and w.due(2) and w.due(3)         # a step past a due one still evaluates
    w.record(3, [0.5] * 10)
    assert not w.due(3) and w.due(4)


def test_a_fall_is_found_by_the_pilots_rule_and_a_flat_run_is_not():
    rising = [(0, [0] * 50 + [1] * 50), (10, [0] * 40 + [1] * 60), (20, [0] * 30 + [1] * 70)]
    assert check_scores(rising) is None
    fell = rising + [(30, [0] * 90 + [1] * 10)]          # 0.70 → 0.10: below the base, 0.6 drop
    hit = check_scores(fell)
    assert hit is not None and hit["step"] == 30 and hit["best"] == pytest.approx(0.7)
    assert hit["value"] == pytest.approx(0.1) and hit["base"] == pytest.approx(0.5)
    w = Watch(total_steps=30)
    for s, sc in fell:
        w.record(s, sc)
    assert w.best_step == 20 and "fell to 0.100 at step 30 from 0.700" in w.line()


def test_bad_scores_and_orders_are_one_line_errors():
    w = Watch(total_steps=10)
    with pytest.raises(WatchError, match="first evaluation is at step 3: expected the base policy's"):
        w.record(3, [1.0])
    w.record(0, [1.0, 0.0])
    with pytest.raises(WatchError, match="score 1 is 'nan': expected a finite number"):
        w.record(2, [1.0, float("nan")])
    with pytest.raises(WatchError, match="1 scores, the base had 2"):
        w.record(2, [1.0])
    with pytest.raises(WatchError, match="step 0 is not after"):
        w.record(0, [1.0, 1.0])
    with pytest.raises(WatchError, match="total_steps 0 must be"):
        Watch(total_steps=0)
    with pytest.raises(WatchError, match="no validation scores"):
        check_scores([])


def _trl_run(lr: float, out, steps: int = 24):
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from race.flops.catalog import resolve_model_path
    from race.tasks import TASKS
    from race.fullrun.trl import _checkpointing_key
    from race.fullrun.watch import trl_callback

    torch.manual_seed(0)
    path = resolve_model_path("race/tiny-arith")
    tok = AutoTokenizer.from_pretrained(path)
    task = TASKS["arithmetic-easy"]
    train = task.load(split="train", n=64, seed=0)
    held = task.load(split="eval", n=100, seed=0)

    def exact(completions, answer, **_):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    watch = trl_callback([p.prompt for p in held], exact, columns={"answer": [p.answer for p in held]},
                         samples=2, max_new_tokens=6, log=lambda _: None)
    args = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none",
                      save_strategy="no", logging_steps=100, seed=0, disable_tqdm=True, max_steps=steps,
                      per_device_train_batch_size=16, num_generations=4, max_completion_length=6,
                      learning_rate=lr, lr_scheduler_type="constant", temperature=1.0, beta=0.0,
                      **{_checkpointing_key(): False})   # TRL's default True goes by a name transformers 5.25 deprecates
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    data = Dataset.from_dict({"prompt": [p.prompt for p in train], "answer": [p.answer for p in train]})
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=exact, args=args, train_dataset=data,
                          peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
                          callbacks=[watch])
    trainer.train()
    return trainer, watch


def test_the_trl_watch_catches_an_injected_collapse_and_leaves_a_stable_run_alone(tmp_path):
    """η = 1e-3 (the tiny policy's LoRA rate): no fall, the run goes to its end (held-out accuracy
    0.31 → 0.285 … 0.335 → 0.315 over 8 evaluations, measured). η = 0.01 diverges: 0.31, 0.29, 0.25,
    then 0.115 at step 3; the watch sees the fall below the base, stops the run there and puts back
    the adapter of its best checkpoint (the base)."""
    stable, w = _trl_run(1e-3, tmp_path / "stable")
    assert w.watch.fall is None and stable.state.global_step == 24
    assert [c.step for c in w.watch.history][0] == 0 and w.watch.history[-1].step == 24
    broken, w = _trl_run(0.01, tmp_path / "broken")
    assert w.watch.fall is not None, [sum(c.evals["reward"]) / 100 for c in w.watch.history]
    assert broken.state.global_step < 24                    # stopped at the fall
    f = w.watch.fall
    assert f["value"] < f["base"] - 0.05 and w.best is not None


def test_check_means_uses_the_unpaired_se_by_hand():
    """OpenRLHF logs means only: 0.3 → 0.6 → 0.2 on 100 prompts falls (drop 0.4 ≥ 3.5 × √((0.24 +
    0.16) / 100) = 0.221); on 10 prompts the SE is 0.2 and 0.4 < 0.7 does not."""
    import math

    from race.fullrun.watch import WatchError, check_means

    fall = check_means([(0, 0.3), (10, 0.6), (20, 0.2)], prompts=100)
    assert fall["step"] == 20 and fall["best"] == 0.6 and fall["value"] == 0.2 and fall["base"] == 0.3
    assert fall["drop_se"] == pytest.approx(math.sqrt(0.004))
    assert check_means([(0, 0.3), (10, 0.6), (20, 0.2)], prompts=10) is None
    assert check_means([(0, 0.3), (10, 0.6), (20, 0.5)], prompts=10_000) is None     # kept over half the gain
    for bad, msg in (([(0, 0.3), (5, 1.5)], "outside \\[0, 1\\]"), ([(3, 0.3)], "base policy's at step 0"),
                     ([(0, 0.3), (5, "x")], "expected a finite number")):
        with pytest.raises(WatchError, match=msg):
            check_means(bad, prompts=100)
    with pytest.raises(WatchError, match="prompts 1 must be"):
        check_means([(0, 0.3)], prompts=1)


def test_verl_history_reads_validation_dumps_per_prompt(tmp_path):
    """verl's trainer.validation_data_dir: STEP.jsonl, one line per sample; samples of one input
    are averaged, in the base file's prompt order, and check_scores takes the result."""
    import json

    from race.fullrun.watch import WatchError, check_scores, verl_history

    def dump(step, scores):               # 40 prompts × 2 samples
        rows = [{"input": f"q{i}", "output": "…", "score": s} for i, pair in enumerate(scores) for s in pair]
        (tmp_path / f"{step}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    dump(0, [(1.0, 0.0)] * 20 + [(0.0, 0.0)] * 20)           # 0.25
    dump(10, [(1.0, 1.0)] * 30 + [(0.0, 0.0)] * 10)          # 0.75
    dump(20, [(0.0, 0.0)] * 40)                              # 0.0: a collapse
    hist = verl_history(str(tmp_path))
    assert [s for s, _ in hist] == [0, 10, 20] and hist[0][1][:2] == (0.5, 0.5) and hist[1][1][35] == 0.0
    fall = check_scores(hist)
    assert fall["step"] == 20 and fall["best"] == 0.75 and fall["value"] == 0.0
    (tmp_path / "30.jsonl").write_text(json.dumps({"input": "q0", "score": 1.0}) + "\n")
    with pytest.raises(WatchError, match="30.jsonl: 39 of the base's validation prompts are missing"):
        verl_history(str(tmp_path))
    (tmp_path / "30.jsonl").write_text("not json\n")
    with pytest.raises(WatchError, match="30.jsonl line 1: expected a JSON object"):
        verl_history(str(tmp_path))
