"""The TRL recipe's FLOP statement against FlopCounterMode, phase by phase, on the script race recipe --emit writes.

    python bench/trl_split.py [--policy arith|reasoner] [--mu 1 2] [--steps 2] [--triton-head]

The recipe of a tiny config is emitted (race recipe --for trl --emit), its train_trl.py runs ``--steps``
steps on CPU under FlopCounterMode, and each generation batch's phases are recorded as TRL runs them:
``generate`` (rows, prompt width, decode steps), the no-grad old-log-prob forward, the training forwards
(rows, width, logits_to_keep) and the backwards. Their FLOPs are printed beside RACE's statement for TRL
(race.fullrun.recipes.trainer_step_cost) at each batch's padded lengths. ``arith``: race/tiny-arith on
arithmetic-easy, 2 prompts × 4 generations, ≤ 6 new tokens, each μ of ``--mu``; ``reasoner``:
race/tiny-reasoner on its word problems (pilots/tiny-reasoner.yaml), 2 prompts × 4 generations, μ = 2,
worked solutions whose lengths vary within a batch. docs/recipes.md shows the output.

Stock FlopCounterMode misses three ops this run uses on CPU: SDPA's CPU kernel
(``_scaled_dot_product_flash_attention_for_cpu``) and its backward, and the in-place ``addmm_`` in which
TRL's fused log-prob backward accumulates the LM-head input gradient. ``flop_counter()`` counts them too,
with torch's own SDPA (backward: 5 products, QKᵀ recomputed) and mm formulas. The statement is then
compared in the counter's conventions: attention over T² score entries (``causal=False``), and the LM head
where TRL ran it (``head_positions``): every position but the last (T − 1) on CPU; with ``--triton-head``
(TRL's Triton-device branch, as on CUDA) only the real completion tokens. The last column is the statement
as the recipe prints it (causal attention, the head on C positions) at the same padded lengths.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PHASES = ("generate", "old_logprob", "forward", "backward")


def _missed():
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def sdpa(query, key, value, *args, out_shape=None, **kwargs):
        return fc.sdpa_flop_count(query, key, value)

    def sdpa_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out, query, key, value)

    def addmm_(self, mat1, mat2, *args, out_shape=None, **kwargs):
        return fc.mm_flop(mat1, mat2)

    return {aten._scaled_dot_product_flash_attention_for_cpu: sdpa,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: sdpa_backward,
            aten.addmm_: addmm_}


def flop_counter():
    """FlopCounterMode that also counts the ops stock FlopCounterMode misses here (module docstring)."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=_missed())


def reasoner_config(mu: int = 2):
    import yaml

    from race.config.configfile import config_from_dict

    raw = yaml.safe_load(open(ROOT / "pilots" / "tiny-reasoner.yaml"))
    raw.update(budget=1e12, schedule={**raw["schedule"], "prompts_per_step": 2, "n_train": 4, "max_n_gen": 4,
                                      "mu": mu}, eval={"prompts": 20, "samples": 1, "checkpoints": 0})
    return config_from_dict(raw)


def arith_config(mu: int = 2):
    from race.config.configfile import config_from_dict

    return config_from_dict({"model": "race/tiny-arith", "budget": 1e12, "lengths": {"prompt": 6, "completion": 6},
                             "schedule": {"prompts_per_step": 2, "n_train": 4, "max_n_gen": 4, "mu": mu},
                             "grpo": {"max_completion_len": 6}, "learning_rate": {"ref": 1e-3, "ref_batch": 64}})


def on_policy_rho(cfg, n: int = 4) -> float:
    from race.flops.grid import CostModel
    from race.flops.specs import policy_arch, reward_spec

    mu = cfg.schedule.mu
    return CostModel(cfg, policy_arch(cfg), reward_spec(cfg), cfg.prompt_len, cfg.completion_len) \
        .cost(n, mu, n).per_prompt.rho


