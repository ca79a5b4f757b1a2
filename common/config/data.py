"""Schema of the data stage: training-set source, the SFT/RL split, chat formatting, benchmarks."""
from __future__ import annotations

from dataclasses import dataclass, field

from common.config.common import IDENTITY_WHEN_SET, ConfigError, check_choice, check_range

ROW_FORMATS = ("luffy", "chat", "alpaca")
"""``data.row_format`` choices (data/row_formats.py converts the others to the LUFFY schema)."""
TOOL_SOURCES = ("acebench", "synthetic_tools")
"""Training sources of tool-use rows (``data.tool_use``): SFT only, no RL split (docs/tool_use.md)."""
LIVE_CATEGORIES = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
"""BFCL live AST categories: the "BFCL live" column is their count-weighted accuracy."""
IRRELEVANCE_CATEGORIES = ("live_irrelevance", "irrelevance")
"""BFCL Irrelevance Detection sets: live (884 user-contributed questions) and v1 non-live (240)."""
BFCL_CATEGORIES = (*LIVE_CATEGORIES, *IRRELEVANCE_CATEGORIES)
"""The BFCL categories ``data.benchmark_source=bfcl`` may name as benchmarks (``eval.bfcl.checker`` scores them)."""
CHATML_TOOLS_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}"
    "{{ messages[0].content + '\\n\\n' }}{% endif %}{{ '# Tools\\n<tools>' }}"
    "{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}{{ '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}{% if m.role == 'user' %}{{ '<|im_start|>user\\n' + m.content + '<|im_end|>\\n' }}"
    "{% elif m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content }}"
    "{% for c in m.tool_calls or [] %}{% if not loop.first or m.content %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson)"
    " + '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML with Qwen3's tool format, for models whose own template ignores ``tools=`` (SmolLM2-135M-Instruct on the
CPU path) and for the tests: the function documents one JSON line each inside ``<tools>`` in the system turn, and
the assistant's calls as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` (what BFCL's Qwen
decoder reads). Unlike Qwen3's own template it writes no tool instructions and no empty think block."""
TOOL_TEMPLATES = {"chatml_tools": CHATML_TOOLS_TEMPLATE}
"""``data.tool_template`` choices: chat templates that replace the model's own for tool-use rows and BFCL prompts."""


@dataclass
class BenchmarkSource:
    """Where one benchmark's problems come from, and which fields hold what."""

    hub_id: str = ""
    """Hub dataset id (``load_dataset``); used when ``data.benchmark_source == hub``."""
    hub_split: str = "train"
    """Split of the hub dataset."""
    hub_config: str = ""
    """Dataset config name on the hub (empty: default)."""
    hub_revision: str = field(default="", metadata=IDENTITY_WHEN_SET)
    """Pinned hub revision (a commit of the dataset repository); empty = latest (the manifest records the revision
    and the dataset's fingerprint either way). Enters the run identity only when set."""
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
    path: str = field(default="", metadata=IDENTITY_WHEN_SET)
    """A local parquet or JSONL file read for this benchmark whatever ``data.benchmark_source`` says (LUFFY's
    ``valid.all.parquet`` for the extra sets math500, minerva, olympiad); empty: the source's own. Enters the run
    identity only when set."""
    data_source: str = field(default="", metadata=IDENTITY_WHEN_SET)
    """With ``path``: the file is in the LUFFY/verl layout and this benchmark is its rows with this ``data_source``;
    problem = the prompt's user turn, answer = ``reward_model.ground_truth`` less one outer ``$...$``, id =
    ``<name>-<extra_info.index>`` (:func:`data.benchmarks.luffy_records`). Enters the run identity only when set."""


