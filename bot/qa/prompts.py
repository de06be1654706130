"""Prompt templates as data: ``prompts/<name>.yaml`` with a ``template`` using ``$variables``.

Loading is strict: a missing file, a file without ``template``, a variable the caller does
not supply and a supplied variable the template does not use are all :class:`PromptError`.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

import prompts as prompts_package

PROMPTS_DIR = Path(prompts_package.__file__).resolve().parent


class PromptError(ValueError):
    """A prompt file or its variables do not fit the code that renders it."""


@dataclass(frozen=True)
class Prompt:
    name: str
    template: string.Template
    description: str

    @property
    def variables(self) -> set[str]:
        return set(self.template.get_identifiers())

    def render(self, **values: object) -> str:
        missing = self.variables - values.keys()
        unused = values.keys() - self.variables
        if missing:
            raise PromptError(f"prompt {self.name!r} needs {', '.join(sorted(missing))}; "
                              f"the code did not supply it")
        if unused:
            raise PromptError(f"prompt {self.name!r} does not use {', '.join(sorted(unused))}; "
                              f"add it to prompts/{self.name}.yaml or stop passing it")
        return self.template.substitute({k: str(v) for k, v in values.items()})


@cache
def load(name: str, folder: Path = PROMPTS_DIR) -> Prompt:
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise PromptError(f"prompt file {path} is missing")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PromptError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("template"), str):
        raise PromptError(f"{path}: needs a 'template' string")
    unknown = data.keys() - {"template", "description"}
    if unknown:
        raise PromptError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    template = string.Template(data["template"])
    if not template.is_valid():
        raise PromptError(f"{path}: a '$' that is not a variable (write '$$' for a dollar)")
    return Prompt(name, template, str(data.get("description", "")).strip())


def names(folder: Path = PROMPTS_DIR) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def render(name: str, **values: object) -> str:
    return load(name).render(**values)
