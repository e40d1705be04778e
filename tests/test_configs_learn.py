"""Every shipped config learns its task visibly: trained as shipped, its final metric beats a trivial baseline.

Each config runs `hf-lightning fit` exactly as shipped (only the output folder and the progress bar differ), then the
last evaluation of the run is compared with a baseline computed from the bundled data:

- classification (sentence, pair, tokens): the majority class's accuracy on the validation split; the model must
  close a quarter of the gap to 1.0 (and gain at least 0.1);
- causal / masked LM: the unigram model's cross-entropy (train-split token frequencies, add-one smoothing) on the
  validation tokens; the model's `eval_loss` must be lower by at least 0.3 nats;
- generation (encoder-decoder and decoder-only): exact match of copying the source (the task reverses it); the model
  must beat it by 0.2.

`text_pair_classification.yaml` once stayed at 0.453 accuracy (a constant prediction, below the 0.547 majority):
this test would have caught it. All seven take about 35 s on an idle 2-core machine (one thread each).
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import yaml

from hf_lightning.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI.s args parameter")

REPO = Path(__file__).resolve().parents[1]
# configs/sft.yaml, dpo.yaml and grpo.yaml run library trainers (TRL) through `use_as_transformers_trainer()`, a
# process-wide swap: they are run in their own processes, and their learning checked, by tests/test_cli_library.py
# and tests/test_cli_rl.py
LIBRARY_CONFIGS = {"sft.yaml", "dpo.yaml", "grpo.yaml"}
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.yaml") if p.name not in LIBRARY_CONFIGS)


def _config(name: str) -> dict:
    return yaml.safe_load((REPO / "configs" / name).read_text())


def _rows(path: str) -> list[dict]:
    file = REPO / path
    if file.suffix == ".csv":
        with open(file, newline="") as f:
            return list(csv.DictReader(f))
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def _majority(values: list) -> float:
    return Counter(values).most_common(1)[0][1] / len(values)


def _tokens(data: dict, split: str, skip_special: bool) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(REPO / data["tokenizer_file"]))
    texts = [row[data["text_column"]] for row in _rows(data[f"{split}_file"])]
    special = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(t)
                                               for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]")}
    ids = [i for row in tokenizer(texts)["input_ids"] for i in row]
    return [i for i in ids if i not in special] if skip_special else ids


def _unigram_cross_entropy(data: dict, skip_special: bool) -> float:
    counts = Counter(_tokens(data, "train", skip_special))
    vocab = len(json.loads((REPO / data["tokenizer_file"]).read_text())["model"]["vocab"])
    total = sum(counts.values()) + vocab
    validation = _tokens(data, "validation", skip_special)
    return -sum(math.log((counts[i] + 1) / total) for i in validation) / len(validation)


def baseline(name: str) -> tuple[str, float, str]:
    """`(metric, baseline value, "higher" | "lower")` for config `name`, from its bundled data."""
    config = _config(name)
    task, data = config["task"], config["data"]
    if task == "text_classification":
        return "eval_accuracy", _majority([r[data["label_column"]] for r in _rows(data["validation_file"])]), "higher"
    if task == "token_classification":
        tags = [t for r in _rows(data["validation_file"]) for t in r[data["label_column"]]]
        return "eval_accuracy", _majority(tags), "higher"
    if task in ("causal_lm", "masked_lm"):  # masked LM: special tokens are never masked, so never predicted
        return "eval_loss", _unigram_cross_entropy(data, skip_special=task == "masked_lm"), "lower"
    rows = _rows(data["validation_file"])
    copies = [r[data["text_column"]] == r[data["target_column"]] for r in rows]
    return "eval_exact_match", sum(copies) / len(copies), "higher"


def test_baselines_are_what_they_claim():
    """The baselines are not degenerate: classes are balanced-ish, the unigram LM is far from uniform."""
    metric, value, _ = baseline("text_pair_classification.yaml")
    assert metric == "eval_accuracy" and 0.45 < value < 0.6
    assert baseline("token_classification.yaml")[1] > 0.7  # most words are tagged O
    assert baseline("causal_lm.yaml")[1] < math.log(130)  # better than uniform over the vocabulary
    assert baseline("seq2seq.yaml")[1] < 0.05  # copying the source is almost never the reversal


@pytest.mark.parametrize("name", CONFIGS)
def test_config_learns(name, tmp_path, monkeypatch, one_thread, capsys):
    monkeypatch.chdir(REPO)  # configs name their data relative to the repository root
    out = tmp_path / "out"
    main(["fit", "--config", f"configs/{name}", "--args.output_dir", str(out),
          "--trainer.enable_progress_bar", "false"])
    capsys.readouterr()
    state = json.loads(sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
                       .joinpath("trainer_state.json").read_text())
    metric, value, direction = baseline(name)
    final = [e[metric] for e in state["log_history"] if metric in e][-1]
    if direction == "higher":
        needed = value + max(0.1, 0.25 * (1 - value)) if metric == "eval_accuracy" else value + 0.2
        assert final >= needed, f"{name}: {metric} {final:.3f}, baseline {value:.3f}, needed {needed:.3f}"
    else:
        assert final <= value - 0.3, f"{name}: {metric} {final:.3f}, unigram baseline {value:.3f}"
