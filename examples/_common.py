"""What the example scripts share: the model / tokenizer arguments, the checkpoint detection of HF's scripts, and the
tiny local models the scripts are tested with (no hub access).

The scripts themselves keep the shape of HF's official ones (`examples/pytorch/*/run_*.py` in transformers): argument
dataclasses parsed by `HfArgumentParser`, `main_process_first` around preprocessing, `train(resume_from_checkpoint=)`,
`log_metrics` / `save_metrics` / `save_state`, `evaluate`, `predict(metric_key_prefix="predict")`,
`create_model_card`.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import transformers
from transformers.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)

BUNDLED_TOKENIZER = Path(__file__).resolve().parents[1] / "configs" / "data" / "tokenizer.json"
SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"}


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to start from (HF's `ModelArguments`, the fields a local run needs)."""

    model_name_or_path: str = field(metadata={"help": "A model folder (save_pretrained) or a hub name."})
    config_name: str | None = field(default=None, metadata={"help": "Config name or path, if not the model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Tokenizer name or path, if not the model's."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where to store downloaded models."})


def setup_logging(training_args) -> None:
    """HF's logging set-up: INFO on the main process, the arguments' level for transformers and datasets."""
    import datasets

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%m/%d/%Y %H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stdout)])
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.warning(f"Process rank: {training_args.process_index}, device: {training_args.device}, "
                   f"n_gpu: {training_args.n_gpu}, distributed: {training_args.parallel_mode.value == 'distributed'}")


def detect_last_checkpoint(training_args) -> str | None:
    """HF 5's scripts: re-running a command into its own `output_dir` resumes from the last checkpoint there."""
    if not (os.path.isdir(training_args.output_dir) and training_args.do_train):
        return None
    last = get_last_checkpoint(training_args.output_dir)
    if last is not None and training_args.resume_from_checkpoint is None:
        logger.info(f"Checkpoint detected, resuming training at {last}. To avoid this behavior, change the "
                    "`--output_dir`.")
    return last


def resume_point(training_args, last_checkpoint: str | None) -> str | bool | None:
    """`--resume_from_checkpoint` wins over the detected checkpoint, as in HF's scripts."""
    if training_args.resume_from_checkpoint is not None:
        return training_args.resume_from_checkpoint
    return last_checkpoint


def make_tiny_model(kind: str, output_dir: str, num_labels: int = 2) -> str:
    """Save a tiny random model of `kind` (`classification`, `token-classification`, `causal-lm`, `llama`, `masked-lm`,
    `seq2seq`, `question-answering`) with the bundled tokenizer into `output_dir`; scripts load it with
    `--model_name_or_path`."""
    import torch
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        BertConfig,
        BertForMaskedLM,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(BUNDLED_TOKENIZER), **SPECIAL_TOKENS)
    vocab, pad, cls, sep = len(tokenizer), tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id
    torch.manual_seed(0)
    bert = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=128, pad_token_id=pad)
    if kind == "classification":
        model = BertForSequenceClassification(BertConfig(**bert, num_labels=num_labels))
    elif kind == "token-classification":
        model = BertForTokenClassification(BertConfig(**bert, num_labels=num_labels))
    elif kind == "question-answering":
        model = BertForQuestionAnswering(BertConfig(**bert))
    elif kind == "masked-lm":
        model = BertForMaskedLM(BertConfig(**bert))
    elif kind == "causal-lm":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                           bos_token_id=cls, eos_token_id=sep, pad_token_id=pad))
    elif kind == "llama":  # a Llama-style causal LM (the SFT script's model: HF counts its label tokens right)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                             max_position_embeddings=128, bos_token_id=cls, eos_token_id=sep,
                                             pad_token_id=pad))
    elif kind == "seq2seq":
        model = BartForConditionalGeneration(BartConfig(
            vocab_size=vocab, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
            pad_token_id=pad, bos_token_id=cls, eos_token_id=sep, decoder_start_token_id=sep,
            forced_eos_token_id=sep))
    else:
        raise ValueError(f"kind={kind!r}: one of classification, token-classification, causal-lm, llama, masked-lm, "
                         "seq2seq, question-answering")
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


if __name__ == "__main__":
    # python examples/_common.py <kind> <output_dir>: a tiny local model for the scripts' --model_name_or_path
    print(make_tiny_model(sys.argv[1], sys.argv[2]))
