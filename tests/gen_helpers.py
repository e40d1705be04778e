"""Tiny generation models, a local word-level tokenizer and text datasets (no hub), for the generation tests."""

from __future__ import annotations

import random

import torch
from datasets import Dataset

WORDS = [f"w{i}" for i in range(40)]
SPECIALS = ["<pad>", "</s>", "<unk>", "<s>"]  # ids 0, 1, 2, 3
PAD, EOS, UNK, BOS = 0, 1, 2, 3


def word_tokenizer():
    """A `PreTrainedTokenizerFast` over `WORDS` split on spaces: pad 0, eos 1, unk 2, bos 3."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *WORDS])}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    from tokenizers.decoders import WordPiece

    core.decoder = WordPiece(prefix="##")  # joins tokens with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="<s>"
    )


VOCAB = len(SPECIALS) + len(WORDS)


def tiny_t5(seed: int = 0, d_model: int = 32, layers: int = 2, vocab: int = VOCAB):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=vocab, d_model=d_model, d_ff=2 * d_model, d_kv=d_model // 2, num_layers=layers, num_heads=2,
        dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
    )
    return T5ForConditionalGeneration(config)


def tiny_bart(seed: int = 0):
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        dropout=0.0, attention_dropout=0.0, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS,
        decoder_start_token_id=EOS, forced_eos_token_id=EOS, init_std=0.3,
    )
    return BartForConditionalGeneration(config)


def tiny_gpt2_lm(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
    )
    return GPT2LMHeadModel(config)


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
    )
    return LlamaForCausalLM(config)


def text_pairs(n: int, seed: int = 0, low: int = 2, high: int = 6) -> list[tuple[str, str]]:
    """(source, target) word sequences; the target is the source reversed (learnable, varied lengths)."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
        pairs.append((" ".join(words), " ".join(reversed(words))))
    return pairs


def seq2seq_dataset(tokenizer, n: int = 12, seed: int = 0) -> Dataset:
    """`input_ids`/`attention_mask`/`labels` rows (unpadded, EOS-terminated) for an encoder-decoder model."""
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for source, target in text_pairs(n, seed):
        ids = tokenizer(source)["input_ids"] + [EOS]
        rows["input_ids"].append(ids)
        rows["attention_mask"].append([1] * len(ids))
        rows["labels"].append(tokenizer(target)["input_ids"] + [EOS])
    return Dataset.from_dict(rows)


def prompt_completion_dataset(tokenizer, n: int = 12, seed: int = 0, max_length: int = 24) -> Dataset:
    """The decoder-only format built with `tokenize_prompt_completion` from (prompt, completion) texts."""
    from hf_lightning.seq2seq import tokenize_prompt_completion

    pairs = text_pairs(n, seed)
    raw = Dataset.from_dict({"prompt": [p for p, _ in pairs], "completion": [c for _, c in pairs]})
    return raw.map(tokenize_prompt_completion, batched=True, remove_columns=raw.column_names,
                   fn_kwargs={"tokenizer": tokenizer, "max_length": max_length})
