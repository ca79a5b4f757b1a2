"""Tool-use training rows: the AceBench loader, a synthetic tool-use set, and SFT examples in the model's own
tool-calling chat template.

A tool-use row (what the loader and the generator both produce; ``tools``/``calls`` are JSON text so that parquet
needs no schema for arbitrary function documents)::

    id        : str                      e.g. "normal_single_turn_single_function_3" or "synthetic-simple-17"
    source    : str                      acebench | synthetic
    category  : str                      the source's category (AceBench file stem, or simple/multiple/parallel/...)
    messages  : [{"role", "content"}]    the prompt turns: an optional system turn, then one user turn
    tools     : str                      JSON list of function documents {"name", "description", "parameters"}
    calls     : str                      JSON list of gold calls [{"name", "arguments": {...}}]; [] = no call
    reply     : str                      the gold text answer when calls is [] (an irrelevant request), else ""

SFT example (:func:`build_tool_sft_example`), with ``T`` = ``tokenizer.apply_chat_template`` given
``tools=`` the function documents (:func:`chat_tools`)::

    prompt   = T(messages, add_generation_prompt=True)
    full     = T(messages + [assistant(tool_calls=calls, content=reply)])          (full starts with prompt)
    response = full[len(prompt):] up to and including the first end-of-turn token
    labels   = [-100] * len(tokens(prompt)) + tokens(response)

so the calls are written by the model's own template (Qwen3: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n
</tool_call>``, preceded by the empty ``<think>\\n\\n</think>\\n\\n`` block its template writes for the last turn)
and only the assistant turn is supervised.

AceBench (Chen et al. 2025, github.com/ACEBench/ACEBench, ``data_all/data_en``): each category is a JSON-lines file
``data_<category>.json`` of ``{"id", "question": "user: ...", "function": [...], "time": str, "profile"?: str}``
with ``possible_answer/data_<category>.json`` of ``{"id", "ground_truth"}``: a ``{function_name: arguments}``
mapping (a name called twice is written ``name_1``, ``name_2``) or, for ``special_irrelevant``, the refusal text.
The hub copy ``oliveirabruno01/acebench`` (config ``en``, splits normal/special/agent) holds the same fields with
``function`` and the ground truth (``rubric``) as JSON text; :func:`acebench_row` reads both encodings, so a local
file and the hub go through the same code.
"""
from __future__ import annotations

import json
import random
import re
from typing import Any, Iterable, Mapping, Sequence

from data.formatting import SFTExample, example_from_texts
from common.models import end_of_turn_token
from common.paths import SFT_ROWS_FILE

TOOL_ROW_COLUMNS = ("id", "source", "category", "messages", "tools", "calls", "reply")
ACEBENCH_HUB_ID = "oliveirabruno01/acebench"
ACEBENCH_HUB_CONFIG = "en"
ACEBENCH_HUB_SPLITS = ("normal", "special")
ACEBENCH_SINGLE_TURN = ("normal_single_turn_single_function", "normal_single_turn_parallel_function",
                        "normal_similar_api", "normal_preference", "normal_atom_bool", "normal_atom_enum",
                        "normal_atom_number", "normal_atom_list", "normal_atom_object_deep",
                        "normal_atom_object_short", "special_irrelevant")
"""AceBench categories with one user turn and a gold answer that is calls or a refusal: the SFT set. The multi-turn,
agent and special_incomplete/error_param categories need a dialogue or a clarifying question and are left out."""
_ROLE_PREFIX = re.compile(r"^(user|system|assistant|tool):\s?", re.MULTILINE)
_REPEAT_SUFFIX = re.compile(r"^(.+)_(\d+)$")


class InvalidToolRowError(ValueError):
    """A tool-use source row that cannot become a training row; the message names the row id and the field."""

    def __init__(self, row_id: str, field: str, reason: str):
        super().__init__(f"row {row_id!r}: field '{field}' {reason}")
        self.row_id, self.field, self.reason = row_id, field, reason


def _json_field(value: Any) -> Any:
    """A field that the hub copy stores as JSON text and the original files as JSON values."""
    return json.loads(value) if isinstance(value, str) else value


