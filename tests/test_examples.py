"""The scripts in examples/, run end to end as a user runs them (real processes, tiny local models, bundled data), each
compared with the SAME script on `transformers.Trainer` (`EXAMPLES_TRAINER=transformers`): the same output files
(results JSON, `trainer_state.json`, model card, checkpoint folders, prediction files) and the same values."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "configs" / "data"
sys.path.insert(0, str(REPO / "examples"))
from _common import make_tiny_model  # noqa: E402

COMMON = ["--do_train", "--do_eval", "--do_predict", "--max_steps", "4", "--save_steps", "2", "--eval_strategy", "steps",
          "--eval_steps", "2", "--logging_steps", "1", "--per_device_train_batch_size", "8",
          "--per_device_eval_batch_size", "8", "--report_to", "none", "--learning_rate", "1e-3", "--seed", "7",
          "--max_train_samples", "32", "--max_eval_samples", "16"]
SCRIPTS = {
    "classification": ("run_classification.py", "classification", 2, [
        "--train_file", DATA / "sentiment_train.csv", "--validation_file", DATA / "sentiment_validation.csv",
        "--test_file", DATA / "sentiment_validation.csv", "--max_predict_samples", "8"]),
    "clm": ("run_clm.py", "causal-lm", 2, [
        "--train_file", DATA / "sentiment_train.csv", "--validation_file", DATA / "sentiment_validation.csv",
        "--test_file", DATA / "sentiment_validation.csv", "--block_size", "32"]),
    "mlm": ("run_mlm.py", "masked-lm", 2, [
        "--train_file", DATA / "sentiment_train.csv", "--validation_file", DATA / "sentiment_validation.csv",
        "--test_file", DATA / "sentiment_validation.csv", "--max_seq_length", "32"]),
    "ner": ("run_ner.py", "token-classification", 4, [
        "--train_file", DATA / "tags_train.jsonl", "--validation_file", DATA / "tags_validation.jsonl",
        "--test_file", DATA / "tags_validation.jsonl", "--text_column_name", "tokens", "--label_column_name", "tags",
        "--max_predict_samples", "8"]),
    "summarization": ("run_summarization.py", "seq2seq", 2, [
        "--train_file", DATA / "reverse_train.jsonl", "--validation_file", DATA / "reverse_validation.jsonl",
        "--test_file", DATA / "reverse_validation.jsonl", "--text_column", "source", "--summary_column", "target",
        "--predict_with_generate", "--val_max_target_length", "12", "--max_predict_samples", "8"]),
    # QuestionAnsweringSeq2SeqTrainer sets `_gen_kwargs` and calls `evaluation_loop` (HF's trainer_seq2seq_qa.py);
    # 13 / 7 samples: a short last batch, where the per-sample eval loss of that loop differs from per-batch
    "seq2seq_qa": ("run_seq2seq_qa.py", "seq2seq", 2, [
        "--train_file", DATA / "squad_train.jsonl", "--validation_file", DATA / "squad_validation.jsonl",
        "--test_file", DATA / "squad_validation.jsonl", "--predict_with_generate", "--max_eval_samples", "13",
        "--max_predict_samples", "7"]),
    # QuestionAnsweringTrainer calls `evaluation_loop` from its `evaluate` / `predict` (HF's trainer_qa.py pattern)
    "qa": ("run_qa.py", "question-answering", 2, [
        "--train_file", DATA / "squad_train.jsonl", "--validation_file", DATA / "squad_validation.jsonl",
        "--test_file", DATA / "squad_validation.jsonl", "--max_predict_samples", "8"]),
}
TIMING = ("_runtime", "_per_second")
# README "Checkpoints and resume": the Lightning loop position, and the manifest of every file's checksum
OURS_ONLY = {"lightning_state.pt", "checkpoint_manifest.json"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {name: make_tiny_model(kind, str(root / name), labels) for name, (_, kind, labels, _) in SCRIPTS.items()}


def run(name: str, model: str, output_dir: Path, oracle: bool = False, extra: list = (), launcher: list = ()):
    script, _, _, data = SCRIPTS[name]
    # each run its own `datasets` cache: a run that loaded the tokenised data from another run's cache never called
    # the tokenizer, whose padding / truncation state its saved `tokenizer.json` then lacks
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_DATASETS_CACHE": str(output_dir.parent / "datasets_cache")}
    env.pop("EXAMPLES_TRAINER", None)
    if oracle:
        env["EXAMPLES_TRAINER"] = "transformers"
    target = [str(REPO / "examples" / script)]
    if oracle and launcher:  # HF leaves its process group to the interpreter's exit: see the wrapper's docstring
        target = [str(REPO / "tests" / "scripts" / "oracle_clean_exit.py"), *target]
    command = [*(launcher or [sys.executable]), *target, "--model_name_or_path", model,
               "--output_dir", str(output_dir), *COMMON, *map(str, data), *map(str, extra)]
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=output_dir.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout + done.stderr


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.name not in OURS_ONLY and ".lock" not in p.name}


def assert_close(ours, hf, where: str, rel: float = 1e-4) -> None:
    if isinstance(hf, dict):
        assert sorted(ours) == sorted(hf), where
        for key in hf:
            if not key.endswith(TIMING):
                assert_close(ours[key], hf[key], f"{where}.{key}", rel)
    elif isinstance(hf, list):
        assert len(ours) == len(hf), where
        for i, (a, b) in enumerate(zip(ours, hf)):
            assert_close(a, b, f"{where}[{i}]", rel)
    elif isinstance(hf, float) and not isinstance(ours, str):
        assert ours == pytest.approx(hf, rel=rel, abs=1e-6), where
    else:
        assert ours == hf, where


def normalised_card(text: str, values: bool = True) -> str:
    """The card with HF's known differences removed (trainer/model_card.py); numbers to 3 digits, or none (`values`)."""
    text = re.sub(r"^- (?:Lightning|hf_lightning) .*\n", "", text, flags=re.M)  # ours names them too
    if not values:  # the losses in the table and the results differ by the oracle's fix
        text = re.sub(r"(\| |: )\d+\.\d+", r"\1N", text)
    return re.sub(r"\d+\.\d+", lambda m: f"{float(m[0]):.3f}", text)


