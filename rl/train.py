"""RL stage entry point: ``python -m rl.train rl.init=<base|sft-label> [rl.init_run=<SFT run folder>] [overrides]``.

One run = one variant: check the inputs (preflight), run ``python -m verl.trainer.main_ppo`` with the overrides
of ``rl/verl_args.py`` as a subprocess (its log teed to ``verl.log``, its per-step metrics copied into
``metrics.jsonl`` with generation / training / validation timings kept apart), merge the final actor to
``hf/`` and write the manifest. Re-running resumes: verl's ``resume_mode=auto`` continues from the newest
checkpoint in ``checkpoints/``; a finished training run goes straight to the merge.

Ray: a local cluster started by verl, or the cluster at ``RAY_ADDRESS`` (GPU profile; docs/rl.md has the
multi-node recipe). verl and every process it starts carry this run's owner mark (:func:`verl_owner`) and get
SIGTERM when this stage dies; on failure, Ctrl-C, SIGTERM or SIGHUP they are all stopped, what outlives verl is
stopped after it exits, and a rerun first stops what an earlier attempt left. A verl whose Ray node timed out during
start-up is started again (:func:`run_verl_retrying_ray_start`). Dynamic sampling is bounded by
``rl.max_gen_batches`` (``rl/dapo_sampler.py``; its generation batches show on the progress bar). A verl that stops
or hangs after saving the checkpoint of the last step has finished training; the step records it logged are
recovered from its own files (:func:`recover_verl_metrics`).
"""
from __future__ import annotations

import json
import os
import random
import re
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable


from common.config import Config, stage_main
from common.manifest import Manifest, input_records, read_manifest, stage_run
from common.paths import (
    BASE_VARIANT,
    HF_EXPORT,
    LORA_ADAPTER,
    RL_GROUPS_KEPT,
    TRAINING_METRICS_FILE,
    configured_rl_run,
    hf_export_dir,
    lora_adapter_dir,
    rl_start,
    trained_method,
)
from common.processes import owner_token, start_in_new_session, stop_owned, stop_tree
from common.seeding import derive_seed
from common.tracking import MetricsLogger, dapo_groups_kept, progress, read_metrics
from rl.export import check_hf_export, latest_checkpoint_step, merge_actor, merge_lora_adapter
from rl.verl_args import (
    CHECKPOINT_SUBDIR,
    DAPO_PROGRESS_PREFIX,
    DAPO_STOPPED_PREFIX,
    build_command,
    data_files,
    init_model_path,
    resolve_variant,
    verl_env,
)

VERL_LOG = "verl.log"
VERL_METRICS_SUBDIR = "verl_metrics"
"""One JSONL per launch from verl's file logger (it truncates its file, so each resume gets a new one)."""
PHASE_TIMINGS = {"generation": "timing_s/gen", "reward": "timing_s/reward", "old_log_prob": "timing_s/old_log_prob",
                 "training": "timing_s/update_actor", "weight_sync": "timing_s/update_weights",
                 "checkpoint": "timing_s/save_checkpoint", "validation": "timing_s/testing", "step": "timing_s/step"}
"""Phase -> verl timing key. ``timing_s/step`` includes checkpointing but not validation (V1 trainer)."""
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - ")
"""verl's console logger line of a finished step (Ray prefixes it with the actor name)."""
KILL_GRACE_S = 10.0
FINISH_GRACE_S = 180.0
"""Seconds verl may take to exit after logging its last step with that step's checkpoint saved; then it is stopped
and the run counts as trained (verl 0.9.1 was seen printing nothing after its final checkpoint until stopped)."""
DAPO_PROGRESS = re.compile(re.escape(DAPO_PROGRESS_PREFIX) + r"step (\d+): generation batch (\d+): (\d+)/(\d+) mixed")
"""The dynamic-sampling line after each generation batch (``rl/dapo_sampler.py``)."""
RAY_START_FAILURE = "The current node timed out during startup"
"""ray.init's error when its raylet has not registered within Ray's fixed 30 s (ray/_private/node.py)."""
RAY_START_ATTEMPTS = 3
VLLM_ENGINE_DIED = "EngineCore encountered a fatal error"
"""vLLM's log line when its engine core process fails (vllm/v1/engine/core.py); verl's rollout then fails with an
unrelated error or waits for generations that never come."""
RAY_MEMORY_KILL = re.compile(r"were killed due to the node running low on memory\..*? was (\S+ used / \S+ limit)")
"""Ray's memory monitor's error when it killed workers (ray.exceptions.OutOfMemoryError); group 1: used / limit."""


