"""What can be run, read from the config tree itself: the experiments (with the profiles each is meant for), the
profiles, the SFT methods, the RL algorithms and the benchmarks, each with a one-line description, and the
orchestrator's flags.

``python -m pipeline.run --help`` shows it (Hydra's help template in ``conf/config.yaml`` calls the
``catalogue`` resolver registered here), and so does ``make list``. A
description is the leading comment of the option's YAML file; a method preset without one gets its schema's
docstring (``common.config.sft.SFT_METHOD_SCHEMAS``). Schema entries (``base_*``) are never listed: they are not
options (:func:`refuse_unknown_choices`).
"""
from __future__ import annotations

import re
import textwrap
from difflib import get_close_matches
from pathlib import Path

from omegaconf import OmegaConf

from common.config.common import PROFILES, ConfigError
from common.config.sft import SFT_METHOD_SCHEMAS

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
SCHEMA_PREFIX = "base_"
"""Names of the schema entries registered in Hydra's ConfigStore (``common.config._register``)."""
DESCRIPTION_CHARS = 100
FLAGS = {
    "dry_run=true": "print every stage, its exact command and resolved settings; run nothing",
    "preflight=true": "run the checks of the pending stages (GPUs, vLLM, models, data, disk), then stop",
    "force=[<pattern>,...]": "redo commands from scratch: globs over command or stage names (force=[sft/toy/eksft])",
    "experiment.parallel=<n>": "stage commands run at the same time (2 on a 2-core CPU; 1 on GPUs)",
}
"""The orchestrator's flags (``Config.dry_run``, ``preflight``, ``force``, ``experiment.parallel``)."""


def options(group: str) -> list[str]:
    """The selectable options of a config group: its YAML files (``conf/<group>/*.yaml``), never a schema entry."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def leading_comment(path: Path) -> str:
    """The comment block a YAML file opens with (``@package`` lines skipped), as one paragraph."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def one_line(text: str) -> str:
    """The first sentence of ``text``, at most :data:`DESCRIPTION_CHARS` characters."""
    sentence = re.split(r"(?<=[.])\s+(?=[A-Z(`])", text.strip(), maxsplit=1)[0]
    return textwrap.shorten(sentence, DESCRIPTION_CHARS, placeholder=" …")


def method_description(preset: str) -> str:
    """A method preset's leading comment, else its schema's docstring (the preset's ``defaults: [base_<schema>]``)."""
    path = CONF_DIR / "sft" / "method" / f"{preset}.yaml"
    comment = leading_comment(path)
    if comment:
        return one_line(comment)
    defaults = OmegaConf.load(path).get("defaults", [])
    schemas = [entry[len(SCHEMA_PREFIX):] for entry in defaults if str(entry).startswith(SCHEMA_PREFIX)]
    schema = SFT_METHOD_SCHEMAS.get(schemas[0] if schemas else preset)
    return one_line(schema.__doc__ or "") if schema is not None else ""


def experiment_profiles(experiment: str) -> list[str]:
    """``experiment.profiles`` as the experiment's YAML sets it (the schema's default: every profile)."""
    node = OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml")  # @package _global_ or the group's own
    return list(node.get("experiment", node).get("profiles", PROFILES))


def group_node(group: str, option: str):
    """An option's YAML merged over the options of its own group that its ``defaults`` list names."""
    node = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
    parents = [str(entry) for entry in node.pop("defaults", []) if (CONF_DIR / group / f"{entry}.yaml").is_file()]
    return OmegaConf.merge(*[group_node(group, parent) for parent in parents], node)


def benchmarks() -> dict[str, list[str]]:
    """Per data preset, its benchmarks (``data.benchmarks``) and, marked ``+``, its extra ones."""
    listed = {}
    for preset in options("data"):
        node = group_node("data", preset)
        names = list(node.get("benchmarks", {}) or {}) + [f"+{name}" for name in node.get("extra_benchmarks", {}) or {}]
        if names:
            listed[preset] = names
    return listed


def rows(entries: dict[str, str]) -> list[str]:
    width = max(map(len, entries))
    return [f"  {name.ljust(width)}  {text}".rstrip() for name, text in entries.items()]


def catalogue() -> str:
    """The listing ``--help`` and ``make list`` print."""
    lines = ["python -m pipeline.run experiment=<experiment> [profile=toy|paper] [key=value ...]",
             "(make <target> PROFILE=toy|paper; the default profile is toy, in Make as in Python)", "",
             "Experiments (experiment=...; the profiles each is meant for, experiment.any_profile=true overrides):"]
    lines += rows({name: f"[{'|'.join(experiment_profiles(name))}] "
                         f"{one_line(leading_comment(CONF_DIR / 'experiment' / f'{name}.yaml'))}"
                   for name in options("experiment")})
    lines += ["", "Profiles (profile=...):"]
    lines += rows({name: one_line(leading_comment(CONF_DIR / "profile" / f"{name}.yaml")) for name in options("profile")})
    lines += ["", "SFT methods (experiment.methods=[...], or sft/method=... for one stage):"]
    lines += rows({name: method_description(name) for name in options("sft/method")})
    lines += ["", "RL algorithms (rl/algorithm=...; default dapo):"]
    lines += rows({name: one_line(leading_comment(CONF_DIR / "rl" / "algorithm" / f"{name}.yaml"))
                   for name in options("rl/algorithm")})
    lines += ["", "Benchmarks (eval.benchmarks=[...]; default: every one of data.benchmarks; +: an extra benchmark, "
                  "evaluated only when named):"]
    lines += rows({f"data={preset}": ", ".join(names) for preset, names in benchmarks().items()})
    lines += ["", "Orchestrator flags:"]
    lines += rows(FLAGS)
    lines += ["", "Every key: the dataclass schemas in common/config/ (docs/pipeline.md); a run's resolved settings: "
                  "dry_run=true. Hydra's own help: --hydra-help."]
    return "\n".join(lines)


def refuse_unknown_choices(overrides: list[str] | tuple[str, ...]) -> None:
    """Raises :class:`ConfigError` for a group override that names no option of the group, before Hydra composes:
    a ``group=base_*`` schema entry (it composes an empty config that fails later with a missing-value error), or an
    unknown option (Hydra's own error lists the schema entries too, over some 50 lines), with the options closest to
    it (``unknown sft/method 'eksf'; did you mean eksft?``). A sweep's ``a,b`` values are checked one by one (a
    sweep function such as ``choice(...)`` is left to Hydra; ``null`` removes the group's choice)."""
    for override in overrides:
        key, _, values = override.lstrip("+~").partition("=")
        if not values or override.startswith("~") or "(" in values or not (CONF_DIR / key).is_dir():
            continue
        choices = options(key)
        for value in values.split(","):
            if value == "null":
                continue
            if value.startswith(SCHEMA_PREFIX):
                raise ConfigError(f"{key}={value} is a schema, not an option; choose one of: {', '.join(choices)}")
            if value not in choices:
                close = get_close_matches(value.lower(), choices, n=3, cutoff=0.7)
                hint = f"did you mean {' or '.join(close)}?" if close else f"choose one of: {', '.join(choices)}"
                raise ConfigError(f"unknown {key} '{value}'; {hint}")


def _help_resolver() -> str:
    return catalogue().replace("$", "$$")  # Hydra's help substitutes $NAME in the template


OmegaConf.register_new_resolver("catalogue", _help_resolver, replace=True)
