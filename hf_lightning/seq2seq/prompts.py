"""The decoder-only (causal LM) generation format: prompt / completion rows, and the batch split for `generate`.

Dataset format (one row per example; `tokenize_prompt_completion` builds it from text):

- `input_ids`: prompt tokens followed by completion tokens;
- `attention_mask`: 1 on those tokens, 0 on padding;
- `labels`: -100 on the prompt (and on padding), the completion tokens elsewhere, so the teacher-forced loss is
  the completion's loss only.

The prompt of a row is every attended position before its first label that is not -100, so no extra column is
needed (an extra column would be dropped by `remove_unused_columns`). Rows may be padded on either side;
`DataCollatorForSeq2Seq(tokenizer)` pads `labels` with -100 as required.

For generation, `split_prompt_completion` takes each row's prompt, left-pads the prompts (a causal LM continues from
the last position, so padding must be on the left) and left-aligns the reference completions padded with -100.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["left_pad_prompts", "split_prompt_completion", "tokenize_prompt_completion", "pad_right"]


def pad_right(tensor: torch.Tensor, width: int, value: int) -> torch.Tensor:
    """`tensor` (batch, length) right-padded with `value` to `width` columns; never truncated."""
    if tensor.shape[-1] >= width:
        return tensor
    out = torch.full((tensor.shape[0], width), value, dtype=tensor.dtype, device=tensor.device)
    out[:, : tensor.shape[-1]] = tensor
    return out


def left_pad_prompts(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attended tokens of each row, left-padded with `pad_token_id` (a causal LM continues from the right)."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    rows = [input_ids[i][attention_mask[i].bool()] for i in range(input_ids.shape[0])]
    width = max(int(r.numel()) for r in rows)
    prompt_ids = torch.full((len(rows), width), pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
    prompt_mask = torch.zeros((len(rows), width), dtype=attention_mask.dtype, device=input_ids.device)
    for i, row in enumerate(rows):
        if row.numel():
            prompt_ids[i, width - row.numel():] = row
            prompt_mask[i, width - row.numel():] = 1
    return prompt_ids, prompt_mask


def split_prompt_completion(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts, their attention mask, and the reference completions (-100 padded on the right).

    Raises:
        ValueError: a row whose `labels` are all -100 (no completion to compare with).
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    target = labels != -100
    has_completion = target.any(dim=1)
    if not bool(has_completion.all()):
        rows = torch.nonzero(~has_completion).flatten().tolist()
        raise ValueError(
            f"Decoder-only generation needs a completion in every row, but `labels` is all -100 in batch rows "
            f"{rows}. Labels must be -100 on the prompt and the completion token ids after it "
            "(see hf_lightning.seq2seq.tokenize_prompt_completion)."
        )
    starts = target.int().argmax(dim=1)  # first completion position of each row
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
    keep = attention_mask.bool() & (positions < starts[:, None])
    prompt_ids, prompt_mask = left_pad_prompts(input_ids, keep.to(attention_mask.dtype), pad_token_id)
    completions = [labels[i, int(s):][target[i, int(s):]] for i, s in enumerate(starts)]
    batch = len(completions)
    ref_width = max(int(c.numel()) for c in completions)
    references = torch.full((batch, ref_width), -100, dtype=labels.dtype, device=labels.device)
    for i, completion in enumerate(completions):
        references[i, : completion.numel()] = completion
    return prompt_ids, prompt_mask, references


def tokenize_prompt_completion(
    examples: dict[str, list[str]],
    tokenizer: Any,
    max_length: int,
    prompt_column: str = "prompt",
    completion_column: str = "completion",
    add_eos_token: bool = True,
) -> dict[str, list[list[int]]]:
    """Tokenise a batch of (prompt, completion) texts into the decoder-only format (for `datasets.Dataset.map`).

    The prompt is tokenised with the tokenizer's special tokens (e.g. a BOS), the completion without, followed by
    the EOS token when `add_eos_token` (so the model learns to stop). A completion that does not fit in `max_length`
    is cut on the right; the prompt is never cut.

    Example::

        ds = ds.map(tokenize_prompt_completion, batched=True, remove_columns=ds.column_names,
                    fn_kwargs={"tokenizer": tok, "max_length": 64})

    Raises:
        ValueError: a missing column, a missing tokenizer, or a prompt leaving no room for one completion token.
    """
    if tokenizer is None:
        raise ValueError("`tokenizer` is required to tokenise prompt/completion texts (got None).")
    for column in (prompt_column, completion_column):
        if column not in examples:
            raise ValueError(f"Column `{column}` is missing; the batch has columns {sorted(examples)}.")
    eos = [tokenizer.eos_token_id] if add_eos_token and tokenizer.eos_token_id is not None else []
    out: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
    for index, (prompt, completion) in enumerate(zip(examples[prompt_column], examples[completion_column])):
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + eos
        room = max_length - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"`max_length`={max_length} is shorter than the prompt of row {index} plus one completion token "
                f"(the prompt has {len(prompt_ids)} tokens); raise `max_length` or shorten the prompt."
            )
        completion_ids = completion_ids[:room]
        out["input_ids"].append(prompt_ids + completion_ids)
        out["attention_mask"].append([1] * (len(prompt_ids) + len(completion_ids)))
        out["labels"].append([-100] * len(prompt_ids) + completion_ids)
    return out