def assert_same_outputs(ours: Path, hf: Path, loss_scale: float = 1.0) -> None:
    """Same files; same JSON content except timings (HF's losses and gradient norms divided by `loss_scale`)."""
    assert tree(ours) == tree(hf)
    for path in sorted(hf.rglob("*.json")):
        relative = path.relative_to(hf)
        if relative.name == "tokenizer.json":  # HF's content (the tokenizer's padding / truncation state too)
            assert (ours / relative).read_bytes() == path.read_bytes(), relative
            continue
        if relative.name in ("config.json", "tokenizer_config.json"):
            continue
        expected = json.loads(path.read_text())
        if loss_scale != 1.0:
            expected = json.loads(re.sub(r'("(?:\w+_)?loss": |"grad_norm": )([\d.e-]+)',
                                         lambda m: f"{m[1]}{float(m[2]) / loss_scale!r}", path.read_text()))
            for prefix, key in (("eval_", "perplexity"), ("predict_", "predict_perplexity")):  # exp(the loss)
                if key in expected:
                    expected[key] = math.exp(expected[f"{prefix}loss"])
        got = json.loads((ours / relative).read_text())
        if relative.name == "trainer_state.json":  # timings in the summary entry
            for entry in [*got["log_history"], *expected["log_history"]]:
                for key in [k for k in entry if k.endswith(TIMING)]:
                    entry.pop(key)
        assert_close(got, expected, str(relative))
    cards = [normalised_card((d / "README.md").read_text(), values=loss_scale == 1.0) for d in (ours, hf)]
    assert cards[0] == cards[1]
    for path in sorted(hf.glob("*.txt")):
        assert (ours / path.name).read_text() == path.read_text(), path.name


