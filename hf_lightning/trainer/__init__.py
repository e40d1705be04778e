"""`hf_lightning.Trainer` (`facade`) and its parts: the `transformers.Trainer` methods a subclass may override
(`step_hooks`, `data_hooks`, `loop_hooks`), the `accelerator` shim, which overrides are honoured (`overrides`), the
`lightning.Trainer` it builds (`lightning_trainer`), `hyperparameter_search` (`hp_search`), the model card
(`model_card`), the script-level helpers (`script_api`), and `use_as_transformers_trainer` (`as_transformers`), which
makes `transformers.Trainer` this facade for the libraries built on it."""
