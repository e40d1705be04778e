"""One-feature run options, each a `TrainingArguments` field applied at one point of the run.

`seeding` (`seed`, `full_determinism`), `threads`, `device_cache` (`torch_empty_cache_steps`), `neftune`
(`neftune_noise_alpha`), `torch_compile`, `activation_checkpointing` (`gradient_checkpointing`), `batch_search`
(`auto_find_batch_size`); `memory_plan`: the peak memory of one update, traced on fake tensors before the run.
"""