@pytest.mark.parametrize("name", [
    "classification",
    "qa",
    pytest.param("clm", marks=pytest.mark.slow),
    pytest.param("ner", marks=pytest.mark.slow),
    pytest.param("summarization", marks=pytest.mark.slow),
    pytest.param("seq2seq_qa", marks=pytest.mark.slow),
])
def test_script_matches_transformers(name, models, tmp_path):
    ours, hf = tmp_path / "ours" / "out", tmp_path / "hf" / "out"  # one name: the model card's title
    log = run(name, models[name], ours)
    run(name, models[name], hf, oracle=True)
    # HF's oracle fixed for GPT-2: transformers 5.23 counts the never-predicted label position 0 of each 32-token
    # block in `num_items_in_batch`, so its losses are 31/32 of the mean (README "Differences": causal-LM token counts)
    assert_same_outputs(ours, hf, loss_scale=31 / 32 if name == "clm" else 1.0)
    assert "***** train metrics *****" in log and "***** eval metrics *****" in log
    assert {"checkpoint-2", "checkpoint-4", "README.md", "all_results.json"} <= {p.name for p in ours.iterdir()}


@pytest.mark.slow
def test_mlm_script_matches_transformers(models, tmp_path):
    ours, hf = tmp_path / "ours" / "out", tmp_path / "hf" / "out"  # one name: the model card's title
    run("mlm", models["mlm"], ours)
    run("mlm", models["mlm"], hf, oracle=True)
    assert tree(ours) == tree(hf)
    assert_same_outputs(ours, hf)


def cut_and_resume(name: str, model: str, folder: Path, oracle: bool = False) -> None:
    """A run cut after checkpoint-2 (as if its process had died after that save), resumed from it."""
    run(name, model, folder, oracle=oracle)
    shutil.rmtree(folder / "checkpoint-4")
    for result in folder.glob("*.json"):
        result.unlink()
    run(name, model, folder, oracle=oracle, extra=["--resume_from_checkpoint", folder / "checkpoint-2"])


@pytest.mark.parametrize("name", [
    "classification",
    *(pytest.param(name, marks=pytest.mark.slow) for name in ("clm", "mlm", "ner", "summarization")),
])
def test_resume_from_checkpoint_continues_the_run(name, models, tmp_path):
    """A run cut after checkpoint-2, resumed by `--resume_from_checkpoint`, ends as the uninterrupted run.

    mlm: as HF's. The masking collator draws the masks of step 3's batch before the save at step 2 (the loader fetches
    one micro-batch ahead), so a resumed run draws them again from the checkpoint's RNG state: transformers.Trainer's
    resumed run differs from its uninterrupted one from step 3 on, and ours is its resumed run."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    if name == "mlm":  # the oracle: HF's run cut and resumed the same way
        cut_and_resume(name, models[name], whole, oracle=True)
    else:
        run(name, models[name], whole)
    cut_and_resume(name, models[name], cut)
    got, expected = (json.loads((d / "trainer_state.json").read_text()) for d in (cut, whole))
    losses = [(e["step"], e.get("loss"), e.get("eval_loss")) for e in got["log_history"] if "train_loss" not in e]
    assert losses == [(e["step"], e.get("loss"), e.get("eval_loss")) for e in expected["log_history"]
                      if "train_loss" not in e]
    assert json.loads((cut / "eval_results.json").read_text())["eval_loss"] == \
        json.loads((whole / "eval_results.json").read_text())["eval_loss"]


def test_rerunning_a_command_into_its_output_dir_resumes_as_hf(models, tmp_path):
    """HF's scripts find the last checkpoint with `get_last_checkpoint` and resume: at the end, nothing to train."""
    for oracle, folder in ((False, tmp_path / "ours" / "out"), (True, tmp_path / "hf" / "out")):
        run("classification", models["classification"], folder, oracle=oracle)
        first = json.loads((folder / "trainer_state.json").read_text())
        run("classification", models["classification"], folder, oracle=oracle)
        again = json.loads((folder / "trainer_state.json").read_text())
        assert again["global_step"] == first["global_step"] == 4
    assert_same_outputs(tmp_path / "ours" / "out", tmp_path / "hf" / "out")


