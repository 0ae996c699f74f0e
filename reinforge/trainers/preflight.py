"""Every check of a training config that builds no model, beyond the rules about its values
(config/validate.py): the names that live in the layers above config, and the files the plan
names. trainers/plan.py runs them while it resolves the plan, first thing in each trainer's
constructor, so the CLI and a Python user get the same one-line errors before any model loads.
A failure leaves the run directory untouched.

Names (check_rl_names, check_reward_names, check_supervised_names), with the config's rules:
data files exist (or name a `datasets` source or rows handed over in Python), the rollout
backend, the tool parser, the data formats' overlong policies, reward shaping and the judge.

Files (check_rl_files, check_supervised_files), once the plan is derived:
1. the model folders' files: config.json, safetensors headers against file sizes, tokenizer
   files (reinforge.models.checks; reads files only);
2. the reward functions: each imported, checked callable in its style (reinforge, veRL, TRL);
3. RL: a teacher's tokenizer against the student's, the agent loop's tools and environment
   imported, and with LoRA every model.lora_target_modules entry naming modules of the weights;
   a vision-language actor (check_vlm_rl) only on the paths that carry its images, its critic a
   VLM with the same image layout (check_vlm_critic); a vision-language reward model is refused
   as reward.reward_model_path (the scorer reads text only).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from reinforge.config.load import ConfigError
from reinforge.config.validate import (IN_MEMORY_PREFIX, check_choice, check_model_path, check_name, model_max_positions,
                                       need)
from reinforge.models.checks import (check_logit_transform, check_model_files, check_tokenizer_files, missing_modules,
                                     weight_names)

if TYPE_CHECKING:
    from reinforge.trainers.plan import RunPlan, SupervisedPlan

# ---- names ------------------------------------------------------------------------------------
def check_data_files(train_files: Sequence[str], others: Optional[dict[str, Sequence[str]]] = None,
                     kind: str = "parquet/JSONL file") -> None:
    """data.train_files must be non-empty, and every file it and `others` ({dotted key: files})
    list must exist."""
    from reinforge.data.hf_datasets import is_dataset_source

    need(bool(train_files), f"data.train_files is empty: give at least one {kind}")
    for key, files in {"data.train_files": train_files, **(others or {})}.items():
        for i, f in enumerate(files):
            if str(f).startswith(IN_MEMORY_PREFIX):  # rows handed to the trainer in Python (trainers/inputs.py)
                continue
            if is_dataset_source(str(f)):  # hf://datasets/... or a save_to_disk folder (data/hf_datasets.py)
                continue
            need(Path(f).exists(), f"{key}[{i}]={f!r}: data file does not exist")
            need(Path(f).is_file(), f"{key}[{i}]={f!r} is a folder; give the {kind}s in it")


def check_rl_names(cfg) -> None:
    """An RLConfig's names that live above config: data files, rollout backend, tool parser,
    overlong-prompt policy."""
    from reinforge.agents.parsers import PARSERS
    from reinforge.data.rl_dataset import OVERLONG_POLICIES
    from reinforge.workers.rollout import check_rollout_backend  # the registry's names and capabilities

    check_data_files(cfg.data.train_files, {"data.val_files": cfg.data.val_files})
    r = cfg.rollout
    check_rollout_backend(r.backend, staleness=r.staleness, max_turns=r.max_turns, agent=bool(r.agent),
                          model_path=cfg.model.path,
                          temperatures={"rollout.temperature": r.temperature, "rollout.val_temperature": r.val_temperature})
    check_name(cfg.rollout.tool_parser, tuple(PARSERS), "rollout.tool_parser")
    check_name(cfg.data.overlong_prompt, OVERLONG_POLICIES, "data.overlong_prompt")


def check_supervised_names(cfg, data_kind: str, eval_prompt_files: Optional[Sequence[str]],
                           overlong: Sequence[str]) -> None:
    """An SFT / DPO / RM config's data files (and eval.prompt_files) and its data.overlong policy
    (one of `overlong`, its dataset's)."""
    others = {"data.val_files": cfg.data.val_files}
    if eval_prompt_files is not None:
        others["eval.prompt_files"] = eval_prompt_files
    check_data_files(cfg.data.train_files, others, kind=data_kind)
    check_choice(cfg.data.overlong, overlong, "data.overlong")


def check_reward_names(rw, algo, max_response_length: int) -> None:
    """The reward section with its functions in full form: each entry's forced style among the
    registered ones, every shaping term's parameters (each term checks its own keys:
    rewards/shaping.py) and the judge."""
    from reinforge.rewards.shaping import check_shaping

    check_reward_styles(rw.functions, "reward.functions")
    check_shaping(rw, algo, max_response_length)
    check_judge(rw)


def check_reward_styles(functions: Sequence[dict], key: str) -> None:
    """Each entry's forced `style` among the registered ones (rewards/styles.py), for the RL
    reward and the SFT / DPO eval functions alike; `functions` in their full form."""
    from reinforge.rewards.styles import style_choices

    for i, f in enumerate(functions):
        if "style" in f:
            check_choice(f["style"], style_choices(), f"{key}[{i}].style")


def check_judge(rw) -> None:
    """The reward.judge section, when reward.functions names `judge`: a model folder, a mode, two
    distinct verdicts and a template whose placeholders are known."""
    from reinforge.rewards.judge import JUDGE_MODES, JUDGE_NAME, check_template

    used = any(f["name"] == JUDGE_NAME for f in rw.functions)
    need(not any(f["name"] == JUDGE_NAME and "style" in f for f in rw.functions),
         f"reward.functions: the '{JUDGE_NAME}' entry takes no style (it is called as a batched reinforge function)")
    j = rw.judge
    if not used:
        need(not j.model_path, f"reward.judge.model_path is set but no reward.functions entry is "
                               f"'{JUDGE_NAME}': add {{name: {JUDGE_NAME}, weight: 1.0}} to use the judge")
        return
    need(bool(j.model_path), f"reward.functions names '{JUDGE_NAME}': set reward.judge.model_path to the "
                             "judge's causal-LM folder")
    check_model_path(j.model_path, "reward.judge.model_path")
    check_choice(j.mode, JUDGE_MODES, "reward.judge.mode")
    verdicts = list(j.verdicts)
    need(not any(isinstance(v, bool) for v in verdicts),
         f"reward.judge.verdicts={verdicts!r}: YAML reads Yes/No/On/Off as booleans; quote the verdicts, "
         """e.g. 'reward.judge.verdicts=["Yes", "No"]'""")
    need(len(verdicts) == 2 and all(isinstance(v, str) and v for v in verdicts) and verdicts[0] != verdicts[1],
         f"reward.judge.verdicts={verdicts!r}: give two different non-empty strings, [positive, negative]")
    try:
        check_template(j.template)
    except ValueError as exc:
        raise ConfigError(f"reward.judge.template: {exc}") from None
    max_pos = model_max_positions(j.model_path)
    new = j.max_new_tokens if j.mode == "generate" else 0
    longest = (j.max_length or 1) + new  # max_length 0: whatever the judge's positions leave, at least 1
    need(max_pos is None or longest <= max_pos,
         f"reward.judge.max_length + reward.judge.max_new_tokens = {longest} exceeds the judge's "
         f"max_position_embeddings = {max_pos}")


# ---- files ------------------------------------------------------------------------------------
def check_model_flag(path: str, flag: str) -> str:
    """A command's model flag (`reinforge eval --model`, `data pairs --model`) resolved as model.path
    is (a Hub id or pretrained:NAME to its cached folder) and checked before any model loads: the
    folder, its weight files and its tokenizer. Returns the resolved path; ConfigError naming the flag."""
    from reinforge.models.hub import resolve_model_path

    path = resolve_model_path(path, flag)
    check_model_path(path, flag)
    check_model_files(path, flag)
    check_tokenizer_files(path, flag)
    return path


def check_reward_function(spec: str, key: str, style: str | None = None) -> None:
    """Import reward function `spec` and check that it can be called in its style (`style`
    forces one); ConfigError naming `key` if not."""
    from reinforge.rewards.registry import check_reward_signature, load_reward_fn

    try:
        check_reward_signature(load_reward_fn(spec), spec, style)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def check_reward_rows(functions: Sequence[tuple], files: Sequence[str], memory: Optional[dict] = None) -> None:
    """Rows a reward function cannot score, before any model loads: each function that declares
    `fn.check_rows(rows, path)` (e.g. reasoning_gym, which needs its stored entry) reads every
    local file of `files` and the rows handed over in Python (`memory`: {name in files: rows});
    its DataError names the file, the row and the key. `functions`: (key, spec, style) triples
    as the plan lists them."""
    from reinforge.data.io import load_rows
    from reinforge.rewards.judge import JUDGE_NAME
    from reinforge.rewards.registry import load_reward_fn

    checks = [getattr(load_reward_fn(spec), "check_rows", None) for _, spec, _ in functions if spec != JUDGE_NAME]
    for check in filter(None, checks):
        for f in map(str, files):
            if f in (memory or {}):
                check(memory[f], f)
            elif Path(f).is_file():  # hf://datasets sources are not downloaded twice
                check(load_rows(f), f)


def check_lora_targets(cfg) -> None:
    """RL with LoRA: each target module exists in model.path (read from the safetensors
    headers), so a typo fails here rather than in PEFT after the model has loaded."""
    m = cfg.model
    if m.lora_rank == 0 or list(m.lora_target_modules) == ["all-linear"]:
        return
    names = weight_names(m.path)
    missing = missing_modules(names, list(m.lora_target_modules)) if names is not None else []
    if missing:
        modules = sorted({n.rsplit(".", 2)[-2] for n in names if n.count(".") >= 2})
        raise ConfigError(f"model.lora_target_modules: {missing} match no module of model.path={m.path!r}; "
                          f"its modules: {', '.join(modules)} (or use [all-linear])")


def _vocab(folder: str) -> dict | None:
    """token -> id of a tokenizer folder's tokenizer.json (model vocabulary and added tokens) or
    vocab.json; None when it has neither (a custom tokenizer: not compared)."""
    path = Path(folder)
    try:
        if (path / "tokenizer.json").is_file():
            data = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
            vocab = dict(data.get("model", {}).get("vocab") or {})
            return vocab | {t["content"]: t["id"] for t in data.get("added_tokens", [])}
        if (path / "vocab.json").is_file():
            return json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
        return None
    return None


def check_teacher_vocab(cfg) -> None:
    """Distillation compares the student's and the teacher's probabilities of the same token
    ids: both tokenizers must map ids to the same tokens, and for gkd both LM heads need as many
    rows (config.json vocab_size)."""
    t, m = cfg.teacher, cfg.model
    student_tok = m.tokenizer_path or m.path
    check_tokenizer_files(t.path, "teacher.path")
    a, b = _vocab(student_tok), _vocab(t.path)
    if a is not None and b is not None and a != b:
        diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])
        raise ConfigError(f"teacher.path={t.path!r}: its tokenizer differs from the student's ({student_tok!r}; "
                          f"{len(a)} vs {len(b)} tokens, first difference {diff[0]!r}); distillation compares "
                          "the two models on the same token ids: use a teacher with the student's tokenizer")
    if t.mode != "gkd":
        return
    sizes = [json.loads((Path(p) / "config.json").read_text(encoding="utf-8")).get("vocab_size") for p in (m.path, t.path)]
    if sizes[0] != sizes[1]:
        raise ConfigError(f"teacher.mode=gkd compares whole distributions: the teacher's vocab_size={sizes[1]} "
                          f"(teacher.path={t.path!r}) differs from the student's {sizes[0]} (model.path)")


