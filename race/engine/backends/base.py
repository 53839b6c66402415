"""The rollout-backend interface (``RolloutBackend``, a ``typing.Protocol``), its batch type and stop tokens.

Every backend (race.engine.backends.hf, .lockstep, .vllm) has the attributes and methods the Protocol
names, so callers use them directly, without ``hasattr`` probing (tests/test_backends.py checks
each backend against it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class RolloutBatch:
    """Rollouts for a batch of prompts, grouped by prompt.

    ``completion_ids[i][j]`` are the generated token ids of rollout j of prompt i,
    up to and including the end-of-sequence token when one was produced (no
    padding); ``texts[i][j]`` is their decoded text WITH special tokens (the EOS marker included,
    so a reward can tell a policy that stopped from one that ran out of tokens).
    ``logprobs[i][j][t]``, when the backend reports them (vLLM), is the sampler's log-prob
    of completion token t (for inspection and tests: the update recomputes its own).
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]
    texts: list[list[str]]
    logprobs: list[list[list[float]]] | None = None


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """The token ids that end a completion: the tokenizer's EOS and every EOS id of the model's
    generation config (a chat model's end-of-turn ``<|im_end|>`` and its end-of-text
    ``<|endoftext|>``: Qwen2.5-Instruct lists both), in ascending order."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    ids.discard(None)
    if not ids:
        raise ValueError("the tokenizer has no eos_token and the model's generation config names none: "
                         "a completion could never stop")
    return sorted(int(i) for i in ids)


@runtime_checkable
class RolloutBackend(Protocol):
    """What the pilot engine, evaluation and calibration call on a rollout backend."""

    name: str                     # "hf" or "vllm": the report names it
    sampling_uses_adapter: bool   # True: sampling runs the unmerged adapter (its FLOPs count in C_search)
    sleep: bool                   # True: the engine sleeps during the update (vLLM sleep mode)
    tok: Any                      # the tokenizer prompts are encoded with
    device: Any                   # the torch.device sampling runs on

    def generate(self, prompts: list[str], *, n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None, generator: Any = None) -> RolloutBatch:
        """Sample ``n`` completions per prompt with the current policy (from ``generator``, or a
        generator seeded with ``seed``)."""

    def sync(self) -> float:
        """Make the policy's latest adapter weights the ones sampled from; returns FLOPs spent doing it."""

    def pause(self) -> None:
        """The update is about to run: free what sampling holds, if the backend can (vLLM sleep mode)."""

    def resume(self) -> None:
        """The update is done: make sampling ready again (called before ``sync``)."""

    def close(self) -> None:
        """Release the engine."""