@pytest.mark.distributed
def test_script_under_two_process_ddp_matches_transformers(models, tmp_path):
    """`torchrun --nproc_per_node 2 script.py` (HF's way to run a script on several processes) is one DDP run."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]  # a free port
    ours, hf = tmp_path / "ours" / "out", tmp_path / "hf" / "out"  # one name: the model card's title
    run("classification", models["classification"], ours, extra=["--use_cpu"], launcher=launcher)
    run("classification", models["classification"], hf, oracle=True, extra=["--use_cpu"], launcher=launcher)
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in (ours / "checkpoint-4").iterdir()}
    # HF's oracle fixed: with `average_tokens_across_devices` HF multiplies the loss of a model whose forward takes
    # **kwargs by the number of processes (BERT ignores num_items_in_batch), so every HF loss here is 2x the mean
    # cross-entropy (README "Differences": gradient accumulation is token-correct for every model)
    assert_same_outputs(ours, hf, loss_scale=2.0)
    state = json.loads((ours / "trainer_state.json").read_text())
    assert state["epoch"] == 2.0 and math.isfinite(state["log_history"][-1]["train_loss"])


@pytest.mark.distributed
def test_seq2seq_qa_under_two_process_ddp_matches_transformers(models, tmp_path):
    """HF's run_seq2seq_qa.py shape (a subclass setting `_gen_kwargs` and calling `evaluation_loop` itself) on 2
    processes: eval and test metrics as transformers.Trainer's 2-process run (one torchrun launch per side).

    16 eval / test samples: 2 full batches of 8, one per process. With a short last round accelerate completes a
    process's batch with repeated samples and HF's per-sample eval loss then averages those in (the loss of a batch
    holding duplicates, repeated per kept sample); hf_lightning's shards repeat no sample.

    HF's oracle fixed: T5 ignores `num_items_in_batch`, so HF's 2-process training loss is each process's token mean
    times 2 (`average_tokens_across_devices`), which weights the processes equally instead of by their label tokens
    (README "Differences": gradient accumulation is token-correct for every model); its weights then drift from the
    token-correct run by ~1e-4. `--learning_rate 0` keeps both runs on the same weights, so the evaluations (what this
    test is about) are compared exactly."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    extra = ["--use_cpu", "--max_eval_samples", "16", "--max_predict_samples", "16", "--learning_rate", "0"]
    ours, hf = tmp_path / "ours" / "out", tmp_path / "hf" / "out"
    run("seq2seq_qa", models["seq2seq_qa"], ours, extra=extra, launcher=launcher)
    run("seq2seq_qa", models["seq2seq_qa"], hf, oracle=True, extra=extra, launcher=launcher)
    for name in ("eval_results.json", "predict_results.json"):
        got, expected = (json.loads((d / name).read_text()) for d in (ours, hf))
        assert_close(got, expected, name, rel=1e-6)
    assert json.loads((ours / "eval_results.json").read_text())["eval_samples"] == 16


SFT_ARGS = ["--do_train", "--do_eval", "--max_steps", "4", "--save_steps", "2", "--eval_strategy", "steps",
            "--eval_steps", "2", "--logging_steps", "1", "--per_device_train_batch_size", "8",
            "--per_device_eval_batch_size", "8", "--report_to", "none", "--learning_rate", "1e-3", "--seed", "7",
            "--max_train_samples", "32", "--max_eval_samples", "16", "--max_length", "32", "--use_cpu",
            "--bf16", "False", "--gradient_checkpointing", "False",  # TRL's defaults, off: a CPU fp32 comparison
            "--eos_token", "[SEP]",  # the bundled tokenizer has no EOS token; the tiny model's is [SEP]
            "--train_file", DATA / "sentiment_train.csv", "--validation_file", DATA / "sentiment_validation.csv"]


