"""Lockstep pilots (race.engine.seed_axis, race.engine.backends.lockstep): the seeds of a grid point as one batch.

A solo pilot on the lean path is a group of one seed. Equivalence of a seed in a group with the
same seed alone, measured bit for bit: per-seed logits, losses, gradients and updated adapters,
sampled tokens and their log-probs (with finished rows leaving the batch), a seed's tokens
whichever seeds share its batch, and whole pilots (FLOPs, curve, held-out scores).
Then the runner: a group runs in one process, a group that dies fails only its unfinished pilots,
and a stored grid resumes without re-running finished ones."""
import os

import pytest

from race.run.api import build_config
from race.flops.grid import plan_grid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SEEDS = [0, 1, 2]


@pytest.fixture(scope="module")
def models():
    """One-seed lean policies of seeds 0–2 (solo pilots) and one lockstep policy of the same seeds,
    with the same non-zero B matrices (a fresh adapter's B = 0 would hide any error in the A/B path).
    The one-seed policies draw their adapter as a solo pilot does: ``seed_everything(seed)`` and
    torch's global stream."""
    import torch

    from race.engine.backends.hf import load_causal_lm
    from race.engine.backends.lockstep import LockstepLM
    from race.flops.catalog import resolve_model_path
    from race.engine.loading import seed_everything

    torch.set_num_threads(1)
    hf = load_causal_lm(resolve_model_path("race/tiny-arith"))
    hf.requires_grad_(False)
    solo = []
    for s in SEEDS:
        seed_everything(s)
        solo.append(LockstepLM(hf, rank=8, alpha=16, targets=TARGETS, seeds=[s]))
    group = LockstepLM(hf, rank=8, alpha=16, targets=TARGETS, seeds=SEEDS)
    init_equal = all(torch.equal(a, group.adapter_state_dict(s)[k])
                     for lm, s in zip(solo, SEEDS) for k, a in lm.adapter_state_dict().items())
    for k, lm in enumerate(solo):
        gen = torch.Generator().manual_seed(100 + k)
        for name, p in lm.adapters[0].items():
            if name.endswith("_B"):
                v = torch.randn(p.shape, generator=gen) * 0.05
                p.data.copy_(v)
                group.adapters[k][name].data.copy_(v)
    return solo, group, init_equal


def _batches(seed: int = 0):
    """Per-seed GRPO batches of one shape (4 prompts × 3 rollouts) with different lengths."""
    import torch

    from race.engine import grpo

    gen = torch.Generator().manual_seed(seed)

    def ids(lo, hi):
        return [int(x) for x in torch.randint(4, 20, (int(torch.randint(lo, hi, (1,), generator=gen)),), generator=gen)]

    out = []
    for _ in SEEDS:
        prompts, comps = [ids(3, 8) for _ in range(4)], [ids(1, 7) for _ in range(12)]
        out.append(grpo.pack(prompts, comps, [i for i in range(4) for _ in range(3)],
                             torch.randn(12, generator=gen).tolist(), 0))
    return out


def test_each_seed_starts_from_its_solo_pilots_adapter(models):
    assert models[2]


def test_lockstep_logits_equal_the_solo_ones_bit_for_bit(models):
    import torch

    from race.engine import grpo

    solo, group, _ = models
    batches = _batches()
    stacked = grpo.stack_batches(batches, pad_id=0)
    assert stacked.prompt_ids.shape[:2] == (3, 4) and stacked.completion_ids.shape[:2] == (3, 12)
    with torch.no_grad():
        got = group.forward_grouped(stacked.prompt_ids, stacked.prompt_mask, stacked.group,
                                    stacked.completion_ids, stacked.completion_mask)
        for k, (lm, b) in enumerate(zip(solo, batches)):
            one = grpo.stack_batches([b], pad_id=0)
            want = lm.forward_grouped(one.prompt_ids, one.prompt_mask, one.group, one.completion_ids,
                                      one.completion_mask)[0]
            m = b.completion_mask.bool()
            mine = got[k, :, :b.completion_width][m]
            assert torch.allclose(mine, want[m], atol=1e-6)
            assert torch.equal(mine, want[m])            # measured: padding to the widest seed changes no bit