def run_emitted(cfg, rho: float, out_dir, *, steps: float = 2.5, triton_head: bool = False, **overrides) -> dict:
    """Emit the TRL recipe of ``cfg`` at ``rho`` for about ``steps`` steps into ``out_dir``, run its
    train_trl.py under ``flop_counter()`` and record each generation batch's phases. ``triton_head``: TRL's
    fused LM head takes its Triton-device branch (only the real completion tokens scored, as on CUDA; the
    tiles still fold in torch), else its CPU one (every position but the last). Returns {"recipe",
    "trainer", "batches": [{"P", "C", "rows", "prompt_lengths", "lengths", "prefill", "decode_steps",
    "head_positions" (per row, mean), "phases": {phase: {"flops", "missed", "shapes"}}}], "search",
    "learning", "other" (learning outside the phases), "missed": {"search", "learning"}} (``missed``: what
    stock FlopCounterMode leaves out)."""
    import torch
    import trl.trainer.utils as trl_utils

    from race.fullrun import recipes as R

    torch.manual_seed(0)
    out_dir = Path(out_dir)
    use_triton = trl_utils._use_triton
    one = R.recipe(cfg, trainer="trl", rho=rho, full_run_budget=1e15).flops_per_step.total
    rec = R.recipe(cfg, trainer="trl", rho=rho, full_run_budget=steps * one, emit_dir=str(out_dir / "run"))
    spec = importlib.util.spec_from_file_location("train_trl", out_dir / "run" / "train_trl.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    trainer = script.build(output_dir=str(out_dir / "out"), disable_tqdm=True, seed=0, **overrides)
    counter, missed_ops = flop_counter(), set(_missed())
    batches: list[dict] = []
    gen_batch: dict = {}             # the lengths of the latest generate call
    widths: list[tuple] = []         # (rows, width) of each backbone forward inside generate
    state = {"phase": None}

    def snapshot() -> tuple[float, float]:
        ops = counter.get_flop_counts().get("Global", {})
        return float(counter.get_total_flops()), float(sum(v for k, v in ops.items() if k in missed_ops))

    def phase(name: str, fn, shapes=None):
        def run(*a, **k):
            if state["phase"]:                  # nested (generate inside generate): the outer one counts
                return fn(*a, **k)
            state["phase"] = name
            f0, m0 = snapshot()
            try:
                return fn(*a, **k)
            finally:
                f1, m1 = snapshot()
                state["phase"] = None
                if name == "generate":
                    batches.append({**gen_batch, "phases": {p: {"flops": 0.0, "missed": 0.0, "shapes": []}
                                                            for p in PHASES}})
                p = batches[-1]["phases"][name]
                p["flops"] += f1 - f0
                p["missed"] += m1 - m0
                if shapes:
                    p["shapes"].append(shapes(*a, **k))
        return run

    generate = trainer._generate_single_turn

    def generated(prompt_ids, *a, **k):
        widths.clear()
        got = generate(prompt_ids, *a, **k)
        lengths = [len(c) for c in got[0]]
        P, C = max(map(len, prompt_ids)), max(lengths)
        gen_batch.update(P=P, C=C, rows=len(lengths), prompt_lengths=sorted(map(len, prompt_ids)),
                         lengths=sorted(lengths), head_positions=sum(lengths) / len(lengths) if triton_head
                         else P + C - 1,
                         prefill=widths[0] if widths else None, decode_steps=len(widths) - 1)
        return got

    def width(module, args, kwargs):
        if state["phase"] == "generate":
            x = kwargs.get("input_ids")
            widths.append(tuple((x if x is not None else kwargs["inputs_embeds"]).shape[:2]))

    base = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    hook = base.get_decoder().register_forward_pre_hook(width, with_kwargs=True)

    def logps_shapes(model, input_ids, attention_mask, logits_to_keep, batch_size=None, **k):
        return {"rows": int(input_ids.shape[0]), "width": int(input_ids.shape[1]), "keep": int(logits_to_keep),
                "micro": int(batch_size or input_ids.shape[0]), "tokens": int(attention_mask.sum()),
                "completion_tokens": int(attention_mask[:, -logits_to_keep:].sum())}

    logps = trainer._get_per_token_logps_and_entropies
    with_grad = phase("forward", logps, logps_shapes)
    without = phase("old_logprob", logps, logps_shapes)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (with_grad if torch.is_grad_enabled()
                                                                  else without)(*a, **k)
    trainer._generate_single_turn = phase("generate", generated)
    trainer.accelerator.backward = phase("backward", trainer.accelerator.backward)
    if triton_head:
        trl_utils._use_triton = lambda device: True
    try:
        with counter:
            trainer.train()
    finally:
        hook.remove()
        trl_utils._use_triton = use_triton
    s = rec.schedule
    assert len(batches) == s.steps and trainer.state.global_step == s.steps * s.mu, (len(batches), s)
    total = float(counter.get_total_flops())
    search = sum(b["phases"]["generate"]["flops"] for b in batches)
    missed_search = sum(b["phases"]["generate"]["missed"] for b in batches)
    missed_all = snapshot()[1]
    other = total - sum(p["flops"] for b in batches for p in b["phases"].values())
    return {"recipe": rec, "trainer": trainer, "batches": batches, "search": search, "learning": total - search,
            "other": other, "missed": {"search": missed_search, "learning": missed_all - missed_search}}


def stated(cfg, batches, *, as_counted: bool = True):
    """RACE's statement for TRL at each batch's padded lengths (P, C): in the counter's conventions and
    with the LM head where TRL ran it (``as_counted``: T² attention; ``head_positions``: T − 1 per row on
    CPU, the real completion tokens with ``triton_head``), or as the recipe states it (causal attention,
    the head on C positions per row)."""
    from race.fullrun import recipes as R
    from race.core.records import FlopBreakdown
    from race.flops.specs import lora_spec, policy_arch

    arch = policy_arch(cfg)
    s = cfg.schedule
    want = FlopBreakdown()
    for b in batches:
        want = want + R.trainer_step_cost(
            R.RUNS["trl"], arch, lora_spec(cfg, arch), None, prompt_len=b["P"], completion_len=b["C"],
            n=b["rows"] // s.prompts_per_step, mu=s.mu, beta=cfg.grpo.beta, grad_checkpointing=False,
            causal=not as_counted, head_positions=b["head_positions"] if as_counted else None,
        ).scaled(s.prompts_per_step)
    return want


def stated_phases(cfg, b, *, as_counted: bool = True) -> dict:
    """The statement's pieces for one batch, phase by phase (race.flops.formulas; their sum is ``stated``)."""
    from race.flops import formulas as F
    from race.flops.specs import lora_spec, policy_arch

    arch = policy_arch(cfg)
    lora = lora_spec(cfg, arch)
    P, C, B, mu = b["P"], b["C"], b["rows"], cfg.schedule.mu
    T, causal = P + C, not as_counted
    scored = b["head_positions"] if as_counted else min(C, T)
    head = 2.0 * arch.vocab_size * arch.hidden_size
    body_b, head_b, attn_b = F.backward_costs(arch, lora, train_base=False, embed_rg=False)
    fwd = F.forward_flops(arch, T, lora=lora, causal=causal) - (T - scored) * head
    return {"generate": B * F.search_flops(arch, prompt_len=P, completion_len=C, n=1, prefix_shared=False,
                                           lora=lora, causal=causal),
            "old_logprob": B * fwd if mu > 1 else 0.0, "forward": mu * B * fwd,
            "backward": mu * B * (T * body_b + scored * (head_b + head)      # + the head's recompute
                                  + F._score_entries(T, causal) * attn_b        # + SDPA's QKᵀ recompute:
                                  + F.attention_flops(arch, T, causal=causal) / 2)}


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.2f} %" if b else "—"


