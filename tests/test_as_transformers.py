"""`hf_lightning.use_as_transformers_trainer()`: `transformers.Trainer` and friends become hf_lightning's, whatever
was imported first; a library imported before it is refused by name; `restore_transformers_trainer()` undoes it.

The swap is process-wide, so every check runs in a fresh interpreter (bounded by a timeout).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_CHECK_SWAPPED = """
import sys
import hf_lightning
import transformers.trainer, transformers.training_args, transformers.trainer_seq2seq
import transformers.training_args_seq2seq
from transformers import Trainer, TrainingArguments, Seq2SeqTrainer, Seq2SeqTrainingArguments
package = sys.modules["transformers"]
ours = {"Trainer": hf_lightning.Trainer, "TrainingArguments": hf_lightning.TrainingArguments,
        "Seq2SeqTrainer": hf_lightning.Seq2SeqTrainer, "Seq2SeqTrainingArguments": hf_lightning.Seq2SeqTrainingArguments}
seen = {"from transformers import": {"Trainer": Trainer, "TrainingArguments": TrainingArguments,
                                     "Seq2SeqTrainer": Seq2SeqTrainer,
                                     "Seq2SeqTrainingArguments": Seq2SeqTrainingArguments},
        "sys.modules['transformers']": {name: getattr(package, name) for name in ours},
        "the module object bound first": {name: getattr(early, name) for name in ours},
        "submodules": {"Trainer": transformers.trainer.Trainer,
                       "TrainingArguments": transformers.training_args.TrainingArguments,
                       "Seq2SeqTrainer": transformers.trainer_seq2seq.Seq2SeqTrainer,
                       "Seq2SeqTrainingArguments": transformers.training_args_seq2seq.Seq2SeqTrainingArguments}}
wrong = [(where, name) for where, values in seen.items() for name, value in values.items() if value is not ours[name]]
assert not wrong, wrong
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # a library imported after the call is built on ours
assert issubclass(SFTTrainer, hf_lightning.Trainer) and issubclass(DPOTrainer, hf_lightning.Trainer)
assert issubclass(SFTConfig, hf_lightning.TrainingArguments) and issubclass(DPOConfig, hf_lightning.TrainingArguments)
print("SWAPPED")
"""

_ORDERS = {
    # the order of the bug: the `transformers` object bound here is replaced in sys.modules when
    # `hf_lightning.Trainer` first imports transformers.processing_utils
    "transformers, then hf_lightning.Trainer": "import transformers\nearly = transformers\nimport hf_lightning\n"
                                               "hf_lightning.Trainer\n",
    "hf_lightning.Trainer, then transformers": "import hf_lightning\nhf_lightning.Trainer\nimport transformers\n"
                                               "early = transformers\n",
    "transformers only": "import transformers\nearly = transformers\nimport hf_lightning\n",
}


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("order", list(_ORDERS))
def test_every_way_in_resolves_to_hf_lightning_whatever_was_imported_first(order):
    done = _run(_ORDERS[order] + "hf_lightning.use_as_transformers_trainer()\n"
                "hf_lightning.use_as_transformers_trainer()  # idempotent\n" + _CHECK_SWAPPED)
    assert done.returncode == 0 and done.stdout.strip().endswith("SWAPPED"), done.stderr[-3000:]


def test_a_library_imported_first_is_refused_by_name_and_nothing_is_swapped():
    done = _run("""
        from trl import SFTTrainer
        import hf_lightning, transformers
        try:
            hf_lightning.use_as_transformers_trainer()
        except RuntimeError as err:
            print("REFUSED", err)
        import transformers.trainer
        assert transformers.Trainer is transformers.trainer.Trainer and transformers.Trainer.__module__ == \\
            "transformers.trainer"
        assert transformers.TrainingArguments.__module__ == "transformers.training_args"
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    message = done.stdout
    assert message.startswith("REFUSED")
    assert "trl.trainer.sft_trainer.SFTTrainer (subclass of the real transformers.Trainer)" in message
    assert "trl.trainer.sft_config.SFTConfig (subclass of the real transformers.TrainingArguments)" in message
    assert "before importing trl" in message


def test_a_subclass_that_no_longer_exists_is_not_a_refusal():
    done = _run("""
        import transformers, hf_lightning
        class Mine(transformers.Trainer):  # the real one: refused while it exists
            pass
        try:
            hf_lightning.use_as_transformers_trainer()
        except RuntimeError as err:
            assert "__main__.Mine (subclass of the real transformers.Trainer)" in str(err), err
        else:
            raise AssertionError("not refused")
        del Mine
        hf_lightning.use_as_transformers_trainer()
        assert transformers.Trainer is hf_lightning.Trainer
        print("OK")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]


def test_restore_gives_transformers_its_classes_back_and_the_swap_can_be_made_again():
    done = _run("""
        import sys, hf_lightning
        hf_lightning.restore_transformers_trainer()  # not swapped: nothing to do
        hf_lightning.use_as_transformers_trainer()
        from trl import SFTTrainer  # built on ours while swapped: stays so
        hf_lightning.restore_transformers_trainer()
        hf_lightning.restore_transformers_trainer()
        import transformers.trainer, transformers.training_args_seq2seq
        from transformers import Trainer, TrainingArguments, Seq2SeqTrainingArguments
        assert Trainer.__module__ == "transformers.trainer" and transformers.trainer.Trainer is Trainer
        assert TrainingArguments.__module__ == "transformers.training_args"
        assert Seq2SeqTrainingArguments is transformers.training_args_seq2seq.Seq2SeqTrainingArguments
        assert Seq2SeqTrainingArguments.__module__ == "transformers.training_args_seq2seq"
        assert issubclass(SFTTrainer, hf_lightning.Trainer)
        hf_lightning.use_as_transformers_trainer()  # SFTTrainer subclasses ours, not the real one: no refusal
        assert sys.modules["transformers"].Trainer is hf_lightning.Trainer
        print("OK")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]


def test_lightning_kwargs_given_to_the_call_reach_a_library_trainer_built_without_them(tmp_path):
    done = _run(f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        import hf_lightning
        hf_lightning.use_as_transformers_trainer(lightning_kwargs={{"accelerator": "cpu", "logger": False}})
        hf_lightning.use_as_transformers_trainer()  # None keeps them
        from helpers import classification_dataset, tiny_bert
        from transformers import Trainer, TrainingArguments
        args = TrainingArguments(output_dir={str(tmp_path)!r}, report_to="none", save_strategy="no")
        class Library(Trainer):  # a constructor without `lightning_kwargs`, as TRL's
            def __init__(self, model, args, train_dataset):
                super().__init__(model=model, args=args, train_dataset=train_dataset)
        trainer = Library(tiny_bert(), args, classification_dataset(n=8))
        assert trainer.lightning_kwargs == {{"accelerator": "cpu", "logger": False}}, trainer.lightning_kwargs
        assert Trainer(tiny_bert(), args, lightning_kwargs={{}}).lightning_kwargs == {{}}  # its own win
        hf_lightning.restore_transformers_trainer()
        assert hf_lightning.Trainer(tiny_bert(), args).lightning_kwargs == {{}}
        print("OK")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]