def _user_turn(row_id: str, question: str) -> str:
    """The single user turn of an AceBench ``question`` (``"user: ..."``); more turns are an error."""
    turns = list(_ROLE_PREFIX.finditer(question))
    if len(turns) != 1 or turns[0].group(1) != "user" or question[:turns[0].start()].strip():
        raise InvalidToolRowError(row_id, "question", f"must be one 'user:' turn; got roles "
                                  f"{[t.group(1) for t in turns]}")
    text = question[turns[0].end():].strip()
    if not text:
        raise InvalidToolRowError(row_id, "question", "has an empty user turn")
    return text


def _calls_from_ground_truth(row_id: str, truth: Mapping[str, Any], names: set[str]) -> list[dict[str, Any]]:
    """``{name or name_<k>: arguments}`` → ``[{"name", "arguments"}]`` in the file's order."""
    calls = []
    for key, arguments in truth.items():
        name = key
        if key not in names and (match := _REPEAT_SUFFIX.match(key)) and match.group(1) in names:
            name = match.group(1)
        if name not in names:
            raise InvalidToolRowError(row_id, "ground_truth", f"calls {key!r}, which is not among the functions "
                                      f"{sorted(names)}")
        if not isinstance(arguments, Mapping):
            raise InvalidToolRowError(row_id, f"ground_truth.{key}", f"must be an argument mapping; got {arguments!r}")
        calls.append({"name": name, "arguments": dict(arguments)})
    return calls


def acebench_row(row: Mapping[str, Any], ground_truth: Any, category: str) -> dict[str, Any]:
    """One AceBench row and its ground truth (mapping of calls, or the refusal text) as a tool-use row."""
    row_id = str(row.get("id", ""))
    if not row_id:
        raise InvalidToolRowError("?", "id", "is missing")
    functions = _json_field(row.get("function"))
    if not isinstance(functions, list) or not functions or not all(
            isinstance(f, Mapping) and isinstance(f.get("name"), str) for f in functions):
        raise InvalidToolRowError(row_id, "function", "must be a non-empty list of {name, description, parameters}")
    question = row.get("question")
    if not isinstance(question, str):
        raise InvalidToolRowError(row_id, "question", f"must be a string; got {type(question).__name__}")
    context = [str(row[key]).strip() for key in ("time", "profile") if row.get(key) and str(row[key]).strip()]
    messages = ([{"role": "system", "content": "\n".join(context)}] if context else []) + \
        [{"role": "user", "content": _user_turn(row_id, question)}]
    truth = _json_field(ground_truth) if isinstance(ground_truth, str) and ground_truth.lstrip().startswith("{") \
        else ground_truth
    if isinstance(truth, str):
        calls, reply = [], truth.strip()
        if not reply:
            raise InvalidToolRowError(row_id, "ground_truth", "is an empty answer")
    elif isinstance(truth, Mapping) and truth:
        calls, reply = _calls_from_ground_truth(row_id, truth, {f["name"] for f in functions}), ""
    else:
        raise InvalidToolRowError(row_id, "ground_truth", f"must be a mapping of calls or a text answer; got {truth!r}")
    return {"id": row_id, "source": "acebench", "category": category, "messages": messages,
            "tools": json.dumps(list(functions)), "calls": json.dumps(calls), "reply": reply}


def acebench_category(row_id: str) -> str:
    """``normal_atom_bool_12`` → ``normal_atom_bool`` (the id minus its trailing index)."""
    return _REPEAT_SUFFIX.match(row_id).group(1) if _REPEAT_SUFFIX.match(row_id) else row_id


