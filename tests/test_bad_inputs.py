"""Every bad input is refused by the real CLI with exit code 2 and one line naming the key or
file, without a traceback, before any model loads, and without writing into the run directory.

Each case runs `reinforge.cli.main.main` in a fresh process behind a tripwire: a case server
(one subprocess for the module) replaces `PreTrainedModel.from_pretrained` (which every model
load of transformers goes through) with a function that raises, so a case that loaded a model
before refusing exits with that traceback (code 1) instead of 2. The server imports
transformers once and forks one child per case, so every case starts from the same untouched
interpreter without paying the ~4 s import each (the table took 30 x ~5 s as one interpreter
per case). One tiny model and one small task data set are shared by the module; the broken
variants are copies with one thing wrong.

Issue 11's section 4 (runs that must not mix, lose or leave anything) is tested beside this file:
a previous run refused unless --resume/--overwrite, an unwritable run_dir, resume cutting the
logs back, SIGTERM, non-finite metrics as null: tests/test_bad_inputs_run_dir.py; checkpoint and
export atomicity at every kill point, latest_checkpoint verifying files, stale temporaries
cleaned at start-up: tests/test_checkpoint_atomic.py.
"""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import rl_overrides

# The case server: imports transformers once, installs the tripwire, then for each request line
# (JSON: argv and cwd) forks a child that runs the CLI with its stdout and stderr in files, as a
# fresh interpreter would (an uncaught exception prints its traceback and exits 1), and answers
# with one JSON line (rc, stdout, stderr). Forking before any case ran keeps cases independent.
CASE_SERVER = r"""
import json, os, sys, tempfile, traceback
from transformers import PreTrainedModel

def tripwire(*args, **kwargs):
    raise RuntimeError("tripwire: a model was loaded before the bad input was refused")

PreTrainedModel.from_pretrained = classmethod(tripwire)
import reinforge.cli.main

def child(argv, out_path, err_path):
    out = os.open(out_path, os.O_WRONLY)
    err = os.open(err_path, os.O_WRONLY)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = os.fdopen(1, "w", closefd=False)
    sys.stderr = os.fdopen(2, "w", closefd=False)
    try:
        code = reinforge.cli.main.main(argv)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, "out"), os.path.join(tmp, "err")]
        for p in paths:
            open(p, "w").close()
        pid = os.fork()
        if pid == 0:
            os.chdir(req["cwd"])
            child(req["argv"], *paths)
        _, status = os.waitpid(pid, 0)
        texts = [open(p, errors="replace").read() for p in paths]
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "stdout": texts[0], "stderr": texts[1]}),
          flush=True)
"""


@pytest.fixture(scope="module")
def run_case():
    """`run_case(argv, cwd) -> (returncode, stdout, stderr)`, each case in a forked child of
    one server process that has imported transformers and installed the tripwire."""
    server = subprocess.Popen([sys.executable, "-c", CASE_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)

    def run(argv: list[str], cwd) -> tuple[int, str, str]:
        server.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd)}) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        assert line, "the case server died"
        out = json.loads(line)
        return out["rc"], out["stdout"], out["stderr"]

    yield run
    server.stdin.close()
    server.wait(timeout=60)


BAD_YAML = "rollout:\n  n: 4\n  temperature: [1.0\nactor:\n  lr: 1e-3\n"


def _broken_copy(src: str, dst: Path, edit) -> str:
    shutil.copytree(src, dst)
    edit(dst)
    return str(dst)


