"""The report of real tiny SFT, DPO and RM runs (written when the run ends, and by `reinforge
report`): the panels find the metric names these trainers log (a renamed metric would turn a
curve into a "not logged" line and fail here). The untrained model's validation accuracy may be
0 at every step: found, but a line of text."""
from __future__ import annotations

import pytest

from reinforge.cli.main import main
from reinforge.report.metrics import read_metrics
from reinforge.report.panels import PANELS, plan_panel

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread

COMMON = ["data.max_length=16", "data.batch_size=8", "optim.micro_batch_size=8", "trainer.total_steps=3",
          "trainer.val_every=3", "trainer.loggers=[jsonl]", "trainer.progress=false", "trainer.export_hf=false"]
GEN_EVAL = ["eval.n=2", "eval.max_response_length=4", "eval.max_prompt_length=8"]

# command, extra overrides, panels whose metrics must be logged, the kind named in the page's title
CASES = {
    "sft": (lambda d: [f"data.train_files=[{d['sft']}]", f"data.val_files=[{d['sft']}]",
                       f"eval.prompt_files=[{d['test']}]", "eval.pass_k=[1,2]", *GEN_EVAL],
            {"loss", "validation_accuracy", "validation_perplexity", "grad_norm", "learning_rate"}, "SFT"),
    "dpo": (lambda d: [f"data.train_files=[{d['prefs']}]", f"eval.prompt_files=[{d['test']}]", "data.val_fraction=0.1",
                       "dpo.nll_coef=1.0", *GEN_EVAL],
            {"loss", "pairwise_accuracy", "reward_margin", "rewards", "logps", "nll_chosen", "validation_accuracy"},
            "DPO"),
    "rm": (lambda d: [f"data.train_files=[{d['prefs']}]", "data.val_fraction=0.1"],
           {"loss", "pairwise_accuracy", "reward_margin", "rewards", "grad_norm", "learning_rate"}, "reward model"),
}


@pytest.mark.parametrize("command", list(CASES))
def test_report_of_a_tiny_run(command, tiny_model_dir, arith_data, tmp_path, capsys):
    extra, panels, kind = CASES[command]
    run = tmp_path / command
    assert main([command, f"model.path={tiny_model_dir}", f"trainer.run_dir={run}", *COMMON, *extra(arith_data)]) == 0
    page = (run / "report" / "index.html").read_text()  # written at the end of the run (trainer.report)
    assert main(["report", str(run)]) == 0  # and again on demand
    assert f"reinforge {kind} run" in page and 'class="grid"' in page
    rows = read_metrics(run)
    found = {p.slug for p in PANELS[command] if plan_panel(rows, p).lines or plan_panel(rows, p).zero}
    assert panels <= found, panels - found
    drawn = {p.stem for p in (run / "report").glob("*.png")}
    assert {"loss", "grad_norm"} <= drawn and "not logged" not in page, page