def run_sft(model: str, output_dir: Path, oracle: bool = False, extra: list = ()) -> str:
    """examples/run_sft.py as a user runs it; `oracle`: the same script with TRL on `transformers.Trainer`."""
    # PYTHONHASHSEED: TRL's model card lists its tags from a set, in string-hash order, which differs per process
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONHASHSEED": "0"}
    env.pop("EXAMPLES_TRAINER", None)
    if oracle:
        env["EXAMPLES_TRAINER"] = "transformers"
    command = [sys.executable, str(REPO / "examples" / "run_sft.py"), "--model_name_or_path", model,
               "--output_dir", str(output_dir), *map(str, SFT_ARGS), *map(str, extra)]
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=output_dir.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout + done.stderr


def test_sft_script_runs_trl_on_hf_lightning_as_on_transformers(models, tmp_path):
    """run_sft.py: TRL's `SFTTrainer` built on hf_lightning by its one line writes what the same script writes with
    TRL on `transformers.Trainer` (results JSON, trainer_state.json, checkpoints, TRL's model card), same values."""
    # a Llama: transformers 5.24 counts the label tokens of a GPT-2 built from a config one per row too many, which
    # TRL's loss divides by (README "Differences": causal-LM token counts); for a Llama both count the same
    model = make_tiny_model("llama", str(tmp_path / "llama"))
    ours, hf = tmp_path / "ours" / "out", tmp_path / "hf" / "out"  # one name: the model card's title
    log = run_sft(model, ours)
    run_sft(model, hf, oracle=True)
    assert_same_outputs(ours, hf)
    assert "***** train metrics *****" in log and "***** eval metrics *****" in log
    assert {"checkpoint-2", "checkpoint-4", "README.md", "eval_results.json"} <= {p.name for p in ours.iterdir()}
    state = json.loads((ours / "trainer_state.json").read_text())
    assert any("mean_token_accuracy" in e for e in state["log_history"])  # TRL's own metrics, logged by its `log`


def test_sft_script_refuses_do_predict(models, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "run_sft.py"), "--model_name_or_path",
                           models["clm"], "--output_dir", str(tmp_path / "out"), "--do_predict"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode != 0 and "run_sft.py does not predict" in done.stderr


def test_the_readme_classification_command_learns(tmp_path):
    """The README's `run_classification.py` command, as written: its last evaluation beats the majority class of the
    validation data (with HF's default learning rate the tiny random model ended on the majority class, 0.578)."""
    import csv

    readme = (REPO / "README.md").read_text()
    command = re.search(r"^python examples/run_classification\.py(?:.*\\\n)*.*$", readme, flags=re.M)[0]
    command = re.sub(r"\s*#[^\n]*", "", command.replace("\\\n", " "))
    work = tmp_path / "repo"
    shutil.copytree(REPO / "examples", work / "examples")
    shutil.copytree(DATA, work / "configs" / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("EXAMPLES_TRAINER", None)
    for line in ("python examples/_common.py classification out/tiny-bert", command):
        done = subprocess.run(line.replace("python ", f"{sys.executable} ", 1), shell=True, cwd=work, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(DATA / "sentiment_validation.csv") as f:
        labels = [row["label"] for row in csv.DictReader(f)]
    majority = max(labels.count(v) for v in set(labels)) / len(labels)
    accuracy = json.loads((work / "out" / "classification" / "eval_results.json").read_text())["eval_accuracy"]
    assert accuracy > majority + 0.1, (accuracy, majority)
