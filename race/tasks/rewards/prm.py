"""Process reward models: a Hugging Face model that scores each step of a completion.

Two conventions, chosen from the model's ``config.json`` (``convention="auto"``):

- **step classification** (the Qwen2.5-Math-PRM-7B convention): the completion's steps
  are joined by the PRM's step token (``<extra_0>``), one after every step; the model
  returns two logits per position (a 2-label token-classification head, or Qwen's
  ``Linear(h, h), ReLU, Linear(h, 2)``), and a step's score is the softmax probability
  of the positive class (label 1) at its step token. Models: ``*ForTokenClassification``
  with 2 labels (RACE's tiny PRMs), ``*ForProcessRewardModel`` (remote code).
- **value head**: one output per position (``*ForTokenClassification`` with 1 label,
  ``*ForRewardModel``): a step's score is ``sigmoid(value)`` at its step token; or a
  sequence classifier (``*ForSequenceClassification``): one score per completion at its
  last token (positive-class probability for 2 labels, ``sigmoid`` for 1), a single step.

Step scores become one reward by ``aggregation`` (``aggregate``):

- ``min`` (default): the weakest step — a solution is as good as its worst step (the
  usual PRM choice for best-of-n and RL: one wrong step spoils the solution);
- ``product``: the probability that every step is right, if steps were independent;
- ``last``: the score of the final step (for this task, the answer step);
- ``mean``: the average step score (partial credit).

A completion with no step scores 0.0.

Input: a tokenizer with a chat template gets Qwen's PRM layout (system prompt, the prompt
as the user turn, the joined steps as the assistant turn); one without (the tiny PRMs)
reads ``prompt + step₁<extra_0>step₂<extra_0>…``. The completion is cut at its first EOS
marker and split into steps at ``step_separator`` (``";"`` for ``arithmetic-steps``,
``"\\n\\n"`` by Qwen's convention).

FLOPs are counted from the tokens the PRM actually reads (each sequence's own length,
padding excluded, as the pilots meter the policy): ``race.flops.formulas.reward_flops`` of its
body and head. Remote code (``*ForProcessRewardModel``) runs only when
``trust_remote_code=True`` is passed (config: ``reward.trust_remote_code: true``).
"""
from __future__ import annotations

import math
import time
from typing import Sequence

from race.tasks.rewards.rules import STEP_SEPARATOR, split_steps  # noqa: F401 (split_steps: re-exported)
from race.core.errors import RaceError

AGGREGATIONS = ("min", "product", "last", "mean")
STEP_TOKEN = "<extra_0>"                 # Qwen2.5-Math-PRM's step separator token
QWEN_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
CONVENTIONS = ("auto", "step-classification", "value-head", "sequence")


class PRMError(RaceError):
    """A PRM that cannot be built or used; the message is one line and names the value."""


def aggregate(step_scores: Sequence[float], how: str = "min") -> float:
    """One reward from per-step scores in [0, 1]; 0.0 when there is no step.

    >>> aggregate([0.9, 0.5, 0.8], "min"), aggregate([0.9, 0.5, 0.8], "last")
    (0.5, 0.8)
    """
    if how not in AGGREGATIONS:
        raise PRMError(f"aggregation {how!r} is unknown: expected one of {', '.join(AGGREGATIONS)}")
    s = [float(x) for x in step_scores]
    if not s:
        return 0.0
    if how == "min":
        return min(s)
    if how == "product":
        return math.prod(s)
    if how == "last":
        return s[-1]
    return sum(s) / len(s)


def detect_convention(config) -> str:
    arch = (getattr(config, "architectures", None) or [""])[0]
    labels = int(getattr(config, "num_labels", 2) or 2)
    if arch.endswith("ForProcessRewardModel"):
        return "step-classification"
    if arch.endswith("ForRewardModel"):
        return "value-head"
    if arch.endswith("ForSequenceClassification"):
        return "sequence"
    if arch.endswith("ForTokenClassification"):
        return "step-classification" if labels == 2 else "value-head"
    raise PRMError(f"model architecture {arch or 'unknown'!r} is not a reward model: expected "
                   f"*ForTokenClassification, *ForSequenceClassification, *ForProcessRewardModel "
                   f"or *ForRewardModel")