def _image_files(root: Path) -> None:
    """Image rows (issue 25), each file with one thing wrong (img_ok: nothing) and ok.png beside them."""
    import io

    from PIL import Image

    from reinforge.data import write_rows

    Image.new("RGB", (20, 20), (200, 0, 0)).save(root / "ok.png")
    row = {"prompt": [{"role": "user", "content": "<image>How many?"}], "images": ["ok.png"], "ground_truth": "1"}
    for name, change in (("img_ok", {}), ("img_missing", {"images": ["absent.png"]}),
                         ("img_count", {"prompt": [{"role": "user", "content": "<image><image>How many?"}]})):
        (root / f"{name}.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, **change}) + "\n")
    buf = io.BytesIO()
    Image.new("RGB", (20, 20)).save(buf, format="PNG")
    write_rows([{**row, "images": [{"bytes": buf.getvalue(), "path": None}]},
                {**row, "images": [{"bytes": b"GIF89a but not really", "path": None}]}], str(root / "img_bad.parquet"))
    (root / "img_sft.jsonl").write_text(json.dumps({**row, "response": "1"}) + "\n")


@pytest.fixture(scope="module")
def inp(tmp_path_factory, tiny_model_dir, arith_data) -> SimpleNamespace:
    """Paths of the good inputs, their broken variants, and the base argument lists."""
    root = tmp_path_factory.mktemp("bad_inputs")
    run = str(root / "run")
    p = SimpleNamespace(root=root, run=run, model=tiny_model_dir, data=arith_data)
    p.m_notok = _broken_copy(tiny_model_dir, root / "m_notok", lambda d: [f.unlink() for f in d.glob("tokenizer*")])
    p.m_noconfig = _broken_copy(tiny_model_dir, root / "m_noconfig", lambda d: (d / "config.json").unlink())
    p.m_badconfig = _broken_copy(tiny_model_dir, root / "m_badconfig",
                                 lambda d: (d / "config.json").write_text("{not json"))

    def truncate(d: Path):
        f = d / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    p.m_trunc = _broken_copy(tiny_model_dir, root / "m_trunc", truncate)
    (root / "bad.yaml").write_text(BAD_YAML)
    (root / "empty.jsonl").write_text("")
    (root / "latin1.jsonl").write_bytes(b'{"prompt": "1+2=", "ground_truth": "3"}\n'
                                        b'{"prompt": "caf\xe9 2+2=", "ground_truth": "4"}\n')
    # The character tokenizer has no token for a CJK character: the prompt encodes to nothing.
    (root / "zero.jsonl").write_text('{"prompt": "1+2=", "ground_truth": "3"}\n{"prompt": "\u4e2d", "ground_truth": "4"}\n')
    (root / "noprompt.jsonl").write_text('{"question": "1+2=", "ground_truth": "3"}\n')
    _image_files(root)
    p.rl = ["train", *rl_overrides(tiny_model_dir, arith_data, run, **{"trainer.device": "cpu"})]
    sup = [f"model.path={tiny_model_dir}", f"trainer.run_dir={run}", "trainer.device=cpu"]
    p.sft = ["sft", *sup, f"data.train_files=[{arith_data['sft']}]"]
    p.dpo = ["dpo", *sup, f"data.train_files=[{arith_data['prefs']}]"]
    p.rm = ["rm", *sup, f"data.train_files=[{arith_data['prefs']}]"]
    return p


# (id, argv from the fixture's paths, text the one-line message must contain: the key or file)
CASES = [
    # issue 11, section 3
    ("no_tokenizer_files", lambda p: [*p.rl, f"model.path={p.m_notok}"], "model.path='{m_notok}' has no tokenizer files"),
    ("prompt_encodes_to_nothing", lambda p: [*p.rl, f"data.train_files=[{p.root}/zero.jsonl]"],
     "zero.jsonl: row 1: field 'prompt': encodes to 0 tokens"),
    ("truncated_safetensors", lambda p: [*p.rl, f"model.path={p.m_trunc}"],
     "model.path: weight file {m_trunc}/model.safetensors is corrupt"),
    ("negative_lr", lambda p: [*p.rl, "actor.lr=-1"], "actor.lr=-1.0 is out of range; valid range: [0, inf)"),
    ("reward_module_missing", lambda p: [*p.rl, "reward.functions=[{name: no_such_module:score}]"],
     "reward.functions[0].name: reward 'no_such_module:score': cannot import module 'no_such_module'"),
    ("reward_builtin_typo", lambda p: [*p.rl, "reward.functions=[math_verfy]"],
     "reward.functions[0].name: unknown reward 'math_verfy'; did you mean 'math_verify'?"),
    ("reward_short_form_file", lambda p: [*p.rl, f"reward.functions=[{p.root}/absent.py:fn]"],
     "reward.functions[0].name: reward file not found: {root}/absent.py"),
    ("eval_reward_typo_sft", lambda p: [*p.sft, "eval.reward_functions=[exact_mtch]"],
     "eval.reward_functions[0].name: unknown reward 'exact_mtch'; did you mean 'exact_match'?"),
    ("yaml_syntax_error", lambda p: ["train", "--config", f"{p.root}/bad.yaml", *p.rl[1:]],
     "bad.yaml: line 4, column 6: YAML syntax error: expected ',' or ']'"),
    ("data_make_unknown_task", lambda p: ["data", "make", "arithmetc", "--out", f"{p.run}"],
     "unknown task 'arithmetc'; did you mean 'arithmetic'? available: arithmetic, calculator, count_shapes, "
     "countdown, guess_number, long_addition"),
    # (an option after --out reaches the task too)
    ("data_make_unknown_option", lambda p: ["data", "make", "arithmetic", "--out", f"{p.run}", "digitz=2"],
     "task 'arithmetic' has no option 'digitz'; did you mean 'digits'? options: digits=2, ops='+'"),
    ("data_make_option_type", lambda p: ["data", "make", "countdown", "count=three", "--out", f"{p.run}"],
     "countdown: option count='three' must be an integer (default 3)"),
    ("jsonl_not_utf8", lambda p: [*p.rl, f"data.train_files=[{p.root}/latin1.jsonl]"],
     "latin1.jsonl: line 2, column 16: bytes b'\\xe9' are not UTF-8"),
    # the sweep
    ("empty_data_file", lambda p: [*p.rl, f"data.train_files=[{p.root}/empty.jsonl]"], "empty.jsonl: no rows"),
    ("missing_data_file", lambda p: [*p.rl, f"data.val_files=[{p.root}/nope.parquet]"],
     "data.val_files[0]='{root}/nope.parquet': data file does not exist"),
    ("no_prompt_column", lambda p: [*p.rl, f"data.train_files=[{p.root}/noprompt.jsonl]"],
     "noprompt.jsonl: no column 'prompt' (columns: ground_truth, question); set data.prompt_key"),
    ("zero_sizes", lambda p: [*p.rl, "rollout.n=0"], "rollout.n=0 is out of range; valid range: [1, inf)"),
    ("override_without_equals", lambda p: [*p.rl, "rollout.n"], "override 'rollout.n' must look like section.key=value"),
    ("preset_typo", lambda p: ["train", "--config", "grpoo", *p.rl[1:]], "did you mean 'grpo'?"),
    ("model_path_missing", lambda p: [*p.rl, f"model.path={p.root}/nope"], "model.path='{root}/nope': no such folder"),
    ("model_path_is_a_file", lambda p: [*p.rl, f"model.path={p.model}/config.json"],
     "model.path='{model}/config.json' is a file"),
    ("model_without_config", lambda p: [*p.rl, f"model.path={p.m_noconfig}"], "(no config.json)"),
    ("model_config_not_json", lambda p: [*p.rl, f"model.path={p.m_badconfig}"], "{m_badconfig}/config.json: not valid JSON"),
    ("sft_given_rl_file", lambda p: [*p.sft, f"data.train_files=[{p.data['train']}]"],
     "train.parquet: no column 'response'"),
    ("dpo_given_sft_file", lambda p: [*p.dpo, f"data.train_files=[{p.data['sft']}]"],
     "sft.parquet: no columns 'chosen', 'rejected'"),
    ("rm_given_rl_file", lambda p: [*p.rm, f"data.train_files=[{p.data['train']}]"], "train.parquet: no columns 'chosen'"),
    ("list_key_given_scalar", lambda p: [*p.rl, f"data.train_files={p.data['train']}"],
     "config key 'data.train_files' is a list; give ["),
    ("logger_typo", lambda p: [*p.rl, "trainer.loggers=[jsonl, wandbb]"], "trainer.loggers: unknown ['wandbb']"),
    ("eval_reward_typo", lambda p: ["eval", "--model", p.model, "--data", p.data["test"], "--reward", "exact_mtch"],
     "--reward: unknown reward 'exact_mtch'; did you mean 'exact_match'?"),
    # issue 35: reasoning-gym
    ("rg_unknown_task", lambda p: ["data", "reasoning-gym", "chain_summ", "--out", f"{p.run}"],
     "reasoning-gym has no task 'chain_summ'; close: chain_sum, decimal_chain_sum; list all"),
    ("rg_reward_on_rows_without_entry", lambda p: [*p.rl, "reward.functions=[{name: reasoning_gym}]"],
     "train.parquet: row 0: field 'extra_info.rg_task': missing or not a string: the reasoning_gym reward needs rows"),
    ("rg_reward_eval_rows_without_entry",
     lambda p: ["eval", "--model", p.model, "--data", p.data["test"], "--reward", "reasoning_gym"],
     "test.parquet: row 0: field 'extra_info.rg_task': missing"),
    ("report_not_a_run_dir", lambda p: ["report", f"{p.root}/nowhere"], "{root}/nowhere' is not a run directory"),
    # issue 25: image rows, refused when the data loads (before the model)
    ("image_bytes_unreadable", lambda p: [*p.rl, f"data.train_files=[{p.root}/img_bad.parquet]"],
     "img_bad.parquet: row 1: field 'images[0]': unreadable image (UnidentifiedImageError"),
    ("image_path_missing", lambda p: [*p.rl, f"data.train_files=[{p.root}/img_missing.jsonl]"],
     "img_missing.jsonl: row 1: field 'images[0]': image file {root}/absent.png not found"),
    ("image_placeholder_count", lambda p: [*p.rl, f"data.train_files=[{p.root}/img_count.jsonl]"],
     "img_count.jsonl: row 1: field 'prompt': the prompt has 2 image placeholder(s)"),
    ("image_over_pixel_budget", lambda p: [*p.rl, f"data.train_files=[{p.root}/img_ok.jsonl]", "data.max_pixels=399"],
     "img_ok.jsonl: row 0: field 'images[0]': image is 20x20 = 400 pixels > data.max_pixels=399"),
    ("image_over_pixel_budget_sft", lambda p: [*p.sft, f"data.train_files=[{p.root}/img_sft.jsonl]",
                                               "data.max_pixels=399"],
     "img_sft.jsonl: row 0: field 'images[0]': image is 20x20 = 400 pixels > data.max_pixels=399"),
    ("image_rows_text_model", lambda p: [*p.rl, f"data.train_files=[{p.root}/img_ok.jsonl]"],
     "img_ok.jsonl: row 0: field 'prompt': the row has images but the model has no image processor"),
    ("lora_target_typo", lambda p: [*p.rl, "model.lora_rank=4", "model.lora_target_modules=[q_proj, nope_proj]"],
     "model.lora_target_modules: ['nope_proj'] match no module of model.path="),
    # issue 38: routing replay and the router loss need an MoE policy the lean loop records
    ("router_replay_dense_model", lambda p: [*p.rl, "actor.router_replay=rollout"],
     "actor.router_replay=rollout: model.path='{model}' is not a mixture-of-experts model (model_type 'qwen2'"),
    ("router_aux_loss_dense_model", lambda p: [*p.rl, "actor.router_aux_loss_coef=0.01"],
     "actor.router_aux_loss_coef != 0: model.path='{model}' is not a mixture-of-experts model"),
    ("router_replay_hf_backend", lambda p: [*p.rl, "actor.router_replay=rollout", "rollout.backend=hf"],
     "actor.router_replay=rollout needs the lean rollout, which records the experts (got rollout.backend=hf)"),
    ("router_replay_value", lambda p: [*p.rl, "actor.router_replay=vllm"], "actor.router_replay"),
]


def _files(path: Path) -> list[str]:
    return sorted(str(f.relative_to(path)) for f in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize("argv,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_refused(inp, run_case, argv, needle):
    run_dir = Path(inp.run)
    before = _files(run_dir)
    rc, stdout, stderr = run_case(argv(inp), inp.root)
    needle = needle.format(**vars(inp))
    assert "Traceback" not in stdout + stderr, stderr
    assert rc == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reinforge: error: "), stderr
    assert needle in lines[0], lines[0]
    assert _files(run_dir) == before == [], "the refused run wrote into its run directory"


# ---- the checks behind the table, in process -------------------------------------------------
def _safetensors(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_safetensors_problem(tmp_path):
    from reinforge.models.checks import safetensors_problem

    f = tmp_path / "m.safetensors"
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    head = 8 + len(json.dumps(header).encode())  # length prefix + JSON; the data (8 bytes) follows
    assert safetensors_problem(_safetensors(f, header, bytes(8))) is None
    for size in (5, 9):  # truncated, or trailing bytes
        assert safetensors_problem(_safetensors(f, header, bytes(size))) == (
            f"the header describes {head + 8} bytes but the file has {head + size} (truncated or corrupt)")
    assert safetensors_problem(_safetensors(f, {"__metadata__": {"format": "pt"}}, b"")) is None
    no_offsets = {"w": {"dtype": "F32", "shape": [2]}}
    assert safetensors_problem(_safetensors(f, no_offsets, bytes(8))).startswith(
        "header is not a safetensors header (KeyError")


def test_safetensors_problem_short_and_garbage(tmp_path):
    from reinforge.models.checks import safetensors_problem

    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    assert "too short" in safetensors_problem(tmp_path / "short.safetensors")
    (tmp_path / "big.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")
    assert "does not fit in the file's 10 bytes" in safetensors_problem(tmp_path / "big.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{]")
    assert "not a safetensors header" in safetensors_problem(tmp_path / "junk.safetensors")


def test_missing_modules_follows_peft_suffix_rule():
    from reinforge.models.checks import missing_modules

    names = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"}
    assert missing_modules(names, ["q_proj", "up_proj", "lm_head", "self_attn.q_proj"]) == []
    # "layers.0" is a module, but holds no weight of its own (PEFT cannot wrap it either)
    assert missing_modules(names, ["proj", "k_proj", "layers.0"]) == ["proj", "k_proj", "layers.0"]


def test_corrupt_shard_named_by_preflight_and_by_the_loader(tmp_path):
    """A sharded checkpoint with one truncated shard: the header check names that shard, and
    so does the real load when it meets it (a Python user who skips preflight)."""
    from reinforge.models.checks import ModelLoadError, check_model_files
    from reinforge.models.loading import load_causal_lm
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer

    model = make_tiny_model(build_char_tokenizer(), str(tmp_path / "m"), seed=0, hidden_size=64, num_layers=2,
                            num_heads=4, num_kv_heads=2, intermediate_size=128)
    shutil.rmtree(tmp_path / "m")
    model.save_pretrained(tmp_path / "m", max_shard_size="100KB")
    shards = sorted((tmp_path / "m").glob("model-*.safetensors"))
    assert len(shards) >= 2 and (tmp_path / "m" / "model.safetensors.index.json").exists()
    shards[1].write_bytes(shards[1].read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match=f"model.path: weight file {shards[1]} is corrupt"):
        check_model_files(tmp_path / "m", "model.path")
    with pytest.raises(ModelLoadError, match=f"weight file {shards[1]} is corrupt"):
        load_causal_lm(str(tmp_path / "m"))


def test_load_tokenizer_refuses_a_folder_without_vocabulary(inp):
    from reinforge.models.loading import ModelLoadError, load_tokenizer

    with pytest.raises(ModelLoadError, match="has no tokenizer files"):
        load_tokenizer(inp.m_notok)


@pytest.mark.parametrize("kind", ["rl", "sft", "dpo", "rm"])
def test_trainer_constructors_run_preflight(inp, tmp_path, no_model_loads, kind):
    """Python users who build a trainer get the CLI's checks, before any model loads."""
    from reinforge.config.load import ConfigError, load_config
    from reinforge.config.preference import DPOConfig, RMConfig
    from reinforge.config.schema import RLConfig
    from reinforge.config.sft import SFTConfig
    from reinforge.trainers.dpo import DPOTrainer
    from reinforge.trainers.rl import RLTrainer
    from reinforge.trainers.rm import RMTrainer
    from reinforge.trainers.sft import SFTTrainer

    schema, trainer, bad, message = {
        "rl": (RLConfig, RLTrainer, "actor.betas=[0.9, 1.0]", r"actor.betas\[1\]=1.0"),
        "sft": (SFTConfig, SFTTrainer, "eval.reward_functions=[no_such_reward]", "no_such_reward"),
        "dpo": (DPOConfig, DPOTrainer, f"model.path={inp.m_trunc}", "is corrupt"),
        "rm": (RMConfig, RMTrainer, f"model.path={inp.m_notok}", "no tokenizer"),
    }[kind]
    argv = [a for a in getattr(inp, kind)[1:] if not a.startswith("trainer.run_dir=")]
    cfg = load_config(schema, "grpo" if kind == "rl" else None, [*argv, f"trainer.run_dir={tmp_path}/run", bad])
    with pytest.raises((ConfigError, ValueError), match=message):  # each kind's own refusal, not any of them
        trainer(cfg)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_reward_functions_resolved_at_config_time(tmp_path):
    """The checks preflight runs on each reward spec: importable, callable with the reward
    arguments (extras such as data_source always come as keywords)."""
    from reinforge.config.load import ConfigError
    from reinforge.trainers.preflight import check_reward_function

    (tmp_path / "fns.py").write_text(
        "def no_extra(prompt, response, ground_truth):\n    return 0.0\n"
        "def per_sample(prompt, response, ground_truth, **extra):\n    return 0.0\n"
        "def many(prompts, responses, ground_truths, extras):\n    return [0.0] * len(prompts)\n"
        "many.batched = True\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    check_reward_function(f"{tmp_path}/fns.py:per_sample", "reward.functions[0].name")
    check_reward_function(f"{tmp_path}/fns.py:many", "reward.functions[1].name")
    with pytest.raises(ConfigError, match=r"^reward.functions\[2\].name: .*no_extra\(prompt, response, ground_truth\) "
                                          r"cannot be called as fn\(prompt, response, ground_truth, \*\*extra\)"):
        check_reward_function(f"{tmp_path}/fns.py:no_extra", "reward.functions[2].name")
    with pytest.raises(ConfigError, match=r"^eval.reward_functions\[0\].name: reward file .*broken.py: SyntaxError"):
        check_reward_function(f"{tmp_path}/broken.py:f", "eval.reward_functions[0].name")
    with pytest.raises(ConfigError, match=r"'fns.py': name the function in the file too, 'fns.py:fn'"):
        check_reward_function("fns.py", "reward.functions[0].name")