def test_lockstep_losses_and_gradients_equal_the_solo_ones(models):
    """One forward/backward with KL and entropy terms: each seed's loss and adapter gradient
    equal the solo ones to fp32 tolerance."""
    import torch

    from race.engine import grpo

    solo, group, _ = models
    batches = _batches(1)
    kw = dict(clip_eps=0.2, loss_agg="dapo", max_completion_len=6, beta=1e-3, entropy_coef=1e-3)

    def loss_of(lp, ent, ref, b):
        return grpo.policy_loss(lp, lp.detach() * 0.9, b.advantages, b.completion_mask, ref_logp=ref, entropy=ent,
                                **kw).loss

    want = []
    for lm, b in zip(solo, batches):
        lm.zero_grad()
        one = grpo.stack_batches([b], pad_id=0)
        with torch.no_grad(), lm.disable_adapter():
            ref = grpo.completion_logprobs(lm, one)[0][0]
        lp, ent = grpo.completion_logprobs(lm, one, with_entropy=True)
        loss = loss_of(lp[0], ent[0], ref, b)
        loss.backward()
        want.append((float(loss.detach()), {k: p.grad.clone() for k, p in lm.adapters[0].items()}))
    group.zero_grad()
    stacked = grpo.stack_batches(batches, pad_id=0)
    with torch.no_grad(), group.disable_adapter():
        ref = grpo.completion_logprobs(group, stacked)[0]
    lp, ent = grpo.completion_logprobs(group, stacked, with_entropy=True)
    losses = [loss_of(lp[k], ent[k], ref[k], grpo._seed_slice(stacked, k)) for k in range(3)]
    sum(losses).backward()
    for k, (loss, grads) in enumerate(want):
        assert float(losses[k]) == pytest.approx(loss, rel=1e-6)
        for name, g in grads.items():
            assert g.abs().max() > 0 or name.endswith("_A")
            assert torch.allclose(group.adapters[k][name].grad, g, rtol=1e-5, atol=1e-7), name


def test_lockstep_updates_track_the_solo_ones(models):
    """μ = 2 iterations (two AdamW steps, clipping, per-seed state) through ``update_seeds`` move each
    seed's adapter as three one-seed updates do, to fp32 tolerance (AdamW's first steps
    normalise the gradient, so a rounding-level gradient difference can move an element by up to
    the learning rate times its relative size)."""
    import copy

    import torch

    from race.engine import grpo

    solo, group, _ = models
    solo, group = copy.deepcopy(solo), copy.deepcopy(group)
    start = [lm.adapter_state_dict() for lm in solo]
    batches = _batches(1)
    kw = dict(mu=2, temperature=1.0, clip_eps=0.2, loss_agg="dapo", max_completion_len=6, beta=1e-3,
              entropy_coef=1e-3)
    opts = [torch.optim.AdamW(list(lm.adapters[0].parameters()), lr=1e-3, weight_decay=0.0, fused=True) for lm in solo]
    want = [grpo.update_seeds(lm, [o], [b], pad_id=0, **kw)[0] for lm, o, b in zip(solo, opts, batches)]
    gopts = [torch.optim.AdamW(group.parameters_of(s), lr=1e-3, weight_decay=0.0, fused=True) for s in SEEDS]
    got = grpo.update_seeds(group, gopts, batches, pad_id=0, **kw)
    for k, (lm, s, w, g) in enumerate(zip(solo, SEEDS, want, got)):
        assert g.loss == pytest.approx(w.loss, rel=1e-4)
        a, b = lm.adapter_state_dict(), group.adapter_state_dict(s)
        moved = max(float((a[n] - start[k][n]).abs().max()) for n in a)
        assert moved > 1e-3                                           # two steps of lr 1e-3 each
        assert max(float((a[n] - b[n]).abs().max()) for n in a) < 0.05 * moved


