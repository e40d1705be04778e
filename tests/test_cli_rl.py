"""`task: dpo` and `task: grpo`: the CLI runs TRL's DPOTrainer and GRPOTrainer from a config (cli/library_config.py,
cli/library_run.py), GRPO with the reward functions the config names (tasks/rewards.py: built-in names, or dotted
paths under `allow_code_from`; never a file).

The fast tests check the built-in rewards and the config mistakes that end before torch is imported (a small process
reports whether torch was imported). The slow test trains the shipped configs/dpo.yaml and configs/grpo.yaml as they
are and evaluates the saved models with `validate`: DPO's preference accuracy and GRPO's reward rise from their values
before any update (`eval_on_start`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_cli_library import _cli, _done, _probe

from hf_lightning.tasks.rewards import BUILT_IN, distinct_words, prompt_words, reward_entry_problem


def test_built_in_rewards_score_each_completion():
    prompts = ["film plot cast", "music acting", "movie"]
    completions = ["cast plot film", "acting great great", ""]
    assert prompt_words(prompts, completions) == [1.0, 1 / 3, 0.0]
    assert distinct_words(prompts, completions) == [1.0, 2 / 3, 0.0]
    conversation = [[{"role": "assistant", "content": "film film"}]]  # a conversational completion: its last message
    assert prompt_words([[{"role": "user", "content": "film"}]], conversation) == [1.0]
    assert distinct_words(["x"], conversation) == [0.5]
    assert set(BUILT_IN) == {"prompt_words", "distinct_words"}


@pytest.mark.parametrize(("entry", "expected"), [
    ("prompt_words", None),
    ("my_rewards.score", None),  # a dotted path: allowed or not by allow_code_from (checked by the caller)
    ("./reward_model", "looks like a reward model"),
    ("org/reward-model", "looks like a reward model"),
    ("lenght", "is not a built-in reward function (distinct_words, prompt_words) nor a dotted path"),
    (3, "a reward function's name"),
])
def test_a_reward_entry_is_a_built_in_name_or_a_dotted_path(entry, expected):
    problem = reward_entry_problem("reward_funcs[0]", entry)
    assert problem is None if expected is None else expected in problem


@pytest.mark.parametrize(("argv", "expected"), [
    (["--reward_funcs", "null"], "trainer_class='trl.GRPOTrainer' learns from rewards: set reward_funcs"),
    (["--reward_funcs", "[os.system]"], "reward_funcs[0]='os.system': a config only imports code from"),
    (["--reward_funcs", "[my_rewards.score]"], "add 'my_rewards' to allow_code_from"),
    (["--reward_funcs", "[hf_lightning.tasks.rewards.prompt_words]"], "is a function"),
    (["--reward_funcs", "[configs/reward_model]"], "looks like a reward model"),
], ids=["none", "stdlib", "not_allowed", "library_function", "folder"])
def test_grpo_reward_mistakes_are_one_error_line_before_torch_is_imported(argv, expected, tmp_path):
    """A reward function is code the run calls: a config names a built-in one, or a dotted path its allow_code_from
    lists (the standard library never); a file or folder never runs. Refused before torch or trl is imported."""
    line, torch_imported, trl_imported = _probe(tmp_path, "fit", "--config", "configs/grpo.yaml",
                                                "--args.output_dir", str(tmp_path / "out"), *argv)
    assert expected in line, line
    assert not torch_imported and not trl_imported
    assert not (tmp_path / "out").exists()


def test_task_dpo_and_grpo_are_the_short_forms_of_trls_classes(tmp_path):
    printed = yaml.safe_load(_done(_cli("fit", "--config", "configs/grpo.yaml", "--print_config"))[1])
    assert printed["trainer_class"] == "trl.GRPOTrainer" and printed["args_class"] == "trl.GRPOConfig"
    assert printed["reward_funcs"] == ["prompt_words"] and printed["args"]["num_generations"] == 8


def test_grpo_with_a_config_built_model_and_a_kl_term_is_one_error_line(tmp_path):
    """TRL's GRPO loads its reference model (beta > 0) from the policy's path, which a config_class model lacks: one
    line saying what to set, instead of TRL's failure to load an empty path."""
    line, _, _ = _probe(tmp_path, "fit", "--config", "configs/grpo.yaml", "--args.output_dir", str(tmp_path / "out"),
                        "--args.beta", "0.1")
    assert "args.beta=0.1 needs a reference model" in line and "set args.beta: 0.0" in line, line


def _evaluations(out: Path, key: str) -> list[tuple[int, float]]:
    log = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [(entry["step"], entry[key]) for entry in log if key in entry]


def test_the_shipped_dpo_and_grpo_configs_learn_and_validate(tmp_path):
    """configs/dpo.yaml and configs/grpo.yaml as shipped (both fits side by side, then both validates): DPO's eval
    preference accuracy goes from 0 (before any update the policy is its reference: every reward is 0) to above 0.75;
    GRPO's eval reward (the share of completion words taken from the prompt) at least doubles. `validate` of each
    saved model writes eval_results.json."""
    dpo, grpo = tmp_path / "dpo", tmp_path / "grpo"
    fits = [_cli("fit", "--config", f"configs/{name}.yaml", "--args.output_dir", out, "--args.disable_tqdm", "true")
            for name, out in (("dpo", dpo), ("grpo", grpo))]
    for process in fits:
        code, printed, err = _done(process, timeout=900)
        assert code == 0, printed[-3000:] + err[-5000:]
    accuracy = _evaluations(dpo, "eval_rewards/accuracies")
    assert [step for step, _ in accuracy] == [0, 32, 64]
    assert accuracy[0][1] == 0.0 and accuracy[-1][1] > 0.75, accuracy
    reward = _evaluations(grpo, "eval_reward")
    assert [step for step, _ in reward] == [0, 20, 40, 60]
    assert reward[-1][1] > 2 * reward[0][1], reward
    validates = [_cli("validate", "--config", f"configs/{name}.yaml", "--model.model_name_or_path", out,
                      "--args.output_dir", tmp_path / f"{name}_eval", "--args.disable_tqdm", "true")
                 for name, out in (("dpo", dpo), ("grpo", grpo))]
    for process, name in zip(validates, ("dpo", "grpo")):
        code, printed, err = _done(process, timeout=900)
        assert code == 0, printed[-3000:] + err[-5000:]
        metrics = json.loads((tmp_path / f"{name}_eval" / "eval_results.json").read_text())
        assert "eval_loss" in metrics and metrics["eval_samples"] in (128, 32), metrics
    # GRPO's validate generates from the trained policy: its reward is the trained one's, not the initial one's
    grpo_eval = json.loads((tmp_path / "grpo_eval" / "eval_results.json").read_text())
    assert grpo_eval["eval_reward"] > 2 * reward[0][1], grpo_eval