class ProcessRewardModel:
    """A PRM as a batched RACE reward.

    ``score_batch(prompts, completions, references)`` returns a ``RewardBatch`` whose
    ``flops`` are those of the forwards it ran; calling the object on one sample returns
    its aggregated score. ``step_scores`` exposes the per-step probabilities.
    """

    def __init__(self, model: str, *, aggregation: str = "min", step_separator: str = "\n\n",
                 convention: str = "auto", trust_remote_code: bool = False, device: str = "cpu",
                 batch_size: int = 64, dtype=None, attn_implementation: str | None = None,
                 trust_setting: str = "reward.trust_remote_code"):
        import torch
        from transformers import AutoConfig, AutoTokenizer

        from race.flops.catalog import load_reward_model, resolve_model_path, reward_model_spec

        if aggregation not in AGGREGATIONS:
            raise PRMError(f"aggregation {aggregation!r} is unknown: expected one of {', '.join(AGGREGATIONS)}")
        if convention not in CONVENTIONS:
            raise PRMError(f"convention {convention!r} is unknown: expected one of {', '.join(CONVENTIONS)}")
        if not step_separator:
            raise PRMError("step_separator must be a non-empty string (e.g. ';' or '\\n\\n')")
        self.name, self.path = model, resolve_model_path(model)
        self.aggregation, self.step_separator, self.device = aggregation, step_separator, device
        self.batch_size = int(batch_size)
        try:                      # OSError: not cached and no hub, a misspelt or gated id, no weights
            config = AutoConfig.from_pretrained(self.path, trust_remote_code=trust_remote_code)
            arch = (getattr(config, "architectures", None) or [""])[0]
            remote = arch.endswith(("ForProcessRewardModel", "ForRewardModel"))
            if remote and not trust_remote_code:
                raise PRMError(f"reward model {model!r} ({arch}) runs its own code: set {trust_setting}: "
                               f"true to allow it")
            self.convention = detect_convention(config) if convention == "auto" else convention
            self.tokenizer = AutoTokenizer.from_pretrained(self.path, trust_remote_code=trust_remote_code)
            self.tokenizer.padding_side = "right"
            if self.tokenizer.pad_token_id is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token
            self.step_token_id = self.tokenizer.convert_tokens_to_ids(STEP_TOKEN)
            if self.convention != "sequence" and (self.step_token_id is None
                                                  or self.step_token_id == self.tokenizer.unk_token_id):
                raise PRMError(f"reward model {model!r} has no step token {STEP_TOKEN!r} in its vocabulary")
            dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
            kw = {"dtype": dtype, "trust_remote_code": trust_remote_code}
            if attn_implementation:
                kw["attn_implementation"] = attn_implementation
            self.model = self._load(arch, kw).to(device).eval()
        except OSError as e:
            from race.flops.catalog import load_error

            raise load_error(model, e, "reward model") from None
        # planning has already refused an architecture RACE cannot count (or the user opted in)
        try:
            self.spec = load_reward_model(self.path, allow_approximate=True)   # shipped configs, local folders
        except ValueError:                                                    # a hub id RACE has no config for
            self.spec = reward_model_spec(config.to_dict(), model, allow_approximate=True)

    def _load(self, arch: str, kw: dict):
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

        if arch.endswith("ForSequenceClassification"):
            return AutoModelForSequenceClassification.from_pretrained(self.path, **kw)
        if arch.endswith("ForTokenClassification"):
            return AutoModelForTokenClassification.from_pretrained(self.path, **kw)
        return AutoModel.from_pretrained(self.path, **kw)      # remote-code PRM / RM classes

    # ------------------------------------------------------------------ inputs

    def format(self, prompt: str, completion: str) -> tuple[str, int]:
        """(text the PRM reads, number of steps)."""
        steps = split_steps(completion, self.step_separator)
        body = "".join(s + STEP_TOKEN for s in steps) if self.convention != "sequence" \
            else self.step_separator.join(steps)
        if getattr(self.tokenizer, "chat_template", None):
            msgs = [{"role": "system", "content": QWEN_PRM_SYSTEM}, {"role": "user", "content": prompt},
                    {"role": "assistant", "content": body}]
            return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False), len(steps)
        return prompt + body, len(steps)

    def flops_of(self, lengths: Sequence[int], *, causal: bool = True) -> float:
        """FLOPs of reading sequences of these token counts (one forward each, no LM head)."""
        from race.flops.formulas import reward_flops

        return sum(reward_flops(self.spec, prompt_len=t, completion_len=0, sequences=1, causal=causal)
                   for t in lengths)

    # ------------------------------------------------------------------ scoring

    def step_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> tuple[list[list[float]], list[int]]:
        """(per-step scores of each completion, tokens each PRM input had)."""
        import torch

        texts, n_steps = zip(*(self.format(p, c) for p, c in zip(prompts, completions))) if prompts else ((), ())
        scores: list[list[float]] = [[] for _ in texts]
        lengths = [0] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))   # similar lengths share a batch
        for start in range(0, len(order), self.batch_size):
            idx = [i for i in order[start:start + self.batch_size] if n_steps[i] > 0]
            if not idx:
                continue
            enc = self.tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True,
                                 add_special_tokens=False).to(self.device)
            with torch.no_grad():
                out = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
            logits = (out.logits if hasattr(out, "logits") else out[0]).float()
            for row, i in enumerate(idx):
                lengths[i] = int(enc["attention_mask"][row].sum())
                scores[i] = self._row_scores(logits[row], enc["input_ids"][row], lengths[i])
        return scores, lengths

    def _row_scores(self, logits, ids, length: int) -> list[float]:
        import torch

        if self.convention == "sequence":
            last = logits[length - 1] if logits.dim() == 2 else logits
            return [float(torch.softmax(last, -1)[1]) if last.numel() == 2 else float(torch.sigmoid(last[0]))]
        at = logits[ids == self.step_token_id]
        if self.convention == "step-classification":
            return torch.softmax(at, -1)[:, 1].tolist()
        return torch.sigmoid(at[..., 0] if at.dim() == 2 else at).tolist()

    def score_batch(self, prompts: Sequence[str], completions: Sequence[str], references: Sequence[str]):
        """``RewardBatch``: aggregated step scores, CPU seconds, FLOPs of the tokens read."""
        from race.tasks.rewards.base import RewardBatch

        start = time.process_time()
        steps, lengths = self.step_scores(prompts, completions)
        return RewardBatch(scores=[aggregate(s, self.aggregation) for s in steps],
                           cpu_seconds=time.process_time() - start,
                           flops=self.flops_of([t for t in lengths if t > 0]))

    def __call__(self, prompt: str, completion: str, reference: str) -> float:
        return self.score_batch([prompt], [completion], [reference]).scores[0]