def _wide_batches(widths=(4, 6, 5), prompts=8, rollouts=8):
    """Per-seed batches of the default grid's ρ 0.74 shape (8 prompts × 8 rollouts, all kept), seed
    k's longest completion ``widths[k]`` tokens: over 300 token rows per seed, the others padded."""
    import torch

    from race.engine import grpo

    gen = torch.Generator().manual_seed(5)
    out = []
    for width in widths:
        def ids(n):
            return [int(x) for x in torch.randint(4, 20, (n,), generator=gen)]
        lens = [int(x) for x in torch.randint(1, width + 1, (prompts * rollouts,), generator=gen)]
        lens[int(torch.randint(0, len(lens), (1,), generator=gen))] = width
        out.append(grpo.pack([ids(int(torch.randint(4, 8, (1,), generator=gen))) for _ in range(prompts)],
                             [ids(n) for n in lens], [i for i in range(prompts) for _ in range(rollouts)],
                             torch.randn(prompts * rollouts, generator=gen).tolist(), 0))
    return out


@pytest.mark.parametrize("micro_batch", [None, 32])
def test_a_groups_update_is_the_solo_update_bit_for_bit_at_the_default_grids_shape(models, micro_batch):
    """At 8 prompts × 8 rollouts (≥ 300 token rows per seed) with seeds of different widths, μ = 2
    iterations through ``update_seeds`` give each seed of a group the loss, adapter and AdamW state
    of its one-seed update, bit for bit. A CPU GEMM splits a long reduction into blocks that follow
    its length, so the adapter gradient over a seed's rows padded to the widest seed rounded
    otherwise once the padded rows were past one block (MKL: 384; the default grid's ρ 0.74 pilots:
    1e-9 from their second step on, other reward curves after 105–274 steps); it now reduces over
    the seed's own rows only, and its loss over its own completion columns."""
    import copy

    import torch

    from race.engine import grpo

    solo, group, _ = models
    solo, group = copy.deepcopy(solo), copy.deepcopy(group)
    batches = _wide_batches()
    assert all(b.prompt_mask.numel() + b.completion_mask.numel() > 300 for b in batches)
    stacked = grpo.stack_batches(batches, pad_id=0)
    assert stacked.prompt_mask[0].numel() + stacked.completion_mask[0].numel() > 384
    kw = dict(mu=2, temperature=1.0, clip_eps=0.2, loss_agg="dapo", max_completion_len=6, beta=1e-3,
              entropy_coef=1e-3, micro_batch=micro_batch, pad_id=0)

    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, fused=True)

    opts = [adamw(list(lm.adapters[0].parameters())) for lm in solo]
    want = [grpo.update_seeds(lm, [o], [b], **kw)[0] for lm, o, b in zip(solo, opts, batches)]
    gopts = [adamw(group.parameters_of(s)) for s in SEEDS]
    got = grpo.update_seeds(group, gopts, batches, **kw)
    assert got == want                                                   # losses, clip fractions, KL, entropy
    for lm, s, o, go in zip(solo, SEEDS, opts, gopts):
        a, b = lm.adapter_state_dict(), group.adapter_state_dict(s)
        assert all(torch.equal(a[n], b[n]) for n in a)
        for p, q in zip(lm.adapters[0].parameters(), group.parameters_of(s)):
            assert all(torch.equal(o.state[p][k], go.state[q][k]) for k in ("exp_avg", "exp_avg_sq"))


