"""The parts of `hf_lightning.Trainer` (`hf_lightning.facade`): the `transformers.Trainer` methods a subclass may
override (`step_hooks`, `data_hooks`, `loop_hooks`), the `accelerator` shim, and which overrides are honoured
(`overrides`)."""