def check_models(cfg, folders: dict) -> None:
    """Each model folder the plan names ({dotted key: folder}) and the tokenizers the run reads."""
    for key, folder in folders.items():
        check_model_path(folder, key)
        check_model_files(folder, key)
    m = cfg.model
    gkd = getattr(getattr(cfg, "teacher", None), "mode", None) == "gkd"
    for key in ("model.path", "dpo.ref_model_path", "teacher.path"):  # the models whose LM head is read directly
        if folders.get(key) and (m.fused_logprobs or (gkd and key in ("model.path", "teacher.path"))):
            check_logit_transform(folders[key], key)
    if m.tokenizer_path:
        check_tokenizer_files(m.tokenizer_path, "model.tokenizer_path", m.trust_remote_code)
    else:
        check_tokenizer_files(m.path, "model.path", m.trust_remote_code,
                              fix="copy the tokenizer files into it or set model.tokenizer_path")
    for key in ("reward.reward_model_path", "reward.judge.model_path"):
        if folders.get(key):  # the reward model and the judge read text with their own tokenizers
            check_tokenizer_files(folders[key], key)
    rm = folders.get("reward.reward_model_path")
    if rm:
        from reinforge.models.vlm_processor import is_vlm_folder

        if is_vlm_folder(rm):  # a `reinforge rm` export of a VLM (models/vlm_critic.py)
            raise ConfigError(f"reward.reward_model_path={rm!r} is a vision-language reward model: the RL reward "
                              "scorer scores decoded text without the prompt's images; score with a text reward "
                              "model or reward functions")


