"""GRPO math against values computed by hand."""
import math

import pytest
import torch

from race.engine import grpo


def test_group_advantages_grpo_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    adv = grpo.group_advantages(r, scale="grpo")
    # group 1: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735; (1 - 0.5) / (0.57735 + 1e-4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert adv[0].tolist() == pytest.approx([a, -a, -a, a], rel=1e-6)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]          # no signal in a uniform group
    dr = grpo.group_advantages(r, scale="dr_grpo")
    assert dr[0].tolist() == [0.5, -0.5, -0.5, 0.5]


def test_max_variance_subset():
    # rewards 0,0,0,1,1,0.5: the 2-subset with max variance is one 0 and one 1
    assert grpo.max_variance_subset([0, 0, 0, 1, 1, 0.5], 2) == [0, 3]
    # 4 of them: two 0s and two 1s (variance 0.25) beats anything with 0.5
    assert grpo.max_variance_subset([0, 0, 0, 1, 1, 0.5], 4) == [0, 1, 3, 4]
    assert grpo.max_variance_subset([0.3, 0.1], 2) == [0, 1]
    with pytest.raises(ValueError, match="k=3"):
        grpo.max_variance_subset([1, 2], 3)


def test_policy_loss_by_hand():
    # two sequences, two completion tokens each; the second token of seq 1 is padding
    logp = torch.tensor([[math.log(0.5), math.log(0.9)], [math.log(0.2), math.log(0.4)]])
    old = torch.tensor([[math.log(0.4), math.log(0.9)], [math.log(0.4), math.log(0.4)]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1, 0], [1, 1]])
    # ratios: seq0 tok0 0.5/0.4 = 1.25 → clipped to 1.2 for A>0: −min(1.25, 1.2)·1 = −1.2
    #         seq1 tok0 0.2/0.4 = 0.5 → A<0: −min(0.5·−2, 0.8·−2) = −(−1.6) = 1.6
    #         seq1 tok1 ratio 1 → −(1·−2) = 2
    out = grpo.policy_loss(logp, old, adv, mask, clip_eps=0.2, loss_agg="dapo", max_completion_len=4)
    assert float(out.loss) == pytest.approx((-1.2 + 1.6 + 2.0) / 3)
    assert out.clip_fraction == pytest.approx(2 / 3)
    g = grpo.policy_loss(logp, old, adv, mask, clip_eps=0.2, loss_agg="grpo", max_completion_len=4)
    assert float(g.loss) == pytest.approx((-1.2 / 1 + (1.6 + 2.0) / 2) / 2)
    d = grpo.policy_loss(logp, old, adv, mask, clip_eps=0.2, loss_agg="dr_grpo", max_completion_len=4)
    assert float(d.loss) == pytest.approx((-1.2 + 1.6 + 2.0) / (2 * 4))


def test_kl_and_entropy_terms():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    # k3: e^(ref−θ) − (ref−θ) − 1 = 0.5 − ln(0.5) − 1 = 0.193147
    assert float(grpo.kl_k3(logp, ref)) == pytest.approx(0.5 + math.log(2) - 1)
    out = grpo.policy_loss(logp, logp, torch.tensor([0.0]), torch.tensor([[1]]), beta=0.1, ref_logp=ref,
                           entropy=torch.tensor([[2.0]]), entropy_coef=0.01)
    assert float(out.loss) == pytest.approx(0.1 * (0.5 + math.log(2) - 1) - 0.01 * 2.0, rel=1e-5)


def test_pack_layout():
    b = grpo.pack([[5, 6], [7]], [[1, 2, 3], [4]], [0, 1], [0.5, -0.5], pad_id=0)
    assert b.prompt_ids.tolist() == [[5, 6], [0, 7]] and b.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert b.completion_ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert b.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert b.input_ids.tolist() == [[5, 6, 1, 2, 3], [0, 7, 4, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert (b.prompt_lens, b.completion_lens) == ([2, 1], [3, 1])


def _tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=64, vocab_size=11,
                                        max_position_embeddings=32)).eval()


