"""Schema of the data stage: training-set source, the SFT/RL split, chat formatting, benchmarks."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config.common import ConfigError, check_choice, check_range


@dataclass
class BenchmarkSource:
    """Where one benchmark's problems come from, and which fields hold what."""

    hub_id: str = ""
    """Hub dataset id (``load_dataset``); used when ``data.benchmark_source == hub``."""
    hub_split: str = "train"
    """Split of the hub dataset."""
    hub_config: str = ""
    """Dataset config name on the hub (empty: default)."""
    file: str = ""
    """JSONL file name inside ``data.benchmark_dir`` (``benchmark_source == local``)."""
    problem_field: str = "problem"
    """Field holding the problem text."""
    answer_field: str = "answer"
    """Field holding the gold answer."""
    id_field: str = "id"
    """Field holding a stable problem id (empty: ``<name>-<row index>``)."""
    expected_count: int = 0
    """Number of problems the benchmark must have (0: not checked)."""


@dataclass
class DataConfig:
    """Training data (OpenR1-Math-46k-8192 in the LUFFY schema, or the toy world) and benchmarks."""

    source: str = "hub"
    """hub (``load_dataset(hub_id)``), local (``path``: parquet or jsonl) or toy (generated, then loaded as local)."""
    hub_id: str = "Elliott/Openr1-Math-46k-8192"
    """Hub dataset id of the training set."""
    hub_split: str = "train"
    """Split of the hub dataset."""
    hub_revision: str = ""
    """Pinned hub revision (commit); empty = latest (recorded in the manifest either way)."""
    path: str = ""
    """Local parquet/jsonl file in the LUFFY schema (``source == local``)."""
    num_sft_rows: int = 3000
    """Rows in the SFT split; the rest (minus ``num_rl_rows`` cap) go to RL."""
    num_rl_rows: int = -1
    """Cap on RL training rows (-1: all remaining rows)."""
    num_rl_val_rows: int = 64
    """Rows held out of the RL split as ``rl_val.parquet`` (verl's validation set; disjoint from ``rl.parquet``)."""
    split_seed: int = 1234
    """Seed of the SFT/RL split, independent of the training seed."""
    max_length: int = 20000
    """SFT cutoff in tokens (prompt + response); longer rows are truncated and counted."""
    strip_leading_think: str = "auto"
    """Remove the target's leading '<think>\\n' when the generation prompt already ends with it: auto, always, never."""
    invalid_rows: str = "error"
    """error: a malformed row (or one that is not UTF-8) raises naming the file, row and field; skip: drop it and count
    it in the manifest."""
    duplicates: str = "count"
    """count: repeated ids (``extra_info.index``) and problems are counted in the manifest; refuse: they are an error."""
    system_prompt_path: str = ""
    """Optional system prompt file for benchmark prompts; empty = the training rows' own system turn."""
    benchmark_source: str = "hub"
    """hub, local (JSONL files in ``benchmark_dir``) or toy (held-out toy problems)."""
    benchmark_dir: str = ""
    """Folder of benchmark JSONL files (``benchmark_source == local``)."""
    benchmarks: dict[str, BenchmarkSource] = field(default_factory=dict)
    """Benchmarks by name (aime24, aime25, amc, hmmt25 in the paper profile)."""

    def validate(self) -> None:
        check_choice("data.source", self.source, ("hub", "local", "toy"))
        if self.source == "local" and not self.path:
            raise ConfigError("data.path must be set for data.source=local")
        if self.source == "hub" and not self.hub_id:
            raise ConfigError("data.hub_id must be set for data.source=hub")
        check_range("data.num_sft_rows", self.num_sft_rows, 1)
        if self.num_rl_rows != -1:
            check_range("data.num_rl_rows", self.num_rl_rows, 1)
        check_range("data.num_rl_val_rows", self.num_rl_val_rows, 0)
        check_range("data.split_seed", self.split_seed, 0, 2**31 - 1)
        check_range("data.max_length", self.max_length, 16)
        check_choice("data.strip_leading_think", self.strip_leading_think, ("auto", "always", "never"))
        check_choice("data.invalid_rows", self.invalid_rows, ("error", "skip"))
        check_choice("data.duplicates", self.duplicates, ("count", "refuse"))
        check_choice("data.benchmark_source", self.benchmark_source, ("hub", "local", "toy"))
        if self.benchmark_source == "toy" and self.source != "toy":
            raise ConfigError(f"data.benchmark_source=toy needs data.source=toy; got data.source={self.source}")
        if self.benchmark_source == "local" and not self.benchmark_dir:
            raise ConfigError("data.benchmark_dir must be set for data.benchmark_source=local")
        if not self.benchmarks:
            raise ConfigError("data.benchmarks must name at least one benchmark")
        for name, bench in self.benchmarks.items():
            if self.benchmark_source == "hub" and not bench.hub_id:
                raise ConfigError(f"data.benchmarks.{name}.hub_id must be set for data.benchmark_source=hub")
            if self.benchmark_source == "local" and not bench.file:
                raise ConfigError(f"data.benchmarks.{name}.file must be set for data.benchmark_source=local")
            check_range(f"data.benchmarks.{name}.expected_count", bench.expected_count, 0)