@dataclass
class DataConfig:
    """Training data (OpenR1-Math-46k-8192 in the LUFFY schema, or the toy world) and benchmarks."""

    source: str = "hub"
    """hub (``load_dataset(hub_id)``), local (``path``: parquet or jsonl), toy (generated, then loaded as local), or
    a tool-use source (docs/tool_use.md): acebench (``path``: a folder in AceBench's ``data_en`` layout, else the hub
    copy ``hub_id`` at ``hub_revision``) or synthetic_tools (``num_sft_rows`` generated rows, seed ``split_seed``);
    none: no training set, the data run writes the benchmarks alone (to evaluate a model, docs/data.md)."""
    hub_id: str = "Elliott/Openr1-Math-46k-8192"
    """Hub dataset id of the training set."""
    hub_split: str = "train"
    """Split of the hub dataset."""
    hub_revision: str = ""
    """Pinned hub revision (commit); empty = latest (recorded in the manifest either way)."""
    path: str = ""
    """Local parquet/jsonl file in the LUFFY schema (``source == local``), or AceBench's folder (``source ==
    acebench``: ``data_<category>.json`` and ``possible_answer/``)."""
    num_sft_rows: int = 3000
    """Rows in the SFT split; the rest (minus ``num_rl_rows`` cap) go to RL."""
    num_rl_rows: int = -1
    """Cap on RL training rows (-1: all remaining rows)."""
    num_rl_val_rows: int = 64
    """Rows held out of the RL split as ``rl_val.parquet`` (verl's validation set; disjoint from ``rl.parquet``)."""
    num_heldout_rows: int = field(default=0, metadata=IDENTITY_WHEN_SET)
    """Rows set aside after the SFT split as the held-out SFT slice (never trained on; its NLL before RL is a
    headroom diagnostic, docs/evaluation.md); 0: none. Enters the run identity only when set."""
    split_seed: int = 1234
    """Seed of the SFT/RL split, independent of the training seed."""
    max_length: int = 20000
    """SFT cutoff in tokens (prompt + response); longer rows are truncated and counted."""
    strip_leading_think: str = "auto"
    """Remove the target's leading '<think>\\n' when the generation prompt already ends with it: auto, always, never."""
    row_format: str = field(default="luffy", metadata=IDENTITY_WHEN_SET)
    """Format of the training rows (``data.source`` local or hub): luffy (the LUFFY schema, data/schema.py), chat
    (OpenAI ``messages`` or ShareGPT ``conversations``) or alpaca (``instruction``, ``input``, ``output``), converted
    by data/row_formats.py (docs/data.md, "Your own rows"). Enters the run identity only when set."""
    invalid_rows: str = "error"
    """error: a malformed row (or one that is not UTF-8) raises naming the file, row and field; skip: drop it and count
    it in the manifest."""
    duplicates: str = "count"
    """count: repeated ids (``extra_info.index``) and problems are counted in the manifest; refuse: they are an error."""
    tool_template: str = field(default="", metadata=IDENTITY_WHEN_SET)
    """Chat template for tool-use rows and BFCL prompts, from :data:`TOOL_TEMPLATES` (chatml_tools), for models
    whose own template ignores ``tools=``; empty = the model's own. Enters the run identity only when set."""
    system_prompt_path: str = ""
    """Optional system prompt file for benchmark prompts; empty = the training rows' own system turn."""
    benchmark_source: str = "hub"
    """hub, local (JSONL files in ``benchmark_dir``), toy (held-out toy problems) or bfcl (BFCL categories, read
    and scored by ``eval.bfcl.checker`` in the BFCL venv; the data stage writes no benchmark file)."""
    benchmark_dir: str = ""
    """Folder of benchmark JSONL files (``benchmark_source == local``)."""
    benchmarks: dict[str, BenchmarkSource] = field(default_factory=dict)
    """Benchmarks by name (aime24, aime25, amc, hmmt25 in the paper profile): written by the data run, evaluated by
    default, averaged in the tables' Avg column."""
    extra_benchmarks: dict[str, BenchmarkSource] = field(default_factory=dict)
    """Benchmarks registered beside ``benchmarks`` (aime26, hmmt_feb26 in the paper profile: sets published after
    the models), evaluated only when ``eval.benchmarks`` names them. Each is written by its own run
    (``common.paths.extra_benchmark_run``), not by the data run, so registering or selecting one changes no existing
    run's identity; the tables show them after the Avg column and never average them."""

    def validate(self) -> None:
        check_choice("data.source", self.source, ("hub", "local", "toy", "none", *TOOL_SOURCES))
        if self.source == "local" and not self.path:
            raise ConfigError("data.path must be set for data.source=local")
        if self.source in ("hub", "acebench") and not self.hub_id and not self.path:
            raise ConfigError(f"data.hub_id must be set for data.source={self.source}"
                              + (" (or data.path to AceBench's local folder)" if self.source == "acebench" else ""))
        check_choice("data.tool_template", self.tool_template, ("", *TOOL_TEMPLATES))
        if self.tool_template and self.source not in TOOL_SOURCES and self.benchmark_source != "bfcl":
            raise ConfigError(f"data.tool_template is only read for tool-use rows (data.source in {list(TOOL_SOURCES)})"
                              f" or BFCL prompts (data.benchmark_source=bfcl); got data.source={self.source}")
        check_range("data.num_sft_rows", self.num_sft_rows, 1)
        if self.num_rl_rows != -1:
            check_range("data.num_rl_rows", self.num_rl_rows, 1)
        check_range("data.num_rl_val_rows", self.num_rl_val_rows, 0)
        check_range("data.num_heldout_rows", self.num_heldout_rows, 0)
        check_range("data.split_seed", self.split_seed, 0, 2**31 - 1)
        check_range("data.max_length", self.max_length, 16)
        check_choice("data.strip_leading_think", self.strip_leading_think, ("auto", "always", "never"))
        check_choice("data.row_format", self.row_format, ROW_FORMATS)
        if self.row_format != "luffy" and self.source not in ("local", "hub"):
            raise ConfigError(f"data.row_format={self.row_format} converts rows read from a file or the hub "
                              f"(data.source=local|hub); got data.source={self.source}")
        check_choice("data.invalid_rows", self.invalid_rows, ("error", "skip"))
        check_choice("data.duplicates", self.duplicates, ("count", "refuse"))
        check_choice("data.benchmark_source", self.benchmark_source, ("hub", "local", "toy", "bfcl"))
        if (self.source in TOOL_SOURCES) != (self.benchmark_source == "bfcl"):
            raise ConfigError(f"data.benchmark_source=bfcl goes with the tool-use sources {list(TOOL_SOURCES)} and "
                              f"only with them; got data.source={self.source}, "
                              f"data.benchmark_source={self.benchmark_source}")
        if self.benchmark_source == "toy" and self.source not in ("toy", "local"):
            raise ConfigError(f"data.benchmark_source=toy needs data.source=toy or local (your rows on the toy model); "
                              f"got data.source={self.source}")
        if self.benchmark_source == "local" and not self.benchmark_dir:
            raise ConfigError("data.benchmark_dir must be set for data.benchmark_source=local (data=openr1_local): "
                              "add data.benchmark_dir=<folder of the benchmark JSONL files>")
        if not self.benchmarks:
            raise ConfigError("data.benchmarks must name at least one benchmark")
        if self.extra_benchmarks and self.benchmark_source not in ("hub", "local"):
            raise ConfigError(f"data.extra_benchmarks are read from the hub or local files; got "
                              f"data.benchmark_source={self.benchmark_source} (set data.extra_benchmarks={{}})")
        for name in set(self.benchmarks) & set(self.extra_benchmarks):
            raise ConfigError(f"data.extra_benchmarks.{name} is also in data.benchmarks; a name belongs to one")
        for name, bench in self.extra_benchmarks.items():
            self._check_source(f"data.extra_benchmarks.{name}", name, bench)
        for name, bench in self.benchmarks.items():
            self._check_source(f"data.benchmarks.{name}", name, bench)

    def _check_source(self, key: str, name: str, bench: BenchmarkSource) -> None:
        """The fields of one benchmark source (``key``: where it sits in the config) its ``benchmark_source`` reads."""
        if self.benchmark_source == "bfcl":
            check_choice(f"{key} (a BFCL category)", name, BFCL_CATEGORIES)
        if bench.data_source and not bench.path:
            raise ConfigError(f"{key}.data_source filters the rows of {key}.path; set {key}.path to the file")
        if bench.path:
            if not bench.path.endswith((".parquet", ".jsonl", ".json")):
                raise ConfigError(f"{key}.path must be a .parquet, .jsonl or .json file; got {bench.path}")
        elif self.benchmark_source == "hub" and not bench.hub_id:
            raise ConfigError(f"{key}.hub_id must be set for data.benchmark_source=hub")
        elif self.benchmark_source == "local" and not bench.file:
            raise ConfigError(f"{key}.file must be set for data.benchmark_source=local")
        check_range(f"{key}.expected_count", bench.expected_count, 0)

    def tool_chat_template(self) -> str | None:
        """The chat template named by ``tool_template`` (None: keep the model's own)."""
        return TOOL_TEMPLATES[self.tool_template] if self.tool_template else None