@pytest.mark.parametrize("block", [1 << 26, 7, 40, 70, 140])  # one block; 1 or 3 positions; 1 or 2 whole rows
@pytest.mark.parametrize("with_entropy", [False, True])
def test_token_logprobs_in_blocks_equal_the_whole_log_softmax(monkeypatch, block, with_entropy):
    """token_logprobs (blocks of positions, the gradient written block by block) against
    log_softmax(logits / T).gather over the whole tensor: values and gradients, for [B, T, V] sliced
    as the HF path slices it (not contiguous) and [S, B, T, V] as the lockstep path gives it."""
    monkeypatch.setattr(grpo, "LOGIT_BLOCK_ENTRIES", block)
    torch.manual_seed(0)
    for shape in ((3, 6, 11), (2, 3, 5, 11)):
        full = torch.randn(*shape[:-2], shape[-2] + 1, shape[-1], dtype=torch.float64) * 3
        ids = torch.randint(0, shape[-1], shape[:-1])
        g_lp, g_h = torch.randn(shape[:-1], dtype=torch.float64), torch.randn(shape[:-1], dtype=torch.float64)
        got, want = {}, {}
        for name, out in (("blocks", got), ("whole", want)):
            leaf = full.clone().requires_grad_(True)
            logits = leaf[..., :-1, :]                        # a view: every row skips its last position
            if name == "blocks":
                lp, h = grpo.token_logprobs(logits, ids, temperature=0.7, with_entropy=with_entropy)
            else:
                logsm = torch.log_softmax(logits.float() / 0.7, dim=-1)
                lp = logsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
                h = -(logsm.exp() * logsm).sum(-1) if with_entropy else None
            assert (h is None) == (not with_entropy)
            loss = (lp * g_lp).sum() + ((h * g_h).sum() if with_entropy else 0.0)
            loss.backward()
            out.update(lp=lp.detach(), h=None if h is None else h.detach(), grad=leaf.grad)
        assert got["lp"].dtype == torch.float32 and got["lp"].shape == ids.shape
        torch.testing.assert_close(got["lp"], want["lp"].float(), rtol=1e-5, atol=1e-5)
        if with_entropy:
            torch.testing.assert_close(got["h"], want["h"].float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["grad"], want["grad"], rtol=1e-4, atol=1e-5)
        assert got["grad"][..., -1, :].abs().max() == 0      # the position no one reads gets no gradient


def test_completion_logprobs_match_a_manual_forward():
    model = _tiny_qwen2()
    b = grpo.pack([[3, 4, 5], [6]], [[7, 8], [9, 1]], [0, 1], [1.0, 1.0], pad_id=0)
    logp, ent = grpo.completion_logprobs(model, b, temperature=0.7, with_entropy=True)
    # sequence 2 without padding: [6, 9, 1]; log p(9 | 6) and log p(1 | 6, 9) at temperature 0.7
    ref = torch.log_softmax(model(torch.tensor([[6, 9, 1]])).logits[0] / 0.7, -1)
    assert logp[1].tolist() == pytest.approx([ref[0, 9].item(), ref[1, 1].item()], abs=1e-5)
    assert (ent >= 0).all()


def test_grouped_prefix_gives_the_same_logprobs_and_gradients():
    """Running each prompt once for its group (the lean policy, race.engine.backends.lockstep) is exact,
    gradients included."""
    from types import SimpleNamespace

    from race.engine.backends.lockstep import LockstepLM

    model = _tiny_qwen2()
    lean = LockstepLM(model, rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj"), seeds=[0])
    lora = list(lean.adapters[0].values())
    with torch.no_grad():
        for p in lora:
            p.normal_(0, 0.1)
    b = grpo.pack([[3, 4, 5], [6]], [[7, 8, 2], [9], [1, 10]], [0, 0, 1], [1.0, -1.0, 0.5], pad_id=0)
    grouped = grpo.completion_logprobs(lean, grpo.stack_batches([b], pad_id=0))[0][0]

    class Whole:          # the same model through the whole-sequence path (one seed)
        def __call__(self, **kw):
            return SimpleNamespace(logits=lean(kw["input_ids"][None], kw["attention_mask"][None],
                                               kw["position_ids"][None], logits_to_keep=kw["logits_to_keep"]).logits[0])
    whole, _ = grpo.completion_logprobs(Whole(), b)
    m = b.completion_mask.bool()
    assert torch.allclose(grouped[m], whole[m], atol=1e-5)
    g1 = torch.autograd.grad((grouped * m).sum(), lora)
    g2 = torch.autograd.grad((whole * m).sum(), lora)
    assert all(torch.allclose(a, c, atol=1e-5) for a, c in zip(g1, g2))


def test_clip_higher_by_hand():
    """clip-higher (DAPO): a ratio of 1.25 on a positive advantage is clipped at 1.2 by ε = 0.2 and
    kept whole by ε_high = 0.28; the lower bound stays 1 − ε."""
    logp = torch.log(torch.tensor([[1.25, 0.7]]))
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    for adv, eps_high, want in ((1.0, None, -(1.2 + 0.7) / 2), (1.0, 0.28, -(1.25 + 0.7) / 2),
                                (-1.0, 0.28, (1.25 + 0.8) / 2)):
        terms = grpo.policy_loss(logp, old, torch.tensor([adv]), mask, clip_eps=0.2, clip_eps_high=eps_high,
                                 loss_agg="dapo")
        assert float(terms.loss) == pytest.approx(want, abs=1e-6)


def test_clip_eps_high_in_the_config():
    from race.config.configfile import ConfigError, config_from_dict

    base = {"model": "race/tiny-arith", "budget": 1e11, "grid": [0.5, 0.7]}
    assert config_from_dict({**base, "grpo": {"clip_eps_high": 0.28}}).grpo.clip_eps_high == 0.28
    with pytest.raises(ConfigError, match="clip_eps_high"):
        config_from_dict({**base, "grpo": {"clip_eps_high": 0.1}})