def test_a_seed_that_left_the_batch_is_frozen(models):
    import copy

    import torch

    from race.engine import grpo

    _, group, _ = models
    group = copy.deepcopy(group)
    before = group.adapter_state_dict(1)
    group.set_active([0, 2])
    opts = [torch.optim.AdamW(group.parameters_of(s), lr=1e-2, weight_decay=0.0, fused=True) for s in (0, 2)]
    b = _batches(2)
    grpo.update_seeds(group, opts, [b[0], b[2]], mu=1, temperature=1.0, clip_eps=0.2, loss_agg="grpo",
                      max_completion_len=6, pad_id=0)
    after = group.adapter_state_dict(1)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_lockstep_sampling_equals_solo_sampling_and_ignores_its_company(models):
    """Tokens and log-probs per seed equal the one-seed sampler's with the same generator, while
    finished rows leave the batch (12 new tokens: compaction runs); a seed sampled alone or
    beside the others gives the same tokens."""
    import torch

    from race.engine.backends.lockstep import sample_lockstep

    solo, group, _ = models
    for lm in solo:
        lm.merge()
    group.merge(SEEDS)
    gen = torch.Generator().manual_seed(3)
    prompts = [[[int(x) for x in torch.randint(4, 20, (int(torch.randint(3, 8, (1,), generator=gen)),),
                                               generator=gen)] for _ in range(6)] for _ in SEEDS]
    calls = {"select": 0}
    want, want_lp = [], []
    for k, lm in enumerate(solo):
        lp: list = []
        want.append(sample_lockstep(lm, [prompts[k]], n=4, max_new_tokens=12, eos_id=[2, 5], pad_id=0,
                                    generators=[torch.Generator().manual_seed(7 + k)], logprobs=lp)[0])
        want_lp.append(lp[0])
    real_gather = torch.gather

    def counting_gather(*a, **kw):
        calls["select"] += 1
        return real_gather(*a, **kw)

    torch.gather = counting_gather
    try:
        lp = []
        got = sample_lockstep(group, prompts, n=4, max_new_tokens=12, eos_id=[2, 5], pad_id=0,
                              generators=[torch.Generator().manual_seed(7 + k) for k in range(3)], logprobs=lp)
    finally:
        torch.gather = real_gather
    assert calls["select"] > 0                           # finished rows left the batch at least once
    assert got == want
    flat = [(x, y) for a, b in zip(lp, want_lp) for ga, gb in zip(a, b) for ra, rb in zip(ga, gb) for x, y in zip(ra, rb)]
    assert len(flat) == sum(len(c) for seed in got for grp in seed for c in grp)
    assert max(abs(x - y) for x, y in flat) < 1e-5       # rows padded to the widest seed: rounding only
    assert any(len(c) < 12 for seed in got for grp in seed for c in grp)          # some stopped early
    group.set_active([2])
    alone = sample_lockstep(group, [prompts[2]], n=4, max_new_tokens=12, eos_id=[2, 5], pad_id=0,
                            generators=[torch.Generator().manual_seed(9)])
    group.set_active([0, 1, 2])
    assert alone[0] == want[2]


def _tiny(budget=1.5e10, **over):
    cfg = build_config(None, budget=budget, grid="0.6,0.73,0.84")
    from dataclasses import replace

    return replace(cfg, eval=replace(cfg.eval, prompts=60, samples=2), **over)


def test_a_lockstep_pilot_is_the_solo_pilot_bit_for_bit(torch_one_thread):
    """Two seeds in lockstep against the same two pilots run solo (``run_pilot``: a seed axis of length
    one on the same engine): same steps, FLOPs, reward curve, held-out scores and checkpoints, bit for
    bit (measured on this CPU's kernels); the sync check reads rounding noise in both; the lockstep
    pilots say so in ``extra["engine"]``; the loop yields each seed's progress, then the results."""
    from race.core.records import PilotResult
    from race.engine.pilot import PilotProgress, pilot_events, run_pilot

    cfg = _tiny()
    schedule = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[0]
    solo = [run_pilot(cfg, schedule, seed=s) for s in (0, 1)]
    events = list(pilot_events(cfg, schedule, [0, 1]))
    group = [e for e in events if isinstance(e, PilotResult)]
    assert [r.seed for r in group] == [0, 1] and all(isinstance(e, PilotResult) for e in events[-2:])
    assert [e.steps for e in events if isinstance(e, PilotProgress) and e.seed == 0] == \
        list(range(1, solo[0].extra["steps"] + 1))
    for a, b in zip(solo, group):
        assert a.extra["steps"] == b.extra["steps"] > 5
        assert a.flops == b.flops and a.curve == b.curve and a.evals == b.evals
        assert [c.evals for c in a.checkpoints] == [c.evals for c in b.checkpoints]
        # the sampler's log-probs are computed over rows padded to the widest seed: equal tokens, and
        # a sync gap that is rounding noise in both (measured ~1e-7 … 5e-7, not bit-equal)
        assert len(a.extra["sync"]["gaps"]) == len(b.extra["sync"]["gaps"])
        assert max(b.extra["sync"]["gaps"]) < 1e-5 and max(a.extra["sync"]["gaps"]) < 1e-5
        assert b.extra["engine"] == "lockstep (2 seeds)" and "engine" not in a.extra
        assert all(b.wall_seconds[k] > 0 for k in ("rollout", "reward", "update", "sync", "eval"))   # its share
    assert solo[0].curve != solo[1].curve            # the seeds differ: each has its own streams


