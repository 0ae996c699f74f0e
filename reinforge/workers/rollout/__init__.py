"""Rollout backends: `hf` (transformers generate, in-process) and `vllm` (GPU, optional)."""
from __future__ import annotations


def check_vllm_available(device: str) -> None:
    """Fail at config time, with a clear message, when the vLLM backend cannot run here."""
    from reinforge.config.load import ConfigError

    if not str(device).startswith("cuda"):
        raise ConfigError("rollout.backend='vllm' needs a CUDA GPU (trainer.device resolved to "
                          f"{device!r}); use rollout.backend=hf on CPU")
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise ConfigError("rollout.backend='vllm' needs the vllm package: pip install 'reinforge[vllm]'") from None
