"""A run_mlm-style run (random masking by `DataCollatorForLanguageModeling`, dropout on, GA=2, evaluations, best
model) ends with HF's log history, weights and best checkpoint: the collator and dropout draw the RNG in HF's order.

HF fetches an update's micro-batches right before its first forward, one micro-batch ahead (accelerate), so every
mask is drawn between two known forwards. hf_lightning used to collate a whole window one window ahead (Lightning's
prefetch): the masks of the next update were drawn before this update's dropout, and every later number moved
(eval_loss ~7% apart, another checkpoint picked as best). `data/windows.py` fetches as HF does.

ModernBERT is used because its masked-LM loss honours `num_items_in_batch`: with BERT, HF's loss is
`gradient_accumulation_steps` times too large (README "Differences"), which is not what this test is about.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
import transformers
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, ModernBertConfig, ModernBertForMaskedLM

import hf_lightning

VOCAB = 60
TIMING = ("runtime", "per_second")


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB)}
    vocab.update({token: VOCAB + i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def blocks(n: int, seed: int) -> Dataset:
    """Token blocks with a learnable pattern (each token is followed by its successor), as run_mlm's grouped texts."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        start = rng.randrange(VOCAB)
        rows.append([(start + i) % VOCAB for i in range(12)])
    return Dataset.from_dict({"input_ids": rows})


def modernbert():
    torch.manual_seed(0)
    config = ModernBertConfig(
        vocab_size=VOCAB + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, embedding_dropout=0.1, mlp_dropout=0.1, attention_dropout=0.1,
        pad_token_id=VOCAB, bos_token_id=VOCAB + 2, eos_token_id=VOCAB + 3, cls_token_id=VOCAB + 2,
        sep_token_id=VOCAB + 3, global_attn_every_n_layers=1,
    )
    return ModernBertForMaskedLM(config)


ARGS = dict(
    per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=3e-3,
    warmup_steps=2, logging_steps=1, eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=3,
    load_best_model_at_end=True, metric_for_best_model="loss", seed=5, report_to="none", disable_tqdm=True,
)


@pytest.mark.parametrize("workers", [0, 2], ids=["main_process", "two_workers"])
def test_random_masking_and_dropout_match_hf(workers, tmp_path, one_thread):
    model, tok = modernbert(), tokenizer()
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.3)
    train, evaluation = blocks(44, seed=1), blocks(16, seed=2)  # 11 micro-batches per epoch: windows 2,2,2,2,2,1
    args = {**ARGS, "dataloader_num_workers": workers}
    # each trainer seeds the RNG when it is built: build and train one, then the other
    hf = transformers.Trainer(
        model=copy.deepcopy(model), args=transformers.TrainingArguments(output_dir=str(tmp_path / "hf"),
                                                                        use_cpu=True, **args),
        train_dataset=train, eval_dataset=evaluation, data_collator=collator, processing_class=tok)
    hf.train()
    ours = hf_lightning.Trainer(
        model=copy.deepcopy(model), args=hf_lightning.TrainingArguments(output_dir=str(tmp_path / "ours"), **args),
        train_dataset=train, eval_dataset=evaluation, data_collator=collator, processing_class=tok,
        lightning_kwargs={"accelerator": "cpu", "logger": False})
    ours.train()

    hf_log = [{k: v for k, v in e.items() if not k.endswith(TIMING)} for e in hf.state.log_history]
    our_log = [{k: v for k, v in e.items() if not k.endswith(TIMING)} for e in ours.state.log_history]
    assert [sorted(e) for e in our_log] == [sorted(e) for e in hf_log]
    for hf_entry, our_entry in zip(hf_log, our_log):
        for key, value in hf_entry.items():
            assert our_entry[key] == pytest.approx(value, rel=2e-5), (hf_entry["step"], key)
    evals = [e["eval_loss"] for e in our_log if "eval_loss" in e]
    assert len(evals) == 4 and len(set(evals)) == 4  # the evaluations differ: masks and dropout are really random
    assert ours.state.best_global_step == hf.state.best_global_step
    assert ours.state.best_model_checkpoint.endswith(hf.state.best_model_checkpoint.rsplit("/", 1)[-1])
    hf_state, our_state = hf.model.state_dict(), ours.model.state_dict()
    for name, tensor in hf_state.items():
        torch.testing.assert_close(our_state[name], tensor, rtol=0, atol=2e-5, msg=name)