def test_a_grouped_seed_keeps_its_solo_state_bit_for_bit_at_the_default_grids_rho_074(torch_one_thread):
    """The default grid's ρ 0.74 point (8 × 8 → 8, μ 1), stepped by one engine of seeds 0 and 1 and
    by one engine per seed: after each of 3 steps every seed's adapter and AdamW state are its solo
    engine's, bit for bit, and some step padded a seed's token rows to over 384 (where its adapter
    gradient rounded otherwise: from step 2 on, before the fix)."""
    import torch

    from race.engine import grpo
    from race.engine.loop import PilotLoop
    from race.engine.seed_axis import SeedAxisEngine
    from race.tasks.taskdata import task_problems

    cfg = build_config(None, budget=1e11)
    schedule = next(s for s in plan_grid(cfg).schedules if s.rho_target == 0.74)
    assert (schedule.prompts_per_step, schedule.n_gen, schedule.n_train, schedule.mu) == (8, 8, 8, 1)

    def engine(seeds):
        e = SeedAxisEngine(cfg, schedule, seeds)
        return e, [PilotLoop(cfg, schedule, s, task_problems(cfg, e.backend.tok, split="train", seed=s)) for s in seeds]

    (group, loops), solos = engine([0, 1]), [engine([s]) for s in (0, 1)]
    widths, update = [], group.trainer.update

    def seen(seeds, optimizers, packs, **kw):
        rows = [p.prompt_mask.numel() + p.completion_mask.numel() for p in packs]     # its own, solo
        stacked = grpo.stack_batches(packs, pad_id=0)
        widths.append((rows, stacked.prompt_mask[0].numel() + stacked.completion_mask[0].numel()))
        return update(seeds, optimizers, packs, **kw)

    group.trainer.update = seen
    try:
        for _ in range(3):
            group.step([0, 1], [loop.next_problems() for loop in loops])
            for k, (solo, (loop,)) in enumerate(solos):
                solo.step([0], [loop.next_problems()])
                mine, theirs = solo.trainer.parameters_of(k), group.trainer.parameters_of(k)
                assert all(torch.equal(p, q) for p, q in zip(mine, theirs))
                states = solo.optimizers[0].state, group.optimizers[k].state
                assert all(torch.equal(states[0][p][n], states[1][q][n]) for p, q in zip(mine, theirs)
                           for n in ("exp_avg", "exp_avg_sq"))
    finally:
        for e in [group] + [e for e, _ in solos]:
            e.close()
    assert any(min(rows) < padded and padded > 384 for rows, padded in widths), widths


