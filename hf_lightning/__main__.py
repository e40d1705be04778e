"""`python -m hf_lightning` is the `hf-lightning` command."""

from hf_lightning.cli import main

main()
