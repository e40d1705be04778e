"""`hf-lightning verify PATH`: check a checkpoint folder, or every `checkpoint-<n>` of an output directory, without
loading anything (`checkpoint/verify.py`: whole files, the manifest's checksums, the step of `trainer_state.json`).

One line per checkpoint, oldest first; the exit status is 0 when every checkpoint is good, 1 when one is not, 2 when
`PATH` holds no checkpoint or does not exist. torch and Lightning are not imported, so it answers in well under a
second plus the time to read the files.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hf_lightning.checkpoint.verify import Verdict, previous_good_checkpoint, verify_path

__all__ = ["USAGE", "verify_line", "verify_main"]

USAGE = """usage: hf-lightning verify PATH [PATH ...]

  PATH   a checkpoint folder (checkpoint-<n>), or an output_dir holding several

Checks every file of each checkpoint against its manifest (checkpoint_manifest.json: size and checksum recorded when
it was saved), that every file is whole, and that trainer_state.json's global_step is the folder's step. Checkpoints
written by transformers.Trainer have no manifest: their files are checked for completeness only.
Exit status: 0 all good, 1 a checkpoint failed, 2 no checkpoint found (or PATH does not exist).
"""


def verify_line(verdict: Verdict) -> str:
    """The report line of one checkpoint."""
    name = verdict.folder.name
    if verdict.ok:
        how = (f"{verdict.files} files match the manifest" if verdict.has_manifest
               else "no manifest (not written by hf_lightning): files whole, step matches")
        return f"OK      {name}: {how}"
    problems = "; ".join(f"{file}: {problem}" for file, problem in verdict.problems.items())
    previous = previous_good_checkpoint(verdict.folder)
    fallback = f"previous good checkpoint: {previous.name}" if previous is not None else "no earlier good checkpoint"
    return f"FAILED  {name}: {problems} ({fallback})"


def verify_main(argv: list[str]) -> int:
    """Verify each path of `argv`, print one line per checkpoint; return the exit status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    status = 0
    for path in argv:
        if not Path(path).exists():
            print(f"hf-lightning verify: {path!r} does not exist", file=sys.stderr)
            status = max(status, 2)
            continue
        verdicts = verify_path(path)
        if not verdicts:
            print(f"hf-lightning verify: {path!r} is neither a checkpoint folder nor a folder holding checkpoint-<n> "
                  "folders", file=sys.stderr)
            status = max(status, 2)
            continue
        if len(argv) > 1 or len(verdicts) > 1:
            print(f"{Path(path)}:")
        for verdict in verdicts:
            print(verify_line(verdict))
            if not verdict.ok:
                status = max(status, 1)
    return status
