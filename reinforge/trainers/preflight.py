"""`preflight(cfg)`: every check of a training config that builds no model. Each trainer's
constructor runs it first, so the CLI and a Python user get the same one-line errors before any
model loads. A failure leaves the run directory untouched.

0. Hub ids among the model paths (`org/name[@revision]`) resolved to their local snapshot
   folders, in place (reinforge.models.hub), so that every later check reads files on disk;
1. the config's own rules: validate / validate_sft / validate_preference (ranges, names,
   batch sizes, data files exist; fills cfg.derived);
2. the model folders' files: config.json, safetensors headers against file sizes, tokenizer
   files (reinforge.models.checks; reads files only);
3. the reward functions: each imported, checked callable in its style (reinforge, veRL, TRL);
4. RL with LoRA: every model.lora_target_modules entry names modules of the weights (headers).
"""
from __future__ import annotations

import json
from pathlib import Path

from reinforge.config.load import ConfigError
from reinforge.config.validate import check_model_path
from reinforge.models.checks import check_model_files, check_tokenizer_files, missing_modules, weight_names
from reinforge.models.hub import resolve_model_paths


def _validate(cfg) -> None:
    from reinforge.config.preference import validate_preference
    from reinforge.config.schema import RLConfig
    from reinforge.config.sft import SFTConfig, validate_sft
    from reinforge.config.validate import validate

    if isinstance(cfg, RLConfig):
        validate(cfg)
    elif isinstance(cfg, SFTConfig):
        validate_sft(cfg)
    else:
        validate_preference(cfg)


def model_folders(cfg) -> list[tuple[str, str]]:
    """(dotted key, folder) of every model the run will load: the policy, and the critic, the
    reward model (RL) or the DPO reference when they are set."""
    out = {"model.path": cfg.model.path}
    if hasattr(cfg, "critic") and cfg.derived.get("critic_enabled"):
        out["critic.model_path"] = cfg.critic.model_path
    if hasattr(cfg, "reward"):
        out["reward.reward_model_path"] = cfg.reward.reward_model_path
        out["reward.judge.model_path"] = cfg.reward.judge.model_path  # set only when `judge` is used (validate)
    if hasattr(cfg, "dpo"):
        out["dpo.ref_model_path"] = cfg.dpo.ref_model_path
    if hasattr(cfg, "teacher") and cfg.derived.get("teacher_enabled"):
        out["teacher.path"] = cfg.teacher.path
    return [(k, v) for k, v in out.items() if v]


def reward_functions(cfg) -> list[tuple[str, str, str | None]]:
    """(dotted key, spec, forced style or None) of every reward function the run may call (RL
    reward, SFT/DPO eval)."""
    if hasattr(cfg, "reward"):
        return [(f"reward.functions[{i}].name", f["name"], f.get("style")) for i, f in enumerate(cfg.reward.functions)]
    if hasattr(cfg, "eval"):
        return [(f"eval.reward_functions[{i}].name", f["name"], f.get("style"))
                for i, f in enumerate(cfg.eval.reward_functions)]
    return []


def check_reward_function(spec: str, key: str, style: str | None = None) -> None:
    """Import reward function `spec` and check that it can be called in its style (`style`
    forces one); ConfigError naming `key` if not."""
    from reinforge.rewards.registry import check_reward_signature, load_reward_fn

    try:
        check_reward_signature(load_reward_fn(spec), spec, style)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def check_lora_targets(cfg) -> None:
    """RL with LoRA: each target module exists in model.path (read from the safetensors
    headers), so a typo fails here rather than in PEFT after the model has loaded."""
    m = cfg.model
    if not hasattr(cfg, "actor") or m.lora_rank == 0 or list(m.lora_target_modules) == ["all-linear"]:
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


def preflight(cfg):
    """Check `cfg` (RL, SFT, DPO or RM) and every file it names without building a model;
    raises ConfigError, DataError or ModelLoadError. Returns the same (validated) config."""
    hub_ids = resolve_model_paths(cfg)
    _validate(cfg)
    if hub_ids:  # recorded in config.yaml next to the snapshot folders that replaced them
        cfg.derived["hub_ids"] = hub_ids
    folders = model_folders(cfg)
    for key, folder in folders:
        check_model_path(folder, key)
        check_model_files(folder, key)
    m = cfg.model
    if m.tokenizer_path:
        check_tokenizer_files(m.tokenizer_path, "model.tokenizer_path", m.trust_remote_code)
    else:
        check_tokenizer_files(m.path, "model.path", m.trust_remote_code,
                              fix="copy the tokenizer files into it or set model.tokenizer_path")
    for key in ("reward.reward_model_path", "reward.judge.model_path"):
        if dict(folders).get(key):  # the reward model and the judge read text with their own tokenizers
            check_tokenizer_files(dict(folders)[key], key)
    if "teacher.path" in dict(folders):
        check_teacher_vocab(cfg)
    for key, spec, style in reward_functions(cfg):
        if not (hasattr(cfg, "reward") and spec == "judge"):  # the judge: reward.judge, checked above
            check_reward_function(spec, key, style)
    if hasattr(cfg, "rollout") and cfg.rollout.max_turns > 1:
        from reinforge.agents.loop import agent_parts

        agent_parts(cfg.rollout)  # every tool and the environment imported (ConfigError naming the key)
    check_lora_targets(cfg)
    return cfg