class RLError(RuntimeError):
    """The RL stage cannot run or did not finish; the message says what to fix."""


class RayStartFailed(RLError):
    """verl died in ``ray.init`` before any step: Ray's node did not start in time (a loaded machine, e.g. another
    Ray instance starting beside it). Nothing was trained, so starting verl again is safe."""


# ------------------------------------------------------------------------------------------- preflight
def _check_parquet(path: Path, min_rows: int) -> int:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise RLError(f"cannot read RL data {path}: {exc}") from exc
    missing = [name for name in REQUIRED_COLUMNS if name not in table.column_names]
    if missing:
        raise RLError(f"{path} lacks verl's RL columns {missing} (has {table.column_names})")
    first = table.slice(0, 1).to_pylist()
    if not first or "ground_truth" not in (first[0]["reward_model"] or {}):
        raise RLError(f"{path}: reward_model.ground_truth missing in row 0")
    if not isinstance(first[0]["prompt"], list) or not first[0]["prompt"]:
        raise RLError(f"{path}: row 0 'prompt' must be a non-empty list of chat messages")
    if table.num_rows < min_rows:
        raise RLError(f"{path} has {table.num_rows} rows, fewer than rl.train_batch_size={min_rows}")
    return table.num_rows


def _check_gpus(cfg: Config) -> None:
    """GPU profile: Ray (the cluster at RAY_ADDRESS, or this node) must offer nnodes x nproc_per_node GPUs."""
    needed = cfg.profile.nnodes * cfg.profile.nproc_per_node
    if os.environ.get("RAY_ADDRESS"):
        import ray

        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        try:
            available = int(ray.cluster_resources().get("GPU", 0))
            nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        finally:
            ray.shutdown()
        where = f"the Ray cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']} ({nodes} live nodes)"
    else:
        import torch

        if cfg.profile.nnodes > 1:
            raise RLError(f"profile.nnodes={cfg.profile.nnodes} needs a running Ray cluster: start it as in "
                          "docs/rl.md and export RAY_ADDRESS")
        available, where = torch.cuda.device_count(), "this machine (no RAY_ADDRESS)"
    if available < needed:
        raise RLError(f"{where} has {available} GPUs; profile.nnodes x profile.nproc_per_node = {needed}")


def preflight(cfg: Config, variant: str) -> dict[str, Any]:
    """Fails fast, before Ray starts, with what to fix: upstream manifests, model, parquet files, devices."""
    facts: dict[str, Any] = {}
    model_path = init_model_path(cfg)
    input_records(configured_rl_run(cfg).inputs)  # the data and start-model runs: complete, outputs intact
    is_hub_id = variant == BASE_VARIANT and cfg.model.source == "hub" and not model_path.exists()
    if not is_hub_id:
        if cfg.model.source == "gguf" and variant == BASE_VARIANT:
            raise RLError("rl.init=base with a gguf model: verl needs safetensors; RL from an SFT export instead")
        if not (model_path / "config.json").is_file():
            raise RLError(f"start model {model_path} has no config.json (rl.init={variant})")
    train_file, val_file = data_files(cfg)
    facts["rl_rows"] = _check_parquet(train_file, cfg.rl.train_batch_size)
    facts["rl_val_rows"] = _check_parquet(val_file, 1)
    if cfg.profile.device == "cuda":
        _check_gpus(cfg)
    else:
        from rl.verl_cpu_plugin import check_versions

        check_versions()
    return facts