def _code_path(run) -> set:
    """Every RACE function (file, line, name) that ``run()`` enters, in this process."""
    import sys

    root = os.path.join(ROOT, "race") + os.sep
    seen: set = set()

    def hook(frame, event, arg):  # noqa: ARG001
        if event == "call" and frame.f_code.co_filename.startswith(root):
            c = frame.f_code
            seen.add((os.path.relpath(c.co_filename, ROOT), c.co_firstlineno, c.co_name))

    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_solo_pilot_and_a_group_of_one_seed_run_the_same_code(torch_one_thread, fast_path):
    """One loop: ``run_pilot(seed)`` and ``pilot_events([seed])`` enter exactly the same RACE functions
    (the loop, the engine, its step), on the lean policy and on peft; only ``run_pilot``'s own
    consumers (``run_pilot``, ``run_pilots``) come on top. A group of two enters the same functions of
    the loop and the engine (its policy batches the seeds wider)."""
    from dataclasses import replace

    from race.engine.pilot import pilot_events, run_pilot

    cfg = _tiny(budget=1e10)
    cfg = replace(cfg, grpo=replace(cfg.grpo, fast_path=fast_path), eval=replace(cfg.eval, prompts=8))
    schedule = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[0]
    list(pilot_events(cfg, schedule, [0]))          # imports and first-call caches, before the traces
    solo = _code_path(lambda: run_pilot(cfg, schedule, seed=0))
    group = _code_path(lambda: list(pilot_events(cfg, schedule, [0])))
    assert {name for _, _, name in solo - group} == {"run_pilot", "run_pilots"}
    assert not group - solo
    assert ("race/engine/pilot.py", "pilot_events") in {(f, n) for f, _, n in group}
    assert ("race/engine/seed_axis.py", "step") in {(f, n) for f, _, n in group}
    if fast_path:           # two seeds: the same loop and engine functions (the policy batches wider)
        two = _code_path(lambda: list(pilot_events(cfg, schedule, [0, 1])))
        loop = ("race/engine/pilot.py", "race/engine/seed_axis.py", "race/engine/loop.py")
        assert {(f, n) for f, _, n in two if f in loop} == {(f, n) for f, _, n in group if f in loop}


def test_group_size_follows_the_engine_and_what_can_run():
    from dataclasses import replace

    from race.core.errors import ConfigError
    from race.engine.lean_engine import group_size_for

    cfg = _tiny()
    assert group_size_for(cfg, "auto", "cpu") == cfg.seeds == 3
    assert group_size_for(cfg, "solo", "cpu") == 1
    assert group_size_for(cfg, "auto", "cuda") == 1               # not measured on a GPU yet: solo there
    assert group_size_for(replace(cfg, seeds=1), "lockstep", "cpu") == 1
    slow = replace(cfg, grpo=replace(cfg.grpo, grad_checkpointing=True))
    assert group_size_for(slow, "auto", "cpu") == 1
    with pytest.raises(ConfigError, match="engine 'lockstep' cannot run this config: gradient checkpointing is on"):
        group_size_for(slow, "lockstep", "cpu")
    from race.core.errors import RaceError
    from race.run.options import RunOptions

    with pytest.raises(RaceError, match="engine 'fast' is unknown: expected one of auto, lockstep, solo"):
        RunOptions(out_dir="x", engine="fast").check()       # the engine is a run option, checked there once
    # with the worker count, groups are sized so the last round leaves no core idle
    # 3 points × 3 seeds: solo (5 rounds × 1) beats groups of 3 (2 rounds × 3 × 0.9 = 5.4)
    assert group_size_for(cfg, "auto", "cpu", workers=2) == 1
    assert group_size_for(replace(cfg, grid=(0.5, 0.6, 0.7, 0.8)), "auto", "cpu", workers=2) == 3
    thorough = replace(cfg, grid=(0.42, 0.5, 0.62, 0.74, 0.85), seeds=4)
    assert group_size_for(thorough, "auto", "cpu", workers=2) == 2
    assert group_size_for(thorough, "lockstep", "cpu", workers=1) == 4


