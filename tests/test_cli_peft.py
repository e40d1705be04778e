"""The CLI's `peft:` section: LoRA on the causal-LM and classification configs, resume, validate a PEFT checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hf_lightning.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI.s args parameter")

REPO = Path(__file__).resolve().parents[1]
FAST = ["--args.max_steps", "4", "--args.logging_steps", "1", "--data.max_train_samples", "48",
        "--data.max_eval_samples", "24", "--trainer.enable_progress_bar", "false", "--args.save_strategy", "steps",
        "--args.save_steps", "2", "--args.eval_strategy", "steps", "--args.eval_steps", "2",
        "--args.load_best_model_at_end", "false", "--args.save_total_limit", "null", "--args.report_to", "none"]
LORA = {"causal_lm.yaml": '{r: 4, lora_alpha: 8, target_modules: [c_attn]}',
        "text_classification.yaml": '{r: 4, lora_alpha: 8, target_modules: [query, value]}'}


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def last_json(printed: str) -> dict:
    return json.loads([line for line in printed.splitlines() if line.startswith("{")][-1])


@pytest.mark.parametrize("config", sorted(LORA))
def test_lora_fit_resume_and_validate_from_the_command_line(config, tmp_path, in_repo, one_thread, capsys):
    def fit(out: Path, *extra: str) -> dict:
        main(["fit", "--config", f"configs/{config}", "--args.output_dir", str(out), *FAST, "--peft", LORA[config],
              *extra])
        return json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())

    full = fit(tmp_path / "full")
    capsys.readouterr()
    checkpoint = tmp_path / "full" / "checkpoint-4"
    saved = load_file(str(checkpoint / "adapter_model.safetensors"))
    assert saved and not (checkpoint / "model.safetensors").exists()
    if config == "text_classification.yaml":  # SEQ_CLS from the task: the head is trained and saved too
        assert any("classifier" in key for key in saved)
    assert (tmp_path / "full" / "adapter_model.safetensors").is_file()  # the final save_model writes the adapter

    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-2", resumed_dir / "checkpoint-2")
    resumed = fit(resumed_dir, "--ckpt_path", str(resumed_dir / "checkpoint-2"))

    def history(state: dict) -> list[dict]:
        return [{k: v for k, v in e.items() if "runtime" not in k and "per_second" not in k}
                for e in state["log_history"]]

    assert history(resumed) == history(full)

    # validate the PEFT checkpoint: the base model from `model:` (seeded as in training), the adapter from the folder
    capsys.readouterr()
    main(["validate", "--config", f"configs/{config}", "--args.output_dir", str(tmp_path / "val"), *FAST,
          "--ckpt_path", str(checkpoint)])
    metrics = last_json(capsys.readouterr().out)
    trained = [e for e in full["log_history"] if "eval_loss" in e and e["step"] == 4][-1]
    assert metrics["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-6)


def test_a_bad_peft_key_is_one_line(tmp_path, in_repo, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "configs/causal_lm.yaml", "--args.output_dir", str(tmp_path), "--peft",
              "{rank: 4}"])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1 and "peft: unknown LoraConfig key(s) rank; allowed:" in err[0], err
