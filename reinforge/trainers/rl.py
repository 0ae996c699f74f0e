"""The RL trainer: the step of seed 000 on one screen, plus the loop around it (validation,
logging, checkpoints, resume, export, report).

    batch   = rollout.generate(prompts)                # (B, P+T), n samples per prompt
    batch  |= reward.score(batch)                      # token_level_scores
    batch  |= actor.log_probs(batch)                   # old_log_probs (+ entropy), unless on-policy
    batch  |= reference.log_probs(batch)               # when KL is used
    batch  |= teacher.log_probs(batch)                 # on-policy distillation
    batch  |= critic.values(batch)                     # when the estimator needs values
    batch   = apply_kl_in_reward(batch, kl_controller) # when configured
    batch  |= compute_advantages(batch, estimator)
    batch  |= distill_advantages(batch, teacher_cfg)   # on-policy distillation
    metrics = critic.update(batch), actor.update(batch)
    rollout.sync_weights(actor)                        # no-op for the in-process HF rollout
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from reinforge.algos.advantages import NEEDS_BASELINE, NEEDS_TOKEN_STATS
from reinforge.protocol import Batch
from reinforge.rewards.result import RewardResult
from reinforge.trainers import async_rollout, stages
from reinforge.seeding import seed_everything
from reinforge.trainers.checkpoint import (crash_point, latest_checkpoint, load_checkpoint, no_checkpoint, rng_state,
                                           save_checkpoint, set_rng_state, write_export)
from reinforge.trainers.logging import samples_due, write_jsonl
from reinforge.trainers.loop import TrainingLoop
from reinforge.trainers.metrics import batch_metrics, sample_rows
from reinforge.trainers.perf import StageTimer, matmul_params, matmul_peak_flops, rl_step_flops
from reinforge.trainers.inputs import python_inputs
from reinforge.trainers.plan import resolve
from reinforge.trainers.rl_setup import build_components
from reinforge.trainers.state import TrainerState
from reinforge.trainers.validation import prompts_batch, val_progress, validate
from reinforge.workers.role import TrainedRole


class RLTrainer(TrainingLoop):
    def __init__(self, cfg, reward_funcs=None, train_dataset=None, eval_dataset=None):
        """`cfg`: an RLConfig (RLConfig.from_preset("grpo", ...)). The other arguments, for Python
        users, replace reward.functions, data.train_files and data.val_files: reward callables
        in any style, and a datasets.Dataset, a list of dicts or a path (trainers/inputs.py)."""
        seed_everything(cfg.trainer.seed)
        self.plan = resolve(*python_inputs(cfg, reward_funcs, train_dataset, eval_dataset))  # cfg is left as it is
        self.cfg = cfg = self.plan.cfg  # the resolved copy
        c = build_components(self.plan)
        self.tok, self.actor_model, self.critic_model = c.tokenizer, c.actor_model, c.critic_model
        self.rollout, self.reward, self.actor = c.rollout, c.reward, c.actor
        self.reference, self.critic, self.kl_ctrl = c.reference, c.critic, c.kl_ctrl
        self.teacher, self.processor = c.teacher, c.processor  # processor: a VLM actor's (else None)
        self.behaviour_policy = c.behaviour_policy  # None: the producer builds its local copy
        self.loader, self.val_items, self.skipped_prompts = c.loader, c.val_items, c.skipped_prompts
        self.run_dir = Path(cfg.trainer.run_dir)
        weight = next(self.actor_model.parameters())  # on the meta device with trainer.backend=ray
        self.device = str(weight.device) if weight.device.type != "meta" else self.plan.device
        # perf/mfu's peak is measured in the dtype the matmuls run in
        self.matmul_dtype = torch.bfloat16 if cfg.model.autocast == "bf16" else weight.dtype
        self.timer, self.step_idx, self.next_uid = StageTimer(self.device), 0, 0
        # rollout.staleness > 0: the producer thread (started at the first step) and, after a
        # resume, the offset of the first untrained prompt in its loader round
        self.producer, self.resume_offset, self.resume_chunks = None, 0, None
        self.n_params = (matmul_params(self.actor_model),
                         matmul_params(self.critic_model) if self.critic_model is not None else 0)

    # ---- one step -------------------------------------------------------------------------
    def _rollout_round(self) -> tuple[Batch, RewardResult]:
        items = next(self.loader)
        prompts = prompts_batch(items, self.next_uid)
        prompts.meta["policy_version"] = self.step_idx - 1  # the weights after step_idx - 1 completed steps
        self.next_uid += len(items)
        with self.timer("gen"):
            batch = self.rollout.generate(prompts, n=self.cfg.rollout.n, temperature=self.cfg.rollout.temperature)
        with self.timer("reward"):
            reward = self.reward.score(batch)
        return batch | reward.batch(), reward

    def collect_batch(self) -> tuple[Batch, dict[str, float]]:
        """One rollout round, or (dynamic sampling) rounds until enough informative groups.
        The metrics include the reward metrics of every row scored (RewardResult.concat)."""
        a, want = self.cfg.algorithm, self.cfg.data.train_batch_size
        if self.cfg.rollout.staleness > 0:
            if self.producer is None:
                # behaviour_policy: a BehaviourPolicy set by a distributed setup (None: the local copy)
                self.producer = async_rollout.start_producer(self, self.behaviour_policy)
            batch, metrics, reward = async_rollout.collect(
                self.producer, self.reward.score, self.timer, want=want,
                dynamic=a.dynamic_sampling, max_rounds=a.max_gen_rounds if a.dynamic_sampling else 1)
            return batch, {**metrics, **reward.metrics}
        if not a.dynamic_sampling:
            batch, reward = self._rollout_round()
            return batch, dict(reward.metrics)
        kept, results, seen, n_kept, rounds = [], [], 0, 0, 0
        while n_kept < want and rounds < a.max_gen_rounds:
            scored, reward = self._rollout_round()
            b, s, k = stages.keep_informative_groups(scored)
            kept.append(b)
            results.append(reward)
            seen, n_kept, rounds = seen + s, n_kept + k, rounds + 1
        batch = Batch.concat([b for b in kept if len(b)]) if n_kept else Batch()
        if n_kept > want:  # keep exactly `want` groups, in generation order
            keep_ids = torch.unique_consecutive(batch["group_ids"])[:want]
            batch = batch.index(torch.isin(batch["group_ids"], keep_ids).nonzero().flatten().tolist())
        return batch, {"dynamic_sampling/gen_rounds": rounds, "dynamic_sampling/kept_ratio": n_kept / max(seen, 1),
                       "dynamic_sampling/batch_fill": min(n_kept, want) / want, **RewardResult.concat(results).metrics}

    def step(self) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        batch, metrics = self.collect_batch()
        if len(batch) == 0:  # dynamic sampling found no informative group: nothing to learn from
            return {**metrics, **self.timer.pop(), "step/skipped": 1.0}
        if cfg.algorithm.adv_estimator in NEEDS_BASELINE:
            with self.timer("baseline"):
                b_batch, b_metrics = stages.greedy_baseline(batch, self.rollout, self.reward)
            batch, metrics = batch | b_batch, {**metrics, **b_metrics}
        # the plan skips this pass for an on-policy update (trainers/plan.py); a frozen actor has no
        # update pass to report entropy from; the optimal token baseline also reads sum pi^2
        token_stats = cfg.algorithm.adv_estimator in NEEDS_TOKEN_STATS
        if not self.plan.on_policy or self.actor_frozen:
            with self.timer("old_log_prob"):
                batch = batch | self.actor.log_probs(batch, with_sum_pi_squared=token_stats)
        if self.reference is not None:
            with self.timer("ref"):
                batch = batch | self.reference.log_probs(batch)
        if self.teacher is not None:
            with self.timer("teacher"):
                batch = batch | Batch({"teacher_log_probs": self.teacher.log_probs(batch)["ref_log_probs"]})
        if self.critic is not None:
            with self.timer("values"):
                batch = batch | self.critic.values(batch)
        if cfg.algorithm.use_kl_in_reward:
            kl_batch, kl_metrics = stages.apply_kl_in_reward(batch, self.kl_ctrl, cfg.algorithm.kl_penalty)
            batch, metrics = batch | kl_batch, {**metrics, **kl_metrics}
        if cfg.algorithm.overlong_filter:
            f_batch, f_metrics = stages.overlong_filter(batch)
            batch, metrics = batch | f_batch, {**metrics, **f_metrics}
        with self.timer("adv"):
            adv = stages.advantages_stage(batch, cfg.algorithm, value_pretraining=self.value_pretraining)
            if self.teacher is not None:
                adv["advantages"], d_metrics = stages.distill_advantages(batch, adv["advantages"], cfg.teacher)
                metrics.update(d_metrics)
            batch = batch | adv
        if self.critic is not None:
            with self.timer("update_critic"):
                metrics.update(self.critic.update(batch))
        if not self.actor_frozen:
            with self.timer("update_actor"):
                metrics.update(self.actor.update(batch))
        self.rollout.sync_weights(self.actor_model)
        if self.producer is not None:  # the weights trained here: self.step_idx - 1 completed steps
            metrics.update(async_rollout.staleness_metrics(batch, self.step_idx - 1, metrics))
        metrics.update(batch_metrics(batch))
        if samples_due(cfg.trainer.log_samples_every, self.step_idx):
            write_jsonl(self.run_dir / "samples" / f"train_step_{self.step_idx}.jsonl", sample_rows(batch))
        metrics.update(self.timer.pop())
        elapsed = time.perf_counter() - t0
        metrics["timing_s/step"] = elapsed
        tokens = float(batch["attention_mask"].sum())
        metrics["perf/throughput"] = tokens / elapsed
        flops = rl_step_flops(metrics, tokens, *self.n_params, cfg.actor.ppo_epochs, cfg.critic.ppo_epochs)
        metrics["perf/mfu"] = flops / (elapsed * matmul_peak_flops(self.device, self.matmul_dtype))
        return metrics

    @property
    def value_pretraining(self) -> bool:
        return self.step_idx <= self.cfg.algorithm.value_pretrain_steps

    @property
    def actor_frozen(self) -> bool:
        return self.value_pretraining or self.step_idx <= self.cfg.critic.warmup_actor_freeze_steps

    # ---- the loop ---------------------------------------------------------------------------
    def validate(self, logger=None) -> dict[str, float]:
        """Greedy validation, sampled too where val_sampled(); progress on `logger` (RunLogger)."""
        if not self.val_items:
            return {}
        n, sampled = self.cfg.rollout.val_n, self.val_sampled()
        with self.timer("val"), val_progress(logger, len(self.val_items), n, sampled) as progress:
            m = validate(self.rollout, self.reward, self.val_items, n=n,
                         temperature=self.cfg.rollout.val_temperature, pass_k=list(self.cfg.trainer.pass_k),
                         batch_size=self.cfg.data.val_batch_size, sampled=sampled, progress=progress,
                         policy_version=self.step_idx,
                         samples_path=self.run_dir / "samples" / f"step_{self.step_idx}.jsonl")
        return {**m, **self.timer.pop()}

    def sampled_val_cost(self) -> float:
        return 1.0 + self.cfg.rollout.val_n

    @property
    def total_steps(self) -> int:
        return self.cfg.trainer.total_steps

    def first_metrics(self) -> dict[str, float]:
        return {"data/skipped_prompts": float(self.skipped_prompts)}

    def after_step(self) -> None:
        if self.producer is not None:  # also after a skipped step, so versions count steps
            self.producer.publish(self.actor_model, self.step_idx)
        if self.critic is not None and self.step_idx == self.cfg.algorithm.value_pretrain_steps:
            # VAPO: the pretrained critic is kept for later runs (critic.model_path=...), also
            # when this step found nothing to learn from (step/skipped).
            write_export(self.run_dir / "critic_pretrained", lambda folder: self.critic.export(folder, self.tok))

    def export(self) -> Path:
        def write(folder):
            self.actor.export(folder, self.tok)
            if self.processor is not None:  # a VLM's folder needs its image processor too
                from reinforge.models.vlm_processor import save_processor

                save_processor(self.processor, folder)

        return write_export(self.run_dir / "hf", write)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.stop()
        if self.behaviour_policy is not None:
            self.behaviour_policy.close()
        self.reward.close()
        for role in (self.teacher, self.reference, self.critic, self.actor):  # Ray: stops the ranks now, not at exit
            if role is not None:
                role.close()

    # ---- checkpoints --------------------------------------------------------------------------
    def _roles(self) -> dict[str, TrainedRole]:
        """The trained roles by checkpoint name; each writes and reads its own files."""
        return {name: role for name, role in (("actor", self.actor), ("critic", self.critic)) if role is not None}

    def save(self) -> Path:
        state = TrainerState(step=self.step_idx, next_uid=self.next_uid, rng=rng_state(),
                             loader=self.loader.state_dict(),
                             kl_ctrl=self.kl_ctrl.state_dict() if self.kl_ctrl is not None else None)
        writers = [lambda tmp: {n: r.save(tmp) for n, r in self._roles().items()}]
        if self.producer is not None and self.producer.deterministic:
            # where the next chunk to generate starts, and the rows generated but not trained on
            start, chunks = self.producer.state()
            crash_point("async:state")
            writers.append(lambda tmp: torch.save(async_rollout.chunks_to_state(chunks),
                                                  tmp / async_rollout.CHUNKS_FILE))
        elif self.producer is not None:  # timing: the first prompt not yet trained on (async_rollout.Start)
            start = self.producer.resume_point()
        if self.producer is not None:
            state.loader, state.next_uid, state.async_offset = start.loader_state, start.uid, start.offset
        # each role writes its files into the temporary folder and returns its entry of the state
        return save_checkpoint(self.run_dir / "checkpoints", self.step_idx, {}, state.to_dict(), self.plan.to_dict(),
                               self.cfg.trainer.keep_last, writers=tuple(writers))

    def resume(self, path: str | None = None) -> int:
        """Load the latest (or given) checkpoint; returns its step (0 when none exists)."""
        ckpt = Path(path) if path else latest_checkpoint(self.run_dir / "checkpoints")
        if ckpt is None:
            return no_checkpoint(self.run_dir / "checkpoints")
        state = TrainerState.from_dict(load_checkpoint(ckpt, {}))
        self.step_idx, self.next_uid = state.step, state.next_uid
        self.resume_offset = state.async_offset or 0
        chunks = ckpt / async_rollout.CHUNKS_FILE  # a deterministic asynchronous run's rows in flight
        self.resume_chunks = async_rollout.chunks_from_state(torch.load(chunks, weights_only=False)) \
            if chunks.is_file() else None
        self.loader.load_state_dict(state.loader)
        for name, role in self._roles().items():
            role.load(ckpt, state.roles[name])
        # An engine with its own weights (vLLM) was built from model.path before the checkpoint's
        # actor was loaded: without this its first generation would sample the starting weights.
        self.rollout.sync_weights(self.actor_model)
        if self.kl_ctrl is not None and state.kl_ctrl is not None:
            self.kl_ctrl.load_state_dict(state.kl_ctrl)
        set_rng_state(state.rng)
        return self.step_idx
