"""``--chat-template FILE`` and ``--chat-template-kwargs JSON``: rendering with another template.

A target's own chat template is the default. ``--chat-template`` replaces it with a Jinja file
(a fine-tune's template, a fixed one); ``--chat-template-kwargs`` passes extra variables to the
template (Qwen3's ``{"enable_thinking": false}``). Both are checked before any model loads: the
file must exist, be UTF-8 and parse as Jinja; the kwargs must be one JSON object. The store
header records their effect: ``chat_template_hash`` is the hash of the template actually used,
and ``generation.chat_template_kwargs`` / ``build_config.chat_template_kwargs`` the variables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from osprey_data.errors import ConfigError
from osprey_data.jsonio import loads

__all__ = ["read_chat_template", "parse_template_kwargs", "check_template_kwargs", "use_chat_template"]

MAX_TEMPLATE_BYTES = 1 << 20
"""A chat template is a few KiB; a larger file is not one."""


def read_chat_template(path: str | Path, option: str = "--chat-template") -> str:
    """The text of the Jinja template file ``path``, checked to parse (:class:`ConfigError` naming
    the file otherwise)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{option} {str(p)!r} is not a file")
    if p.stat().st_size > MAX_TEMPLATE_BYTES:
        raise ConfigError(f"{option} {str(p)!r}: {p.stat().st_size} bytes is too large for a chat template")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{option} {str(p)!r} is not UTF-8 text") from None
    if not text.strip():
        raise ConfigError(f"{option} {str(p)!r} is empty")
    try:   # transformers renders templates with jinja2, its loopcontrols extension on
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{option} {str(p)!r} line {exc.lineno}: not a valid Jinja template: {exc.message}") from None
    return text


def parse_template_kwargs(text: str) -> dict[str, Any]:
    """``--chat-template-kwargs``: a JSON object, e.g. ``{"enable_thinking": false}``."""
    try:
        value = loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--chat-template-kwargs {text!r}: not JSON ({exc.msg}); give an object such as "
                          "'{\"enable_thinking\": false}'") from None
    return check_template_kwargs(value)


def check_template_kwargs(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object with string keys (a template's variables)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"--chat-template-kwargs must be a JSON object of template variables, got {value!r}")
    return dict(value)


def use_chat_template(tokenizer: Any, text: str | None) -> None:
    """Render with ``text`` instead of the tokenizer's own template (None: keep its own)."""
    if text is not None:
        tokenizer.chat_template = text