def test_balanced_group_size_by_hand():
    """rounds × g × share (share 1 for g = 1), computed by hand for three grids on 2 workers."""
    from race.engine.lean_engine import LOCKSTEP_STEP_SHARE, balanced_group_size

    assert LOCKSTEP_STEP_SHARE == 0.9
    # 4 × 3: g=1 → 6 rounds × 1 = 6; g=2 → 8 groups, 4 rounds × 2 × .9 = 7.2; g=3 → 2 rounds × 3 × .9 = 5.4
    assert balanced_group_size(4, 3, 2) == 3
    # 5 × 4: g=2 → 10 groups, 5 rounds × 1.8 = 9; g=4 → 3 rounds × 3.6 = 10.8; g=1 → 10
    assert balanced_group_size(5, 4, 2) == 2
    # 1 × 2 on 2 workers: g=1 → 1 round × 1 = 1 beats g=2 → 1 × 1.8: two pilots run side by side
    assert balanced_group_size(1, 2, 2) == 1
    assert balanced_group_size(4, 3, 2, share=1.0) == 3      # ties go to the larger group
    # 4 × 3 at the reasoner's 1.03: g=3 → 2 rounds × 3 × 1.03 = 6.18 > g=1's 6: solo
    assert balanced_group_size(4, 3, 2, share=1.03) == 1


def test_auto_groups_only_where_lockstep_was_measured_faster():
    """lockstep_share by completion length (≤ 8 tokens 0.9, ≤ 32 0.99, longer 1.03: the measured
    per-step ratios); auto groups the default grid's seeds and runs the reasoner's solo."""
    from dataclasses import replace

    from race.engine.lean_engine import group_size_for, lockstep_share

    cfg = _tiny(budget=1e10)
    assert cfg.grpo.max_completion_len <= 8 and lockstep_share(cfg) == 0.9
    grid = replace(cfg, grid=(0.5, 0.62, 0.74, 0.85), seeds=3)
    assert group_size_for(grid, "auto", "cpu", workers=2) == 3
    steps = replace(grid, grpo=replace(grid.grpo, max_completion_len=24))
    assert lockstep_share(steps) == 0.99 and group_size_for(steps, "auto", "cpu", workers=2) == 3
    long = replace(grid, grpo=replace(grid.grpo, max_completion_len=160))
    assert lockstep_share(long) == 1.03 and group_size_for(long, "auto", "cpu", workers=2) == 1
    assert group_size_for(long, "lockstep", "cpu", workers=2) == 3     # asked for, it still groups


def test_runner_groups_seeds_and_a_dying_group_fails_only_its_pilots(tmp_path):
    """run_jobs with group_size 2: the two seeds of each point share a process (same pid); the
    group whose reward kills its process fails both its pilots, the other group completes."""
    import os

    import crash_reward
    from race.run.processes import Finished, Job, Started, lockstep_groups, run_jobs

    for path in (crash_reward.MARKER, crash_reward.MARKER + ".taken"):
        if os.path.exists(path):
            os.remove(path)
    open(crash_reward.MARKER, "w").close()
    from dataclasses import replace

    cfg = _tiny(budget=1e10)
    cfg = replace(cfg, reward=replace(cfg.reward, kind="custom", function="crash_reward:reward"))
    schedules = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[:2]
    jobs = [Job(s, seed) for s in schedules for seed in (0, 1)]
    assert [[j.key for j in g] for g in lockstep_groups(jobs, 2)] == [[jobs[0].key, jobs[1].key],
                                                                       [jobs[2].key, jobs[3].key]]
    events = list(run_jobs(cfg, jobs, workers=2, group_size=2))
    pids = {job.key: e.pid for e in events if isinstance(e, Started) for job in e.jobs}
    results = [e.result for e in events if isinstance(e, Finished)]
    assert pids[jobs[0].key] == pids[jobs[1].key] != pids[jobs[2].key] == pids[jobs[3].key]
    by_point: dict = {}
    for r in results:
        by_point.setdefault(r.rho_target, []).append(r.status)
    assert sorted(tuple(sorted(v)) for v in by_point.values()) == [("complete", "complete"), ("failed", "failed")]


