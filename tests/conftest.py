"""Shared pytest fixtures, and the test tiers.

Every test gets one tier marker from its file (`TIERS`), plus `distributed` / `slow` where it applies:

- `unit`: one module or rule in isolation (pure functions, one callback, one Lightning internal), no full run.
- `parity`: the same run through hf_lightning and through the real `transformers.Trainer` (the oracle), or a pure
  rule against HF's own implementation of it.
- `e2e`: whole runs through the public entry points (facade, CLI, notebooks, quickstart, resume, checkpoints).
- `distributed`: spawns 2 real processes (gloo on CPU); a test is marked by `DISTRIBUTED` or by its decorator. These
  tests are one xdist scope (`PROCESSES_GROUP`): under `--dist loadgroup` one worker runs them one after another. A
  new multi-process scenario joins an existing launch where one fits (`ddp_train_runs` below, checkpoint_train.py
  `many`): a launch's start-up (2 interpreters importing torch, transformers and Lightning) costs more than a tiny run.
- `slow`: the long end-to-end runs (notebooks, quickstart, processes killed mid-save, the heaviest script and fault
  runs), by `SLOW`. What is neither slow nor distributed is the fast tier; aim for under 3 minutes on 2 idle
  cores with `-n 2` (pytest-xdist; 7 min 27 s measured with 1,395 tests): a new test that takes more than a few seconds goes to `SLOW` when a quicker test of
  the same behaviour stays in the fast tier.
- `gpu`: needs a CUDA device (skipped without one).

How to run (README "Tests"):

    python -m pytest -q -n 2 --dist loadgroup --durations=25    # everything (what .ci/run runs)
    python -m pytest -m "not slow and not distributed" -n 2 -q  # the fast tier (about 4 min on 2 idle cores)
    python -m pytest -m unit -q                                # one tier
    python -m pytest -m slow -q                                # only the long runs

A test file missing from `TIERS` is run as `e2e`; add new files to `TIERS`.

Warnings: the suite ignores `hf_lightning.run_options.threads.ThreadOversubscriptionWarning` (pyproject.toml `filterwarnings`).
It tells a user that torch has more threads than the machine has free cores, which on a loaded test machine is true
of nearly every fit, so it would fill the warnings summary with noise no test is about. Users still see it (nothing
in the library changes); tests/test_threads.py records it explicitly (`warnings.catch_warnings(record=True)` with
`simplefilter("always")`, which overrides this filter) to check when it fires and when it does not.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Every child process a test starts (library scripts, examples, torchrun) imports this checkout's hf_lightning first,
# whether or not it is installed, and whichever checkout an installed copy points at.
_REPO = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join([_REPO, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and p != _REPO)])

TIERS = {
    "test_args.py": "unit",
    "test_args_hf_fields.py": "parity",
    "test_hf_trainer_on_our_args.py": "parity",
    "test_accelerator_config.py": "parity",
    "test_dispatch_batches.py": "parity",
    "test_as_transformers.py": "unit",
    "test_args_types.py": "parity",
    "test_callback_contract.py": "unit",
    "test_citations.py": "unit",
    "test_help_cache.py": "unit",
    "test_layering.py": "unit",
    "test_memory_plan.py": "e2e",
    "test_lockstep.py": "unit",
    "test_lightning_compat.py": "unit",
    "test_public_api.py": "unit",
    "test_text_metrics.py": "unit",
    "test_test_hygiene.py": "unit",
    "test_units.py": "unit",
    "test_where_things_live.py": "unit",
    "test_best_metric_check.py": "parity",
    "test_activation_checkpointing.py": "parity",
    "test_callback_events.py": "parity",
    "test_checkpoint_rotation.py": "parity",
    "test_compile.py": "parity",
    "test_data.py": "parity",
    "test_strategies.py": "parity",
    "test_deepspeed_config.py": "parity",
    "test_deepspeed_cpu.py": "e2e",
    "test_fsdp1.py": "parity",
    "test_multinode.py": "distributed",
    "test_gpu_check.py": "e2e",
    "test_early_stopping.py": "parity",
    "test_examples.py": "parity",
    "test_eval_loop.py": "parity",
    "test_eval_parity.py": "parity",
    "test_flow.py": "parity",
    "test_hf_console.py": "parity",
    "test_hf_small_behaviours.py": "parity",
    "test_grad_accumulation.py": "parity",
    "test_hp_search.py": "parity",
    "test_fp16_on_cpu.py": "parity",
    "test_fsdp2_precision.py": "parity",
    "test_length_grouping.py": "parity",
    "test_module.py": "parity",
    "test_numerics.py": "parity",
    "test_optim.py": "parity",
    "test_process_layout.py": "parity",
    "test_overrides.py": "parity",
    "test_overrides_loop_parity.py": "parity",
    "test_overrides_parity.py": "parity",
    "test_private_hooks.py": "parity",
    "test_sentence_transformers.py": "parity",
    "test_trl_parity.py": "parity",
    "test_trl_grpo.py": "parity",
    "test_hf_built_optimizers.py": "parity",
    "test_trl_preference.py": "parity",
    "test_resume_hf_interchange.py": "parity",
    "test_resume_changed_settings.py": "parity",
    "test_rng_order_parity.py": "parity",
    "test_padding_free.py": "parity",
    "test_neftune.py": "parity",
    "test_peft.py": "parity",
    "test_frozen_layers.py": "parity",
    "test_run_options.py": "parity",
    "test_schedule_parity.py": "parity",
    "test_plan.py": "parity",
    "test_script_api.py": "parity",
    "test_seq2seq_parity.py": "parity",
    "test_seq2seq_eval_loss.py": "parity",
    "test_tensorboard.py": "parity",
    "test_tokens_seen.py": "parity",
    "test_throughput.py": "e2e",
    "test_train_parity.py": "parity",
    "test_async_save.py": "e2e",
    "test_trainer_attributes.py": "parity",
    "test_checkpoint.py": "e2e",
    "test_checkpoint_processes.py": "e2e",
    "test_checkpoint_trust.py": "e2e",
    "test_untrusted_files.py": "unit",
    "test_cli.py": "e2e",
    "test_cli_checks.py": "e2e",
    "test_config_code.py": "e2e",
    "test_bad_rows.py": "e2e",
    "test_configs_learn.py": "e2e",
    "test_console_output.py": "e2e",
    "test_cli_peft.py": "e2e",
    "test_cli_library.py": "e2e",
    "test_cli_rl.py": "e2e",
    "test_trl_extra.py": "e2e",
    "test_bench_smoke.py": "e2e",
    "test_evaluation.py": "e2e",
    "test_faults.py": "e2e",
    "test_final_save.py": "e2e",
    "test_generation_decoder_only.py": "e2e",
    "test_gpu.py": "e2e",
    "test_gpu_uneven_eval.py": "e2e",
    "test_notebook_generation.py": "e2e",
    "test_notebooks.py": "e2e",
    "test_permissions.py": "e2e",
    "test_preemption.py": "e2e",
    "test_pretrained_source.py": "e2e",
    "test_quickstart.py": "e2e",
    "test_readme.py": "e2e",
    "test_readme_examples.py": "e2e",
    "test_report_to.py": "e2e",
    "test_resume.py": "e2e",
    "test_resume_edges.py": "e2e",
    "test_resume_startup.py": "e2e",
    "test_same_run.py": "parity",
    "test_hf_args_parity.py": "parity",
    "test_seq2seq_behaviour.py": "e2e",
    "test_stream_resume.py": "e2e",
    "test_streaming_metrics.py": "e2e",
    "test_threads.py": "e2e",
    "test_ddp.py": "distributed",
    "test_eval_loop_ddp.py": "distributed",
    "test_ddp_loss_scale.py": "distributed",
    "test_evaluation_ddp.py": "distributed",
    "test_generation_ddp.py": "distributed",
    "test_stream_resume_ddp.py": "distributed",
    "test_tokens_seen_ddp.py": "distributed",
    "test_sharded_eval.py": "distributed",
    "test_sharded_twins.py": "distributed",
    "test_resume_elastic.py": "distributed",
    "test_elastic_rules.py": "unit",
    "test_auto_micro_batch.py": "parity",
    "test_auto_micro_batch_ddp.py": "distributed",
}
"""The tier of each test file."""

DISTRIBUTED = {
    "test_ddp.py", "test_eval_loop_ddp.py", "test_ddp_loss_scale.py",
    "test_evaluation_ddp.py", "test_generation_ddp.py", "test_stream_resume_ddp.py",
    "test_tokens_seen_ddp.py", "test_sharded_eval.py", "test_sharded_twins.py", "test_resume_elastic.py",
    "test_auto_micro_batch_ddp.py",
    "test_dispatch_batches.py::test_each_process_gets_accelerates_dispatched_batches",
    "test_dispatch_batches.py::test_training_on_dispatched_batches_is_hfs",
    "test_checkpoint_processes.py::test_two_process_save_and_exact_resume",
    "test_checkpoint_processes.py::test_a_nan_in_one_ranks_shard_stops_every_rank_before_the_save",
    "test_async_save.py::test_save_async_is_refused_under_fsdp2_before_training",
    "test_faults.py::test_under_ddp_a_busy_output_dir_stops_every_rank",
    "test_cli.py::test_ddp_fit_from_the_command_line",
    "test_bad_rows.py::test_under_ddp_every_process_stops_with_one_line",
    "test_final_save.py::test_cli_fit_saves_the_gathered_model_under_fsdp2",
    "test_readme_examples.py::test_bash_blocks_run_in_order_with_few_updates",  # the README's DDP line
    "test_readme_examples.py::test_bash_blocks_run_exactly_as_written",
    "test_length_grouping.py::test_two_processes_train_on_their_shards_of_the_grouped_order",
    "test_preemption.py::test_two_processes_stop_together_and_resume_exactly",
    "test_preemption.py::test_two_processes_at_random_instants_many",
    # each starts 1 or 2 processes (~10 s each): the fast tier keeps the SIGTERM, TrainingPreempted, no-save and
    # Ctrl-C tests of tests/test_preemption.py
    "test_preemption.py::test_sigkill_during_the_preemption_save_leaves_only_complete_checkpoints",
    "test_preemption.py::test_a_failing_preemption_save_raises_its_error",
    "test_preemption.py::test_no_second_save_when_the_update_saved_its_own_step",
    "test_preemption.py::test_cli_sigterm_ends_with_143_and_the_printed_ckpt_path_resumes",
    "test_preemption.py::test_cli_ctrl_c_ends_with_130_and_one_line",
    "test_preemption.py::test_sigterm_during_evaluate_ends_with_143_not_0",
    "test_preemption.py::test_under_slurm_auto_requeue_the_requeue_signal_requeues_after_the_checkpoint",
    "test_fsdp1.py::test_fsdp1_trains_like_ddp_on_cpu_processes",
    "test_fsdp1.py::test_fsdp1_checkpoints_and_resumes_exactly_on_cpu_processes",
    "test_cli_library.py::test_sft_config_under_torchrun_equals_run_sft_on_two_hf_processes",
    "test_examples.py::test_script_under_two_process_ddp_matches_transformers",
    "test_examples.py::test_seq2seq_qa_under_two_process_ddp_matches_transformers",
    "test_process_layout.py::test_main_process_first_is_a_barrier_under_torchrun",
    "test_process_layout.py::test_main_process_first_with_lightnings_own_launcher",
    "test_sentence_transformers.py::test_two_processes_do_the_math_of_one",
    "test_trl_parity.py::test_sft_on_two_processes_equals_hfs_two_processes",
    "test_trl_grpo.py::test_grpo_on_two_processes_equals_trl_on_transformers_two_processes",
    "test_trl_preference.py::test_trl_preference_trainers_on_two_processes_equal_them_on_transformers_two_processes",
}
"""Files, or `file::test` names, whose tests spawn 2 processes."""

SLOW = {
    "test_notebooks.py", "test_notebook_generation.py", "test_quickstart.py",
    "test_checkpoint_processes.py::test_sigkill_mid_save_leaves_no_valid_looking_folder_and_loses_nothing",
    "test_faults.py::test_sigkill_during_saves_and_rotations_many",
    "test_faults.py::test_two_runs_started_together_never_mix",
    "test_readme_examples.py::test_bash_blocks_run_exactly_as_written",
    "test_compile.py::test_the_default_inductor_backend_trains_like_eager",
    "test_trl_preference.py::test_trl_preference_trainers_on_two_processes_equal_them_on_transformers_two_processes",
    "test_preemption.py::test_two_processes_at_random_instants_many",
    "test_trl_grpo.py::test_grpo_on_two_processes_equals_trl_on_transformers_two_processes",
    # every bench/ script at tiny sizes (fresh processes of its own for several; a cold torch.compile)
    "test_bench_smoke.py::test_every_bench_script_runs_every_runner_at_tiny_sizes",
    # the heaviest single-process runs (5 to 27 s each on an idle 2-core machine), kept out of the fast tier: each
    # behaviour they cover has a quicker test there (locks, faults, example parity, README python blocks, CLI configs)
    "test_configs_learn.py",
    "test_faults.py::test_sigkill_during_saves_and_rotations_short",
    "test_faults.py::test_a_second_run_on_a_busy_output_dir_is_refused_naming_the_first",
    "test_examples.py::test_rerunning_a_command_into_its_output_dir_resumes_as_hf",
    "test_examples.py::test_resume_from_checkpoint_continues_the_run",
    "test_examples.py::test_the_readme_classification_command_learns",
    "test_readme_examples.py::test_python_blocks_run_as_written",
    "test_gpu.py::test_the_best_model_flow_of_the_gpu_harness_runs_on_the_cpu",
    # two more sentence-transformers processes (~10 s each); tests/test_private_hooks.py keeps `_load_best_model`
    "test_sentence_transformers.py::test_load_best_model_at_end_loads_the_best_checkpoint_as_hf",
    # the memory plan against the profiler for BERT and T5 (~5-15 s each); GPT-2's stays in the fast tier
    "test_memory_plan.py::test_plan_is_within_15_percent_of_the_profiled_peak_bert_t5",
    # runs of HF's Trainer and ours under HF's memory tracker, whose peak-memory thread polls without pause
    # (~10 s together); the other tests of the file check the settings in about 5 s
    "test_accelerator_config.py::test_memory_metrics_are_hfs",
    # two 2-process torchrun launches of the T5 QA script (HF's and ours)
    "test_examples.py::test_seq2seq_qa_under_two_process_ddp_matches_transformers",
    # configs/dpo.yaml and configs/grpo.yaml as shipped, fit then validate (4 CLI processes, 2 at a time)
    "test_cli_rl.py::test_the_shipped_dpo_and_grpo_configs_learn_and_validate",
}
"""Files, or `file::test` names, of the long end-to-end runs."""


PROCESSES_GROUP = "processes"
"""The xdist scope of the multi-process tests: under `-n 2 --dist loadgroup` they all run on one worker, in order,
while the other worker runs the single-process tests (`pytest_xdist_make_scheduler` below)."""


def _in(file: str, test: str, names: set[str]) -> bool:
    return file in names or f"{file}::{test}" in names


def _matches(item: pytest.Item, names: set[str]) -> bool:
    return _in(Path(str(item.fspath)).name, item.originalname, names)  # type: ignore[attr-defined]


def runs_processes(nodeid: str) -> bool:
    """Whether the test `nodeid` starts several processes (by its file's tier or `DISTRIBUTED`): what xdist's
    controller, which sees node ids only, schedules onto one worker."""
    parts = nodeid.split("::")
    file, test = Path(parts[0]).name, parts[-1].split("[")[0]
    return TIERS.get(file) == "distributed" or _in(file, test, DISTRIBUTED)


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 - xdist's scheduler type is private
    """`--dist loadgroup`: every multi-process test in one scope, run one after another on one worker.

    xdist's own loadgroup reads `xdist_group` markers by rewriting node ids, which pytest 9.2 no longer lets it do
    (`Node.nodeid` is derived from a structured id), so every test ran on whichever worker was free: two 2-process
    launches at once put 4 processes on CI's 2 cores. The rule is applied here, in the controller, instead."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ProcessesOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return PROCESSES_GROUP if runs_processes(nodeid) else nodeid

    return ProcessesOnOneWorker(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (by file), `distributed` and `slow` (see the module docstring)."""
    for item in items:
        tier = TIERS.get(Path(str(item.fspath)).name, "e2e")
        item.add_marker(getattr(pytest.mark, tier))
        if _matches(item, DISTRIBUTED) and tier != "distributed":
            item.add_marker(pytest.mark.distributed)
        if item.get_closest_marker("distributed") is not None and not runs_processes(item.nodeid):
            # the xdist scheduler sees node ids only (`runs_processes`): a test marked by its decorator alone must be
            # named in DISTRIBUTED too, or it would run beside another multi-process test
            raise pytest.UsageError(f"{item.nodeid} is marked distributed: add it to DISTRIBUTED in tests/conftest.py")
        if _matches(item, SLOW):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.fixture(autouse=True, scope="session")
def _help_cache(tmp_path_factory):
    """`hf-lightning <subcommand> --help` texts are kept in a folder of this session, not the user's cache."""
    import os

    previous = os.environ.get("HF_LIGHTNING_CACHE")
    os.environ["HF_LIGHTNING_CACHE"] = str(tmp_path_factory.mktemp("hf_lightning_cache"))
    yield
    if previous is None:
        del os.environ["HF_LIGHTNING_CACHE"]
    else:
        os.environ["HF_LIGHTNING_CACHE"] = previous


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread is faster, and much faster on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def ddp_train_runs(tmp_path_factory) -> dict[str, dict]:
    """tests/scripts/ddp_train.py on 2 processes in every mode the distributed tests read (test_ddp.py,
    test_tokens_seen_ddp.py), in ONE launch: the processes' start-up and imports are paid once. `hf-ddp` runs first,
    since the process group is created by the first run (with its `ddp_timeout`). Returns mode -> the run's JSON."""
    import json
    import subprocess
    import sys

    modes = ["hf-ddp", "ddp", "hf-fsdp2", "tokens", "split"]
    out = tmp_path_factory.mktemp("ddp_train") / "out.json"
    script = Path(__file__).parent / "scripts" / "ddp_train.py"
    done = subprocess.run([sys.executable, str(script), str(out), "2", "4", ",".join(modes)], cwd=out.parent,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return {mode: json.loads((out.parent / f"out-{mode}.json").read_text()) for mode in modes}


_SESSION_ENVIRON = dict(os.environ)
"""The environment this pytest process started with (after this file set PYTHONPATH)."""

_PROCESS_GROUP_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
                            "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")
"""What Lightning's launcher and strategies write into `os.environ` when a run in THIS process sets up a process
group (a 1-device FSDP2 run, `devices=2` from the pytest process)."""


@pytest.fixture(autouse=True)
def _process_state_restored():
    """Each test leaves this process as it found it: no process group, no launcher variables, no other environment
    change. Why: a run in the pytest process that set up a process group (FSDP2 on 1 device does) left it, and
    Lightning's MASTER_PORT / WORLD_SIZE / LOCAL_RANK, behind; every later test of the same process (one xdist
    worker) then saw a distributed run: HF's Trainer in-process turned MULTI_CPU, Lightning wrapped models in DDP,
    and child processes inherited the variables (their own launches then met a port in use or the wrong ranks)."""
    environ = dict(os.environ)
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
    for key in _PROCESS_GROUP_VARIABLES:  # also what a module or session fixture's in-process run set
        if key in _SESSION_ENVIRON:
            environ[key] = _SESSION_ENVIRON[key]
        else:
            environ.pop(key, None)
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)
