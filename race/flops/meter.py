"""FLOPs metered from the tokens a step actually processed: ``FlopMeter``.

The same formulas the planner uses (race.flops.formulas, race.flops.grid), applied to actual token counts: one
prefill per prompt shared by its rollouts plus each rollout's decode (search), the update over the
trained sequences (learning), and the reward model's forwards (reward). Padding is not counted.
Invariant: for the planned lengths it gives the planner's numbers (tests/test_flops.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from race.flops import formulas as F
from race.flops.grid import ENGINE_LEARNING_KW, grouped_learning


@dataclass
class FlopMeter:
    """FLOPs of actual token counts, with the same formulas the planner uses.

    Padding is not counted: the accounting is of useful tokens (hardware
    utilisation, like communication, is outside it — as in the RACE paper).
    """

    arch: F.ArchSpec
    lora: F.LoRASpec
    reward: F.RewardModelSpec | None = None
    sampling_uses_adapter: bool = False
    ref_logprobs: bool = False
    grad_checkpointing: bool = False

    def __post_init__(self) -> None:
        self._cache: dict[tuple, float] = {}

    def _memo(self, key: tuple, fn) -> float:
        # a step has few distinct (prompt, completion) lengths: evaluate each formula once
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    def search(self, prompt_lens: list[int], completion_lens: list[list[int]]) -> float:
        """One prefill per prompt (shared by its rollouts) + each rollout's decode."""
        lora = self.lora if self.sampling_uses_adapter else None

        def cost(p: int, c: int) -> float:   # c = 0: the prefill alone
            return self._memo(("s", p, c), lambda: F.search_flops(self.arch, prompt_len=p, completion_len=c,
                                                                  n=1, lora=lora))
        total = 0.0
        for p, group in zip(prompt_lens, completion_lens):
            prefill = cost(p, 0)
            total += prefill + sum(cost(p, c) - prefill for c in group)
        return total

    def learning(self, prompt_lens: list[int], completion_lens: list[int], group: list[int], mu: int, *,
                 shared_prefix: bool) -> float:
        """The update over sequences ``prompt_lens[group[i]] + completion_lens[i]`` (grid.grouped_learning)."""
        def cost(p: int, c: int) -> float:
            return self._memo(("l", p, c, mu), lambda: F.learning_flops(
                self.arch, prompt_len=p, completion_len=c, sequences=1, lora=self.lora, mu=mu,
                ref_logprobs=self.ref_logprobs, grad_checkpointing=self.grad_checkpointing, **ENGINE_LEARNING_KW))
        seqs = [cost(prompt_lens[g], c) for g, c in zip(group, completion_lens)]
        prefixes = [cost(p, 0) for p in prompt_lens] if shared_prefix else []
        return grouped_learning(seqs, prefixes, group, shared_prefix=shared_prefix)

    def reward_flops(self, lengths: list[tuple[int, int]]) -> float:
        if self.reward is None:
            return 0.0
        return sum(self._memo(("r", p, c), lambda: F.reward_flops(self.reward, prompt_len=p, completion_len=c,
                                                                  sequences=1)) for p, c in lengths)
