"""The critic and the reward model of a vision-language policy: the VLM's backbone (vision tower
+ language model) with a scalar head on the language model's last hidden states.

transformers has no `<VLM>ForTokenClassification`, so `load_critic` builds this one for a VLM
folder (models/loading.py): `AutoModel` gives the backbone without its LM head (Qwen2-VL's
`Qwen2VLModel`, whose `visual` and `get_image_features` models/vlm_forward.py reads), and
`score` is a Linear(H, 1) initialised as the text critic's: from a policy the head is new
(std 1e-3, zero bias: early values near zero); from a critic or a reward model this class
saved (its folder has a value_head.safetensors) the head is kept unless `reinit_head`.

The reward model (`reinforge rm` on a VLM folder, `load_vlm_reward_model`) is the same module
with a bias-free head, as transformers' `<Arch>ForSequenceClassification` has: new from a policy
(std = the language model's initializer_range, as transformers draws a new head), kept from an
earlier reward model. Its score is the head at a row's last scored token
(models/reward_head.last_token_scores with the rows' `vision`); a critic started from it keeps
its head (bias-free), as a text critic from a text reward model does.

Values come from forward.response_values given the rows' `vision`, with the inputs the actor's padded
forward builds (forward.response_logprobs, vlm_forward.image_inputs):
the prompt's image placeholders take the image features (encoded once per distinct prompt,
kept on the PromptImages while the tower is frozen), a placeholder sampled in a response stays
text, and positions are M-RoPE's (3, B, L) from the attention mask, so a row's values do not
depend on its batch's padding.

Saved (`save_pretrained`) as a folder: the backbone's own `save_pretrained` (config.json and its
weights, which `AutoModel` reads back) and value_head.safetensors (`weight` (1, H), and a
critic's `bias` (1,)); a Ray run's ranks stream the same layout (distributed/weights.save_hf).
A checkpoint's critic.safetensors (workers/role.py) holds both under `model.` and `score.`.

Shapes: B rows, L = P + T tokens, T response tokens, H hidden.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers.modeling_outputs import TokenClassifierOutput

HEAD_FILE = "value_head.safetensors"


class VisionValueModel(torch.nn.Module):
    """`model`: a VLM backbone (vision tower + language model, no LM head); `score`: (H -> 1)."""

    def __init__(self, backbone, bias: bool = True):
        super().__init__()
        self.model = backbone
        self.config = backbone.config
        hidden = self.config.get_text_config().hidden_size
        param = next(backbone.parameters())
        self.score = torch.nn.Linear(hidden, 1, bias=bias, device=param.device, dtype=param.dtype)

    @property
    def base_model(self):
        """The backbone, under the name transformers' models give it (models/reward_head.py reads
        the last hidden states from it)."""
        return self.model

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def get_output_embeddings(self):
        return None  # no LM head: every parameter but the input embedding takes part in matmuls

    def activation_checkpointing_enable(self, **kwargs):
        self.model.activation_checkpointing_enable(**kwargs)

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                use_cache=False, **kwargs) -> TokenClassifierOutput:
        """-> logits (B, L, 1): the value head on every position's last hidden state."""
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs).last_hidden_state
        return TokenClassifierOutput(logits=self.score(hidden))

    def save_pretrained(self, folder) -> None:
        from safetensors.torch import save_file

        self.model.save_pretrained(folder)
        save_file({k: v.contiguous() for k, v in self.score.state_dict().items()}, str(Path(folder) / HEAD_FILE))


def load_scalar_model(path: str, *, dtype: torch.dtype, trust_remote_code: bool, attn_implementation: str,
                      reinit_head: bool, load, bias: bool, std: float | None) -> VisionValueModel:
    """VLM folder `path`'s backbone with a scalar head, on the CPU. The head is read from the folder's value_head.safetensors when there is one and
    not `reinit_head`; otherwise it is new: `bias` or not, weight ~ N(0, std) (std None: the
    language model's initializer_range), zero bias. `load`: the loader's from_pretrained guard
    (loading._from_pretrained, which names a corrupt weight file)."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    head_file = Path(path) / HEAD_FILE
    kept = head_file.is_file() and not reinit_head
    backbone = load(AutoModel.from_pretrained, path, dtype=dtype, trust_remote_code=trust_remote_code,
                    attn_implementation=attn_implementation, local_files_only=True)
    head = load_file(str(head_file)) if kept else {}
    model = VisionValueModel(backbone, bias="bias" in head if kept else bias)
    if kept:
        model.score.load_state_dict(head)
    else:
        if std is None:
            std = getattr(model.config.get_text_config(), "initializer_range", 0.02)
        torch.nn.init.normal_(model.score.weight, std=std)
        if model.score.bias is not None:
            torch.nn.init.zeros_(model.score.bias)
    return model


def load_vlm_critic(path: str, *, dtype: torch.dtype, trust_remote_code: bool, attn_implementation: str,
                    reinit_head: bool, load) -> VisionValueModel:
    """The value model of VLM folder `path` (module docstring), on the CPU: a new head with
    small weights (std 1e-3, zero bias) so early values are near zero."""
    return load_scalar_model(path, dtype=dtype, trust_remote_code=trust_remote_code,
                             attn_implementation=attn_implementation, reinit_head=reinit_head, load=load,
                             bias=True, std=1e-3)


def load_vlm_reward_model(path: str, *, dtype: torch.dtype, trust_remote_code: bool, attn_implementation: str,
                          load) -> VisionValueModel:
    """The reward model of VLM folder `path` (module docstring), on the CPU: its head kept when
    the folder has one, else a new bias-free head (a policy's folder, for `reinforge rm`)."""
    return load_scalar_model(path, dtype=dtype, trust_remote_code=trust_remote_code,
                             attn_implementation=attn_implementation, reinit_head=False, load=load,
                             bias=False, std=None)