def test_race_pilot_in_lockstep_retries_a_killed_group_and_resumes_without_rerunning(tmp_path):
    """`race pilot --engine lockstep` on 3 points × 2 seeds: SIGKILL to a group's process (what the
    OOM killer sends) fails both its pilots, which are retried (and regrouped) and complete; every
    pilot records the engine and the report names it; the same command again resumes with nothing
    left to run and nothing re-run."""
    import json
    import os
    import signal
    import subprocess

    from conftest import ROOT
    from pilot_cli import by_state, kill_leftovers, midway, open_study, race, read, start, wait_for, write_config
    from race.run.store import key_of

    cfg = write_config(tmp_path / "c.yaml", name="lockstep-e2e", budget=8e10, seeds=2)   # long enough to be caught mid-way
    out = tmp_path / "run"
    args = ["pilot", cfg, "--engine", "lockstep", "--out", out, "--retries", "1", "--heartbeat", "2",
            "--format", "json"]
    try:
        proc = start(args, tmp_path / "first")
        store = open_study(f"sqlite:///{out}/race.db", "lockstep-e2e", proc=proc)

        def kill_one():
            for t in store.trials():
                pid = t.user_attrs.get("pilot_pid")
                if midway(t) and pid and t.user_attrs["progress"]["flops"] < 4e10:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        return t
                    except ProcessLookupError:
                        pass
            return None

        victim = wait_for(kill_one, procs=[proc])
        assert proc.wait(timeout=900) == 0
    finally:
        kill_leftovers()
    stdout, stderr = read(tmp_path / "first")
    assert json.loads(stdout)["meta"]["engine"] == "lockstep (2 seeds)"
    rho = key_of(victim)[0]
    failed = sorted(key_of(t) for t in by_state(store, "FAIL"))
    assert failed == [(rho, 0), (rho, 1)], failed                 # the whole group died, and only it
    saved = json.loads((out / "results.json").read_text())
    assert sorted((p["rho_target"], p["seed"]) for p in saved["pilots"]) == [(x, s) for x in (0.6, 0.75, 0.92)
                                                                            for s in (0, 1)]
    assert all(p["status"] == "complete" and p["extra"]["engine"] == "lockstep (2 seeds)" for p in saved["pilots"])
    numbers = {key_of(t): t.number for t in by_state(store, "COMPLETE")}
    again = subprocess.run(race(*args), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming, 6 pilots complete, 0 to run" in again.stderr
    assert {key_of(t): t.number for t in by_state(store, "COMPLETE")} == numbers    # nothing re-run


def test_a_gpu_group_is_cut_to_the_seeds_whose_memory_plan_fits():
    """race.flops.memory.group_estimate: shared weights and overhead, the rest per seed; group_size_for on
    CUDA keeps the most seeds whose plan fits the GPU (planning only: no GPU needed)."""
    from race.config.configfile import config_from_dict
    from race.flops.grid import plan_grid
    from race.run.newconfig import init_raw
    from race.engine.lean_engine import group_size_for
    from race.flops.memory import group_estimate, schedule_memory

    cfg = config_from_dict(init_raw(model="Qwen/Qwen2.5-0.5B-Instruct", task="polaris", full_run=5e18,
                                    grid="0.4,0.6,0.8", seeds=3))
    plan = plan_grid(cfg)
    ests = [schedule_memory(cfg, s, prompt_len=plan.prompt_len) for s in plan.schedules]
    one = ests[0]
    three = group_estimate(one, 3)
    assert three.weights == one.weights and three.overhead == one.overhead
    assert three.activations == 3 * one.activations and three.sampling_copy == 3 * one.sampling_copy
    assert three.peak == pytest.approx(one.weights + one.overhead + 3 * (one.peak - one.weights - one.overhead))
    need = [max(group_estimate(e, k).peak for e in ests) for k in (1, 2, 3)]
    assert need[0] < need[1] < need[2]
    assert group_size_for(cfg, "lockstep", "cuda", workers=1, gpu_bytes=need[2]) == 3
    assert group_size_for(cfg, "lockstep", "cuda", workers=1, gpu_bytes=need[2] - 1) == 2
    assert group_size_for(cfg, "lockstep", "cuda", workers=1, gpu_bytes=need[1] - 1) == 1
    assert group_size_for(cfg, "lockstep", "cpu", workers=1, gpu_bytes=need[1] - 1) == 3      # a CPU: no cut
