"""Task presets for the `hf-lightning` command: preprocessing, collator, model class and metrics per task."""