def acebench_rows(rows: Iterable[Mapping[str, Any]], answers: Mapping[str, Any] | None = None,
                  categories: Sequence[str] = ACEBENCH_SINGLE_TURN, invalid: list[InvalidToolRowError] | None = None,
                  ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Tool-use rows from AceBench rows of ``categories``, and the number of rows left out per reason.

    ``answers`` maps ids to ground truths (the original layout's ``possible_answer`` files); without it each row's
    own ``rubric`` (hub copy) or ``ground_truth`` field is used. A malformed row raises
    :class:`InvalidToolRowError`, or, when an ``invalid`` list is given, is appended to it and left out
    (``data.invalid_rows=skip``).
    """
    out: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    for row in rows:
        category = row.get("sub_category") or acebench_category(str(row.get("id", "")))
        if category not in categories:
            skipped[f"category {category}"] = skipped.get(f"category {category}", 0) + 1
            continue
        try:
            truth = answers.get(row["id"]) if answers is not None else row.get("rubric", row.get("ground_truth"))
            if truth is None:
                raise InvalidToolRowError(str(row.get("id")), "ground_truth", "is missing")
            out.append(acebench_row(row, truth, category))
        except InvalidToolRowError as error:
            if invalid is None:
                raise
            invalid.append(error)
    return out, skipped


def read_jsonl(path) -> list[dict[str, Any]]:
    """A JSON-lines file (AceBench's ``.json`` files are JSON lines) through ``datasets``, as a list of dicts."""
    from datasets import load_dataset

    return list(load_dataset("json", data_files=str(path), split="train"))


def load_acebench_local(data_dir, categories: Sequence[str] = ACEBENCH_SINGLE_TURN,
                        invalid: list[InvalidToolRowError] | None = None):
    """The original layout: ``<data_dir>/data_<c>.json`` and ``<data_dir>/possible_answer/data_<c>.json``."""
    from pathlib import Path

    data_dir = Path(data_dir)
    rows, answers = [], {}
    for category in categories:
        rows.extend(read_jsonl(data_dir / f"data_{category}.json"))
        answers.update({a["id"]: a["ground_truth"] for a in read_jsonl(data_dir / "possible_answer"
                                                                       / f"data_{category}.json")})
    return acebench_rows(rows, answers, categories, invalid)


def load_acebench_hub(hub_id: str = ACEBENCH_HUB_ID, revision: str | None = None,
                      splits: Sequence[str] = ACEBENCH_HUB_SPLITS,
                      categories: Sequence[str] = ACEBENCH_SINGLE_TURN,
                      invalid: list[InvalidToolRowError] | None = None, fingerprints: dict[str, str] | None = None):
    """The hub copy (``load_dataset(hub_id, "en", split=...)``, rubric inline) through :func:`acebench_rows`;
    ``fingerprints`` (when given) receives each split's ``datasets`` fingerprint for the manifest."""
    from datasets import load_dataset

    rows: list[Mapping[str, Any]] = []
    for split in splits:
        dataset = load_dataset(hub_id, ACEBENCH_HUB_CONFIG, split=split, revision=revision or None)
        if fingerprints is not None:
            fingerprints[split] = dataset._fingerprint
        rows.extend(dataset)
    return acebench_rows(rows, None, categories, invalid)


def chat_tools(tools_json: str) -> list[dict[str, Any]]:
    """The ``tools=`` argument of ``apply_chat_template``: the function documents themselves, not wrapped in
    ``{"type": "function", "function": f}``, because that is how BFCL's Qwen FC handler writes them into the prompt
    it scores (``json.dumps(f)`` per line inside ``<tools>``), so training and evaluation prompts agree."""
    return json.loads(tools_json)


def assistant_turn(calls_json: str, reply: str) -> dict[str, Any]:
    """The gold assistant message: ``tool_calls`` (arguments as mappings) or the text reply."""
    calls = json.loads(calls_json)
    if not calls:
        return {"role": "assistant", "content": reply}
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                           for c in calls]}


def build_tool_sft_example(tokenizer, row: Mapping[str, Any], max_length: int) -> SFTExample:
    """Token ids and labels (-100 on the prompt) of one tool-use row (formula in the module doc)."""
    tools = chat_tools(row["tools"])
    messages = [dict(m) for m in row["messages"]]
    prompt_text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    full_text = tokenizer.apply_chat_template(messages + [assistant_turn(row["calls"], row["reply"])], tools=tools,
                                              tokenize=False)
    if not full_text.startswith(prompt_text):
        raise ValueError(f"row {row['id']!r}: the chat template does not extend the generation prompt with the "
                         f"assistant turn, so the response cannot be cut out of it")
    eot = end_of_turn_token(tokenizer)
    rest = full_text[len(prompt_text):]
    if eot not in rest:
        raise ValueError(f"row {row['id']!r}: no end-of-turn token {eot!r} after the assistant turn")
    return example_from_texts(tokenizer, prompt_text, rest[:rest.index(eot) + len(eot)], max_length)


# ---- the synthetic tool-use set (the CPU path): the project's own functions, never BFCL's questions ----------------

def _fn(name: str, description: str, params: dict[str, tuple[str, str]], required: Sequence[str]) -> dict[str, Any]:
    """A function document in BFCL's dialect (``"type": "dict"``; types string/integer/float/boolean)."""
    return {"name": name, "description": description,
            "parameters": {"type": "dict", "required": list(required),
                           "properties": {p: {"type": t, "description": d} for p, (t, d) in params.items()}}}


SYNTHETIC_FUNCTIONS = {
    "plant_watering_schedule": _fn("plant_watering_schedule", "Plan how often to water a house plant.",
                                   {"species": ("string", "Common name of the plant."),
                                    "pot_litres": ("float", "Pot volume in litres.")}, ["species", "pot_litres"]),
    "bike_route_length": _fn("bike_route_length", "Length in kilometres of the cycle route between two towns.",
                             {"start": ("string", "Town where the ride starts."),
                              "end": ("string", "Town where the ride ends."),
                              "avoid_hills": ("boolean", "Prefer flat roads.")}, ["start", "end"]),
    "library_renew_book": _fn("library_renew_book", "Renew a borrowed library book.",
                              {"card_number": ("integer", "Library card number."),
                               "weeks": ("integer", "Extra weeks of loan.")}, ["card_number", "weeks"]),
    "recipe_scale": _fn("recipe_scale", "Scale a recipe to a number of servings.",
                        {"dish": ("string", "Name of the dish."),
                         "servings": ("integer", "Servings wanted.")}, ["dish", "servings"]),
    "paint_needed": _fn("paint_needed", "Litres of paint needed for a wall.",
                        {"wall_m2": ("float", "Wall area in square metres."),
                         "coats": ("integer", "Number of coats.")}, ["wall_m2", "coats"]),
}
_SPECIES = ["fern", "cactus", "basil", "orchid", "ivy", "monstera"]
_TOWNS = ["Aldham", "Brixby", "Cotwell", "Dunmere", "Elsworth", "Fenbury", "Glenrow"]
_DISHES = ["lentil soup", "apple crumble", "fish pie", "risotto", "flatbread"]
_REQUESTS = {
    "plant_watering_schedule": (lambda r: {"species": r.choice(_SPECIES), "pot_litres": r.choice([0.5, 1.5, 2.0, 3.5])},
                                "How often should I water my {species}? It sits in a {pot_litres} litre pot."),
    "bike_route_length": (lambda r: dict(zip(("start", "end"), r.sample(_TOWNS, 2))),
                          "How long is the cycle route from {start} to {end}?"),
    "library_renew_book": (lambda r: {"card_number": r.randint(10000, 99999), "weeks": r.randint(1, 4)},
                           "Please renew my book on card {card_number} for {weeks} more weeks."),
    "recipe_scale": (lambda r: {"dish": r.choice(_DISHES), "servings": r.randint(2, 12)},
                     "Scale the {dish} recipe to {servings} servings."),
    "paint_needed": (lambda r: {"wall_m2": r.choice([8.0, 12.5, 20.0, 31.0]), "coats": r.randint(1, 3)},
                     "How much paint for a {wall_m2} square metre wall with {coats} coats?"),
}
_IRRELEVANT_REQUESTS = ["Write a two-line poem about the sea.", "Who painted the ceiling of the Sistine Chapel?",
                        "Tell me a joke about penguins.", "What does the word 'ephemeral' mean?",
                        "Summarise the plot of a detective story in one sentence.",
                        "Which is larger, a blue whale or an elephant?"]
SYNTHETIC_REFUSAL = "None of the available functions can help with this request."
SYNTHETIC_CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple", "irrelevance")
"""The BFCL-like kinds the generator draws uniformly: one function/one call, several functions/one call, one
function/two calls, several functions/two calls of different functions, and a request no function serves."""


def synthetic_tool_rows(num_rows: int, seed: int) -> list[dict[str, Any]]:
    """``num_rows`` tool-use rows drawn with ``random.Random(seed)``; each also carries ``possible_answer``: the gold
    calls in BFCL's possible-answer form ``[{name: {param: [value]}}]`` so BFCL's checker can score held-out rows."""
    rng = random.Random(seed)
    names = sorted(SYNTHETIC_FUNCTIONS)
    rows = []
    for index in range(num_rows):
        category = SYNTHETIC_CATEGORIES[index % len(SYNTHETIC_CATEGORIES)]
        if category in ("simple", "parallel"):
            called = [rng.choice(names)] * (1 if category == "simple" else 2)
            offered = called[:1]
        elif category == "multiple":
            offered = rng.sample(names, 3)
            called = [rng.choice(offered)]
        elif category == "parallel_multiple":
            offered = rng.sample(names, 3)
            called = rng.sample(offered, 2)
        else:
            offered, called = rng.sample(names, 2), []
        calls, sentences = [], []
        for name in called:
            draw, template = _REQUESTS[name]
            arguments = draw(rng)
            calls.append({"name": name, "arguments": arguments})
            sentences.append(template.format(**arguments))
        request = " Also, ".join([sentences[0]] + [s[0].lower() + s[1:] for s in sentences[1:]]) if calls \
            else rng.choice(_IRRELEVANT_REQUESTS)
        rows.append({"id": f"synthetic-{category}-{index}", "source": "synthetic", "category": category,
                     "messages": [{"role": "user", "content": request}],
                     "tools": json.dumps([SYNTHETIC_FUNCTIONS[n] for n in offered]),
                     "calls": json.dumps(calls), "reply": "" if calls else SYNTHETIC_REFUSAL,
                     "possible_answer": json.dumps([{c["name"]: {k: [v] for k, v in c["arguments"].items()}}
                                                    for c in calls])})
    return rows


# ---- the data stage's tool-use path (data.source in TOOL_SOURCES) -------------------------------------------------

TOOL_PARQUET_COLUMNS = (*TOOL_ROW_COLUMNS, "possible_answer", "row_id")
"""Columns of a tool-use ``sft.parquet``: the tool-use row, BFCL's possible answer (synthetic rows; "" for
AceBench) and ``row_id``, the row's position among the loaded tool rows."""


def tool_problem(row: Mapping[str, Any]) -> str:
    """What makes two tool rows the same problem: the prompt turns and the offered function documents."""
    return "\n".join([*(m["content"] for m in row["messages"]), row["tools"]])


def tool_duplicates(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    """Rows sharing an ``id`` and rows sharing a :func:`tool_problem` (:func:`data.loading.count_duplicates`; row ids
    are positions among ``rows``)."""
    from data.loading import count_duplicates

    return count_duplicates([r["id"] for r in rows], [tool_problem(r) for r in rows], range(len(rows)))


def load_tool_rows(data) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """The tool-use rows of ``data`` (a ``DataConfig`` with ``source`` in ``TOOL_SOURCES``), where they came from, and
    what was left out: ``{"skipped": {reason: count}, "invalid": [InvalidToolRowError]}``.

    acebench: ``data.path`` (AceBench's folder) or the hub copy ``data.hub_id`` at ``data.hub_revision``;
    synthetic_tools: :func:`synthetic_tool_rows` (``data.num_sft_rows`` rows, seed
    ``derive_seed(data.split_seed, "synthetic_tools")``). Malformed rows raise under ``data.invalid_rows=error``.
    """
    from common.manifest import sha256_path
    from common.seeding import derive_seed

    invalid: list[InvalidToolRowError] | None = [] if data.invalid_rows == "skip" else None
    if data.source == "synthetic_tools":
        seed = derive_seed(data.split_seed, "synthetic_tools")
        rows, skipped = synthetic_tool_rows(data.num_sft_rows, seed), {}
        source = {"kind": "synthetic_tools", "seed": seed, "functions": sorted(SYNTHETIC_FUNCTIONS)}
    elif data.path:
        rows, skipped = load_acebench_local(data.path, invalid=invalid)
        source = {"kind": "acebench_local", "path": data.path, "sha256": sha256_path(data.path)}
    else:
        fingerprints: dict[str, str] = {}
        rows, skipped = load_acebench_hub(data.hub_id, data.hub_revision, invalid=invalid, fingerprints=fingerprints)
        source = {"kind": "acebench_hub", "hub_id": data.hub_id, "config": ACEBENCH_HUB_CONFIG,
                  "splits": list(ACEBENCH_HUB_SPLITS), "revision": data.hub_revision or "latest",
                  "fingerprints": fingerprints}
    if not rows:
        raise ValueError(f"data.source={data.source}: no valid tool-use rows; left out: {skipped}")
    return rows, source, {"skipped": skipped, "invalid": invalid or []}


def select_tool_rows(rows: Sequence[Mapping[str, Any]], num_rows: int, seed: int) -> list[int]:
    """Positions of the SFT rows: all of them when they fit in ``num_rows``, else the first ``num_rows`` in the
    order of ``sha256(f"{seed}:{id}")``; returned in source order."""
    import hashlib

    if len(rows) <= num_rows:
        return list(range(len(rows)))
    order = sorted(range(len(rows)), key=lambda p: hashlib.sha256(f"{seed}:{rows[p]['id']}".encode()).hexdigest())
    return sorted(order[:num_rows])


def write_tool_split(data, out_dir) -> dict[str, Any]:
    """The data stage for tool-use sources: ``sft.parquet`` (:data:`TOOL_PARQUET_COLUMNS`) in ``out_dir``, and the
    manifest details, keyed like the math set's (source, invalid rows, duplicates, split counts and ids digest).
    There is no RL split."""
    from pathlib import Path

    from datasets import Dataset

    from data.loading import MAX_RECORDED_INVALID_ROWS
    from data.split import ids_digest

    rows, source, left_out = load_tool_rows(data)
    duplicates = tool_duplicates(rows)
    if data.duplicates == "refuse" and any(duplicates[kind]["duplicate_rows"] for kind in ("ids", "problems")):
        raise ValueError(f"data.duplicates=refuse, but the tool-use rows repeat ids or problems: {duplicates}")
    chosen = select_tool_rows(rows, data.num_sft_rows, data.split_seed)
    records = [{**{c: rows[p][c] for c in TOOL_ROW_COLUMNS}, "possible_answer": rows[p].get("possible_answer", ""),
                "row_id": p} for p in chosen]
    Dataset.from_list(records).to_parquet(str(Path(out_dir) / SFT_ROWS_FILE))
    invalid = left_out["invalid"]
    by_field: dict[str, int] = {}
    for error in invalid:
        by_field[error.field] = by_field.get(error.field, 0) + 1
    return {
        "source": source,
        "num_source_rows": len(rows) + len(invalid) + sum(left_out["skipped"].values()),
        "skipped": left_out["skipped"],
        "invalid_rows": {"policy": data.invalid_rows, "count": len(invalid), "by_field": by_field,
                         "first": [{"row": e.row_id, "field": e.field, "reason": e.reason}
                                   for e in invalid[:MAX_RECORDED_INVALID_ROWS]]},
        "duplicates": {"policy": data.duplicates, **duplicates},
        "split": {"seed": data.split_seed, "counts": {"sft": len(chosen)},
                  "rows_dropped_by_cap": len(rows) - len(chosen), "ids_sha256": {"sft": ids_digest(chosen)}},
        "categories": {c: sum(rows[p]["category"] == c for p in chosen) for c in sorted({r["category"] for r in rows})},
        "benchmarks": {name: {"kind": "bfcl", "expected_count": bench.expected_count}
                       for name, bench in data.benchmarks.items()},
    }