# vision_config keys that decide how a processor's pixel_values become image tokens: a critic
# encodes the actor's processor output, so its tower must cut and merge patches alike
_VISION_LAYOUT = ("patch_size", "temporal_patch_size", "spatial_merge_size", "in_chans", "in_channels")


def _vision_layout(folder: str) -> dict:
    """The image token id and patch layout of a VLM folder's config.json."""
    data = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    vision = data.get("vision_config") or {}
    top = {"image_token_id": data["image_token_id"]} if "image_token_id" in data else {}
    return {**top, **{k: vision[k] for k in _VISION_LAYOUT if k in vision}}


def check_vlm_critic(cfg) -> None:
    """A vision-language actor's critic (critic.model_path, or the actor's folder) must be a
    VLM that reads the actor's image tokens the same way: a text critic would not see the images."""
    from reinforge.models.vlm_processor import is_vlm_folder

    path = cfg.critic.model_path
    if not path:
        return
    if not is_vlm_folder(path):
        raise ConfigError(f"critic.model_path={path!r} is a text model but model.path={cfg.model.path!r} is a "
                          "vision-language model: the critic would not see the images; use a VLM folder "
                          "(or leave critic.model_path unset: the actor's)")
    mine, theirs = _vision_layout(cfg.model.path), _vision_layout(path)
    # keys both config.json files write (a default left out, or another family's name for it, is not a difference)
    diff = {k: (mine[k], theirs[k]) for k in mine.keys() & theirs.keys() if mine[k] != theirs[k]}
    if diff:
        k = sorted(diff)[0]
        raise ConfigError(f"critic.model_path={path!r}: its {k}={diff[k][1]} differs from model.path's {diff[k][0]}; "
                          "the critic encodes the actor's processed images, so both need the same image tokens "
                          "and patch layout")