def _shapes(name: str, b: dict) -> str:
    if name == "generate":
        return (f"{b['rows']} rows; prompt width {b['P']} (prompts {sorted(set(b['prompt_lengths']))}); "
                f"{b['decode_steps']} decode steps (completions {b['lengths'][0]}–{b['lengths'][-1]})")
    sh = b["phases"][name]["shapes"]
    if not sh:
        return "—"
    x = sh[0]
    real = sum(s["completion_tokens"] for s in sh) / len(sh)
    return (f"{len(sh)} × {x['rows']} rows × width {x['width']} in micro-batches of {x['micro']}, "
            f"logits_to_keep {x['keep']} ({real:.0f} of {x['rows'] * x['keep']} completion positions real)")


def print_phases(cfg, m: dict) -> None:
    print("| batch | phase | what TRL ran | measured | stock FlopCounterMode misses | stated as counted | "
          "RACE's conventions |")
    print("|---|---|---|---|---|---|---|")
    for i, b in enumerate(m["batches"], 1):
        counted, own = stated_phases(cfg, b), stated_phases(cfg, b, as_counted=False)
        for name in PHASES:
            p = b["phases"][name]
            if name == "backward":
                shape = f"{len(b['phases']['forward']['shapes'])} backwards of the training forwards"
            else:
                shape = _shapes(name, b)
            print(f"| {i} | {name} | {shape} | {p['flops']:,.0f} | {p['missed']:,.0f} | "
                  f"{counted[name]:,.0f} ({_pct(p['flops'], counted[name])}) | {own[name]:,.0f} |")


def print_totals(cfg, m: dict, label: str, header: bool) -> None:
    counted, own = stated(cfg, m["batches"]), stated(cfg, m["batches"], as_counted=False)
    if header:
        print("| run | completion lengths per batch | search measured / stated | learning measured / stated | "
              "stock FlopCounterMode: search / learning | RACE's conventions: search / learning |")
        print("|---|---|---|---|---|---|")
    ms, ml = m["search"], m["learning"]
    ss, sl = ms - m["missed"]["search"], ml - m["missed"]["learning"]
    print(f"| {label} | {[b['lengths'] for b in m['batches']]} | {ms:,.0f} / {counted.search:,.0f} "
          f"({_pct(ms, counted.search)}) | {ml:,.0f} / {counted.learning:,.0f} ({_pct(ml, counted.learning)}) | "
          f"{ss:,.0f} ({_pct(ss, counted.search)}) / {sl:,.0f} ({_pct(sl, counted.learning)}) | "
          f"{own.search:,.0f} / {own.learning:,.0f} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", choices=("arith", "reasoner"), default="arith")
    ap.add_argument("--mu", type=int, nargs="+", default=None, help="μ values (arith: 1 2; reasoner: 2)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--triton-head", action="store_true",
                    help="TRL's fused LM head as on CUDA: only the real completion tokens scored")
    args = ap.parse_args()
    runs = []
    for mu in args.mu or ([1, 2] if args.policy == "arith" else [2]):
        cfg = (arith_config if args.policy == "arith" else reasoner_config)(mu)
        with tempfile.TemporaryDirectory(prefix="race-trl-split-") as out:
            runs.append((mu, cfg, run_emitted(cfg, on_policy_rho(cfg), out, steps=args.steps + 0.5,
                                                  triton_head=args.triton_head)))
    for i, (mu, cfg, m) in enumerate(runs):
        print_totals(cfg, m, f"{args.policy}, μ = {mu}", header=i == 0)
    for mu, cfg, m in runs:
        print(f"\n{args.policy}, μ = {mu}, phase by phase:\n")
        print_phases(cfg, m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