# ------------------------------------------------------------------------------------ the verl process
class StallWatchdog:
    """Calls ``on_stall`` once when verl shows no progress for ``timeout_s`` seconds (0: never).

    Progress is any output line until the first finished step, and after it a finished step or a finished generation
    batch of dynamic sampling: start-up (Ray, workers, the vLLM server) takes minutes on a loaded machine but prints
    as it goes, while a run waiting on a dead Ray actor or a hung collective logs neither even if Ray keeps printing."""

    def __init__(self, timeout_s: float, on_stall: Callable[[], None], poll_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.timeout_s, self.on_stall, self.poll_s, self.clock = timeout_s, on_stall, poll_s, clock
        self.fired = False
        self.stepping = False
        self._last = clock()
        self._done = threading.Event()
        if timeout_s > 0:
            threading.Thread(target=self._watch, daemon=True).start()

    def saw_line(self, is_step: bool, is_progress: bool = False) -> None:
        self.stepping = self.stepping or is_step
        if is_step or is_progress or not self.stepping:
            self._last = self.clock()

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(min(self.poll_s, self.timeout_s)):
            if self.clock() - self._last > self.timeout_s:
                self.fired = True
                self.on_stall()
                return


class _MetricsCopier:
    """Copies verl's per-step JSONL records into our metrics file as they appear (one line per step)."""

    def __init__(self, source: Path, logger: MetricsLogger):
        self.source, self.logger, self.offset, self.last_step, self.last_record = source, logger, 0, 0, {}
        self._lock = threading.Lock()  # polled by the console reader and, at the end, by run_verl

    def poll(self) -> None:
        if not self.source.exists():
            return
        with self._lock, open(self.source, "rb") as handle:
            handle.seek(self.offset)
            for line in handle:
                if not line.endswith(b"\n"):
                    break
                self.offset += len(line)
                record = json.loads(line)
                self.last_step, self.last_record = int(record["step"]), record["data"]
                self.logger.log(self.last_step, record["data"])


class _VerlConsole:
    """Follows verl's console output: tees it to ``verl.log``, shows each step and each generation batch of dynamic
    sampling on the progress bar, tells the stall watchdog about progress, starts the finish timer once the last
    step is logged with its checkpoint saved, stops verl (``stop_verl``) once vLLM's engine has died, and remembers
    why verl stopped (dynamic sampling, Ray's start-up, Ray's memory monitor, vLLM's engine)."""

    def __init__(self, cfg: Config, log, bar, copier: _MetricsCopier, watchdog: StallWatchdog,
                 finish: threading.Timer, checkpoints: Path, stop_verl: Callable[[], None]):
        self.cfg, self.log, self.bar, self.copier, self.watchdog = cfg, log, bar, copier, watchdog
        self.finish, self.checkpoints, self.stop_verl = finish, checkpoints, stop_verl
        self.engine_died = False
        self.ray_did_not_start = False
        self.sampling_stopped = ""
        self.memory_used = ""
        """Ray's "<used> used / <limit> limit" when its memory monitor killed verl's workers."""

    def follow(self, stream) -> None:
        for line in stream:
            self.line(line)

    def line(self, line: str) -> None:
        total = self.cfg.rl.total_steps
        self.log.write(line)
        step = STEP_LINE.search(line)
        sampling = DAPO_PROGRESS.search(line)
        if step:
            self.log.flush()
            self.copier.poll()
            # the note first: the update draws the bar, so a note set after it shows with the next step
            self.bar.set_postfix_str(step_postfix(self.copier.last_record, self.cfg), refresh=False)
            self.bar.update(max(0, self.copier.last_step - self.bar.n))
            if int(step.group(1)) >= total and not self.finish.is_alive() and \
                    latest_checkpoint_step(self.checkpoints) >= total:
                self.finish.start()  # all that is left is verl's shutdown
        elif sampling:
            at_step, batch, kept, needed = sampling.groups()
            self.bar.set_postfix_str(f"step {at_step}: generation batch {batch}, {kept}/{needed} groups kept")
        if DAPO_STOPPED_PREFIX in line:
            self.sampling_stopped = line.split(DAPO_STOPPED_PREFIX, 1)[1].strip()
        if memory := RAY_MEMORY_KILL.search(line):
            self.memory_used = memory.group(1)
        if VLLM_ENGINE_DIED in line and not self.engine_died:
            self.engine_died = True
            self.stop_verl()
        self.watchdog.saw_line(step is not None, is_progress=sampling is not None)
        self.ray_did_not_start = self.ray_did_not_start or (RAY_START_FAILURE in line and not self.watchdog.stepping)


def run_verl(cfg: Config, variant: str, stage: Path, already_done: int) -> int:
    """Runs main_ppo to ``rl.total_steps`` (resuming); returns the newest checkpointed step. Raises on failure, unless
    verl had saved the checkpoint of the last step (then training is done, whatever came after)."""
    command = build_command(cfg)
    env = {**os.environ, **verl_env(cfg)}
    if cfg.profile.device == "cpu":
        # The CPU profile always runs a local Ray (fake GPUs, logical CPUs); vLLM runs as verl starts it.
        for name in ("RAY_ADDRESS", "VLLM_ENABLE_V1_MULTIPROCESSING"):
            env.pop(name, None)
    metrics_dir = stage / VERL_METRICS_SUBDIR
    metrics_dir.mkdir(parents=True, exist_ok=True)
    attempt = len(list(metrics_dir.glob("attempt_*.jsonl")))
    env["VERL_FILE_LOGGER_PATH"] = str((metrics_dir / f"attempt_{attempt}.jsonl").resolve())
    log_path = stage / VERL_LOG
    checkpoints = stage / CHECKPOINT_SUBDIR
    owner = verl_owner(stage)
    with open(log_path, "a", encoding="utf-8") as log, \
            MetricsLogger(stage / TRAINING_METRICS_FILE, wandb_mode="disabled") as metrics, \
            progress(total=cfg.rl.total_steps, initial=already_done, desc=f"rl/{variant}", unit="step",
                     enabled=cfg.logging.progress) as bar:
        log.write(f"\n# attempt {attempt} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n$ {' '.join(command)}\n")
        log.flush()
        copier = _MetricsCopier(Path(env["VERL_FILE_LOGGER_PATH"]), metrics)

        def stop_verl() -> None:
            stop_tree(process, KILL_GRACE_S, owner=owner)

        def stop_after_the_last_step() -> None:
            finished.set()
            stop_verl()

        # Everything that can take time comes before the start, so a signal after it lands inside the try
        # (the watchdog and the finish timer read `process` only when they fire, seconds later).
        watchdog = StallWatchdog(cfg.rl.stall_timeout_s, stop_verl)
        finished = threading.Event()
        finish = threading.Timer(FINISH_GRACE_S, stop_after_the_last_step)
        finish.daemon = True
        console = _VerlConsole(cfg, log, bar, copier, watchdog, finish, checkpoints, stop_verl)
        process = start_in_new_session(command, env, owner=owner)
        try:
            reader = threading.Thread(target=console.follow, args=(process.stdout,), daemon=True)
            reader.start()
            returncode = process.wait()
            stop_owned(owner, KILL_GRACE_S)  # what outlived verl (a local Ray cluster's processes) is not waited for
            reader.join(timeout=KILL_GRACE_S)
        except BaseException:
            stop_tree(process, KILL_GRACE_S, owner=owner)
            raise
        finally:
            watchdog.stop()
            finish.cancel()
            copier.poll()
        done = latest_checkpoint_step(checkpoints)
        if returncode != 0 and done >= cfg.rl.total_steps:
            how = (f"did not exit within {FINISH_GRACE_S:.0f} s of logging that step" if finished.is_set()
                   else f"then showed no progress for {cfg.rl.stall_timeout_s:.0f} s" if watchdog.fired
                   else f"then exited with {returncode}")
            print(f"[rl/{variant}] verl saved the checkpoint of its last step ({done}) and {how}; it was stopped and "
                  "training counts as done", file=sys.stderr, flush=True)
        elif returncode != 0:
            if console.sampling_stopped:
                raise RLError(console.sampling_stopped)
            tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            rerun = f"the rerun resumes from the checkpoint of step {done}" if done else "the rerun starts it again"
            if console.memory_used:
                reason = (f"Ray killed verl's workers because the machine ran low on memory ({console.memory_used}): "
                          f"run fewer RL runs or other jobs beside this one (experiment.parallel=1); {rerun}")
            elif console.engine_died:
                reason = (f"vLLM's rollout engine died inside verl (\"{VLLM_ENGINE_DIED}\" in {VERL_LOG}: e.g. killed "
                          f"for memory, or its processes paused past vLLM's timeouts), so verl was stopped; {rerun}")
            elif watchdog.fired:
                reason = (f"verl showed no progress for {cfg.rl.stall_timeout_s:.0f} s (rl.stall_timeout_s: no output "
                          "line during start-up, no new step or generation batch after it) and was stopped; a Ray "
                          "actor may have died (e.g. killed for memory)")
            else:
                reason = f"verl exited with {returncode}"
            failure = RayStartFailed if console.ray_did_not_start else RLError
            raise failure(f"{reason}; last lines of {log_path}:\n" + "\n".join(tail))
    return done


def verl_owner(stage: Path) -> str:
    """The owner mark of verl and the Ray cluster it starts for the run in ``stage`` (``common.processes``)."""
    return owner_token(f"rl:{stage.resolve()}")


def recover_verl_metrics(stage: Path) -> list[int]:
    """Appends to ``metrics.jsonl`` the step records that verl's own logs (``verl_metrics/attempt_*.jsonl``, the newest
    attempt's record of a step winning) hold and it lacks: verl logged them, but the copy was cut (the RL stage
    stopped or killed right after); returns their steps."""
    logged = {record["step"] for record in read_metrics(stage / TRAINING_METRICS_FILE)}
    found: dict[int, dict[str, Any]] = {}
    attempts = sorted((stage / VERL_METRICS_SUBDIR).glob("attempt_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    for path in attempts:
        with open(path, "rb") as handle:
            for line in handle:
                if line.endswith(b"\n"):  # a line cut by a kill is not a record
                    record = json.loads(line)
                    found[int(record["step"])] = record["data"]
    missing = sorted(set(found) - logged)
    if missing:
        with MetricsLogger(stage / TRAINING_METRICS_FILE, wandb_mode="disabled") as metrics:
            for step in missing:
                metrics.log(step, found[step])
    return missing


def step_postfix(record: dict[str, Any], cfg: Config) -> str:
    """The progress bar's note on verl's newest step: its mean reward and, with group filtering, the share of the
    prompt groups judged at that step that DAPO kept (:func:`common.tracking.dapo_groups_kept`)."""
    parts = []
    if isinstance(record.get("critic/score/mean"), (int, float)):
        parts.append(f"reward {record['critic/score/mean']:+.2f}")
    kept_per_step = cfg.rl.kept_groups_per_step
    if kept_per_step is not None:
        parts.append(f"groups kept {dapo_groups_kept({1: record}, kept_per_step):.0%}")
    return ", ".join(parts)


def run_verl_retrying_ray_start(cfg: Config, variant: str, stage: Path, already_done: int,
                                pause_s: float = 30.0) -> int:
    """:func:`run_verl`, started again (up to ``RAY_START_ATTEMPTS`` in all) when Ray's node timed out during
    start-up, after a random pause of up to ``pause_s`` seconds so that two runs that collided start apart."""
    for attempt in range(1, RAY_START_ATTEMPTS):
        try:
            return run_verl(cfg, variant, stage, already_done)
        except RayStartFailed:
            pause = random.uniform(0.0, pause_s)
            print(f"[rl/{variant}] Ray's node timed out during start-up (attempt {attempt} of {RAY_START_ATTEMPTS}); "
                  f"starting verl again in {pause:.0f} s", file=sys.stderr, flush=True)
            time.sleep(pause)
    return run_verl(cfg, variant, stage, already_done)


# -------------------------------------------------------------------------------------------- summaries
def summarize_metrics(records: list[dict[str, Any]], filtered_groups_per_step: int | None = None) -> dict[str, Any]:
    """Headline numbers: first/last mean training score, the last validation scores, seconds per phase, and with
    group filtering (``filtered_groups_per_step``: ``rl.train_batch_size``) the share of the groups DAPO kept."""
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:  # a resumed run repeats the steps after its last checkpoint; the later record wins
        by_step[record["step"]] = record
    steps = [by_step[s] for s in sorted(by_step) if s > 0 and "timing_s/step" in by_step[s]]
    summary: dict[str, Any] = {"steps_logged": len(steps)}
    if filtered_groups_per_step is not None and steps:
        summary[RL_GROUPS_KEPT] = dapo_groups_kept({r["step"]: r for r in steps}, filtered_groups_per_step)
    scores = [r["critic/score/mean"] for r in steps if isinstance(r.get("critic/score/mean"), (int, float))]
    if scores:
        summary["train_score_first"], summary["train_score_last"] = scores[0], scores[-1]
    validation = [(s, r) for s, r in sorted(by_step.items()) if any(k.startswith("val-core/") for k in r)]
    if validation:
        step, record = validation[-1]
        summary["val_step"] = step
        summary.update({k: v for k, v in record.items() if k.startswith("val-core/")})
    for phase, key in PHASE_TIMINGS.items():
        values = [r[key] for r in by_step.values() if isinstance(r.get(key), (int, float))]
        if values:
            summary[f"time_{phase}_s_total"] = round(sum(values), 2)
            summary[f"time_{phase}_s_mean"] = round(sum(values) / len(values), 3)
    return summary


# ------------------------------------------------------------------------------------------------- run
def run(cfg: Config) -> Manifest:
    """RL from ``rl.init`` (or the configured SFT method) to ``rl/<model>/<variant>/hf``; returns the manifest."""
    variant = resolve_variant(cfg)
    spec = configured_rl_run(cfg)
    stage = spec.directory
    facts = preflight(cfg, variant)
    model_path = init_model_path(cfg)
    method = trained_method(rl_start(cfg)[1])  # the start model's SFT method, from its run's manifest
    seeds = {purpose: derive_seed(cfg.seed, f"rl/{purpose}") for purpose in ("data", "train", "minibatch", "rollout")}
    with stage_run(stage, stage="rl", variant=spec.variant, config=spec.config, inputs=spec.inputs,
                   seeds=seeds) as current:
        if current is None:
            return read_manifest(stage)
        strays = stop_owned(verl_owner(stage), KILL_GRACE_S)
        if strays:
            print(f"[rl/{spec.variant}] stopped {len(strays)} process(es) an earlier attempt of this run left running "
                  f"(verl and its Ray cluster; PIDs {', '.join(map(str, strays))})", flush=True)
        checkpoint_dir = stage / CHECKPOINT_SUBDIR
        done = latest_checkpoint_step(checkpoint_dir)
        current.manifest.details.update({"init": variant, "init_model": str(model_path), "algorithm": cfg.rl.algorithm,
                                         **facts,
                                         "sft_method": asdict(method) if method is not None else None,
                                         "verl_command": build_command(cfg),
                                         "verl_env": verl_env(cfg)})
        current.checkpoint()
        if done < cfg.rl.total_steps:
            done = run_verl_retrying_ray_start(cfg, variant, stage, done)
        if done != cfg.rl.total_steps:
            raise RLError(f"verl stopped with its newest checkpoint at step {done}, not rl.total_steps="
                          f"{cfg.rl.total_steps}; see {stage / VERL_LOG}")
        hf_dir = hf_export_dir(stage)
        merge_actor(checkpoint_dir, done, hf_dir, {**os.environ, **verl_env(cfg)}, stage / VERL_LOG)
        if merge_lora_adapter(hf_dir, lora_adapter_dir(stage)):
            current.add_output(LORA_ADAPTER, f"the LoRA actor's adapter alone (step {done}), merged into {HF_EXPORT}/")
        export = check_hf_export(hf_dir)
        current.manifest.details["export"] = export
        recovered = recover_verl_metrics(stage)
        if recovered:
            print(f"[rl/{spec.variant}] recovered the metrics of steps {recovered} from verl's own logs "
                  f"({VERL_METRICS_SUBDIR}/)", flush=True)
            current.manifest.details["metrics_recovered_steps"] = recovered
        current.manifest.metrics = summarize_metrics(read_metrics(stage / TRAINING_METRICS_FILE),
                                                     cfg.rl.kept_groups_per_step)
        current.manifest.metrics["final_step"] = done
        current.add_output(HF_EXPORT, f"merged final actor (step {done}, {export['dtype']}), for evaluation")
        current.add_output(CHECKPOINT_SUBDIR, "verl FSDP checkpoints (resume_mode=auto)", verify=False)
        current.add_output(TRAINING_METRICS_FILE, "verl per-step metrics incl. timing_s/{gen,update_actor,testing}")
        current.add_output(VERL_LOG, "verl console log, every attempt", verify=False)
    return read_manifest(stage)


main = stage_main(run)


if __name__ == "__main__":
    main()