def check_vlm_rl(plan: RunPlan) -> None:
    """A vision-language actor (model.path's config.json has a vision_config) trains only where
    the prompts' images reach every forward: a local or Ray run (synchronous, or asynchronous,
    partial rollouts included), the lean/hf rollout, a single turn, no teacher, a critic that is a VLM
    too (check_vlm_critic). Elsewhere the images would be dropped or the model fail to load
    late, so each is refused here, naming its key."""
    from reinforge.models.vlm_processor import is_vlm_folder

    cfg = plan.cfg
    if not is_vlm_folder(cfg.model.path):
        return
    r, why = cfg.rollout, f"model.path={cfg.model.path!r} is a vision-language model"
    refused = [
        (r.backend not in ("lean", "hf"), f"rollout.backend={r.backend}", "its engine does not see the images; use lean or hf"),
        (plan.teacher_enabled, "teacher.coef != 0", "the teacher does not see the images"),
        (r.max_turns > 1, f"rollout.max_turns={r.max_turns}", "the agent loop does not carry the images"),
    ]
    for bad, key, fix in refused:
        if bad:
            raise ConfigError(f"{key}: {why}; {fix}")
    if plan.critic_enabled:
        check_vlm_critic(cfg)


def check_moe_rl(cfg) -> None:
    """actor.router_replay=rollout and actor.router_aux_loss_coef act on a mixture-of-experts
    policy's routers (models/moe.py): refused, naming the key, when model.path's config.json is
    not one of models/moe.MOE_TYPES."""
    from reinforge.models.moe import MOE_TYPES, is_moe_config

    act = cfg.actor
    if act.router_replay == "disabled" and act.router_aux_loss_coef == 0:
        return
    config = json.loads((Path(cfg.model.path) / "config.json").read_text(encoding="utf-8"))
    if not is_moe_config(config):
        key = "actor.router_replay=rollout" if act.router_replay != "disabled" else "actor.router_aux_loss_coef != 0"
        raise ConfigError(f"{key}: model.path={cfg.model.path!r} is not a mixture-of-experts model (model_type "
                          f"{config.get('model_type')!r}; routed: {', '.join(MOE_TYPES)})")


def check_rl_files(plan: RunPlan) -> None:
    """Every file an RL plan names, without building a model; raises ConfigError, DataError or
    ModelLoadError."""
    cfg = plan.cfg
    check_models(cfg, plan.model_folders)
    check_vlm_rl(plan)
    check_moe_rl(cfg)
    if plan.teacher_enabled:
        check_teacher_vocab(cfg)
    from reinforge.rewards.judge import JUDGE_NAME

    for key, spec, style in plan.reward_functions:
        if spec != JUDGE_NAME:  # the judge: reward.judge, checked with the names (check_judge)
            check_reward_function(spec, key, style)
    if cfg.rollout.max_turns > 1:
        from reinforge.agents.loop import agent_parts

        agent_parts(cfg.rollout)  # every tool and the environment imported (ConfigError naming the key)
    if cfg.rollout.agent:
        from reinforge.gateway.rollout import load_agent

        load_agent(cfg.rollout.agent)  # the user's agent imported (ConfigError naming rollout.agent)
    check_reward_rows(plan.reward_functions, [*cfg.data.train_files, *cfg.data.val_files], plan.rows)
    check_lora_targets(cfg)


def check_supervised_files(plan: SupervisedPlan) -> None:
    """Every file an SFT / DPO / RM plan names, without building a model."""
    check_models(plan.cfg, plan.model_folders)
    check_lora_targets(plan.cfg)
    for key, spec, style in plan.reward_functions:
        check_reward_function(spec, key, style)
    if plan.reward_functions:
        check_reward_rows(plan.reward_functions, plan.cfg.eval.prompt_files, plan.rows)
