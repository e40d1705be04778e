"""HF-layout checkpoint folders: writing, rotation, resume lookup."""