def build_prm(reward, *, task: str = "", device: str = "cpu") -> ProcessRewardModel:
    """The PRM a config's ``reward`` section names (kinds ``prm`` and ``proxy-prm``)."""
    sep = getattr(reward, "step_separator", None) or default_step_separator(task)
    return ProcessRewardModel(reward.model, aggregation=getattr(reward, "aggregation", "min"), step_separator=sep,
                              trust_remote_code=getattr(reward, "trust_remote_code", False), device=device,
                              batch_size=getattr(reward, "batch_size", 64))


def default_step_separator(task: str) -> str:
    """``";"`` for ``arithmetic-steps``, else ``"\\n\\n"`` (Qwen2.5-Math-PRM's convention)."""
    return STEP_SEPARATOR if task == "arithmetic-steps" else "\n\n"


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve of ``scores`` for the positive ``labels`` (Mann–Whitney,
    ties count one half); NaN when one class is missing."""
    pairs = sorted(zip(scores, labels), key=lambda x: x[0])
    n_pos = sum(1 for _, y in pairs if y)
    n_neg = len(pairs) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    rank_sum, i = 0.0, 0
    while i < len(pairs):              # average ranks over ties
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        rank = (i + 1 + j) / 2
        rank_sum += rank * sum(1 for _, y in pairs[i:j] if y)
        i = j
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
