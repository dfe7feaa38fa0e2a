"""The studio's languages: English and 简体中文.

Every piece of text the studio shows comes from a catalogue, studio/locales/<lang>.json, a flat
mapping of dotted keys to text with ``{name}`` placeholders (str.format). Two ways to use it:

- server text (messages, HTML, table cells): ``t("jobs.cancelled", lang, job=job_id)``, where
  ``lang`` is the value of the page's language selector, passed to the handler as an input;
- component text (labels, info, button captions, tab names): build the component, then
  ``page.bind(component, label="train.start")``. The component starts in English and every bound
  prop is re-rendered when the language changes (the page load picks the browser's language).

The Train form's field labels are the keys ``field.<name>``; their help texts come from JobSpec's
``metadata["help"]`` (the English source, never copied) and, in other languages, from
``help.<name>``. Sentences from jobs/ (bad rows, preflight findings, export refusals, job end
reasons) are jobs/messages/ templates, translated by studio/server_text.py from ``msg.<key>``.
tests/studio/test_i18n.py checks that every key the studio uses exists in both
catalogues with the same placeholders, so add a key to en.json and zh-CN.json together.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import Any, Callable

LANGUAGES = {"en": "English", "zh-CN": "简体中文"}
DEFAULT_LANG = "en"
LOCALES_DIR = Path(__file__).with_name("locales")

# Runs in the browser on page load: the language picked earlier on this browser, else its own.
# The answer must be one of the selector's choices (normalize's rule): a value outside them fails
# the load event's input check, and every step chained after the load would be skipped.
DETECT_LANG_JS = """(current) => {
  let lang = navigator.language || current || 'en';
  try { const saved = window.localStorage.getItem('ft-lang'); if (saved) lang = saved; } catch (e) {}
  return String(lang).toLowerCase().startsWith('zh') ? 'zh-CN' : 'en';
}"""
# Runs in the browser when the user picks a language: remember it for the next visit.
SAVE_LANG_JS = """(lang) => { try { window.localStorage.setItem('ft-lang', lang); } catch (e) {} return lang; }"""

log = logging.getLogger(__name__)


def normalize(lang: str | None) -> str:
    """A supported language for a browser tag: zh, zh-CN, zh-Hans-SG ... -> zh-CN; others -> en."""
    tag = (lang or "").strip().replace("_", "-").lower()
    if tag.startswith("zh"):
        return "zh-CN"
    return DEFAULT_LANG


@functools.cache
def catalogue(lang: str) -> dict[str, str]:
    """The catalogue of `lang`; English also holds help.<field> from JobSpec's metadata and
    msg.<key> from jobs/messages/ (the English sources, never copied)."""
    lang = normalize(lang)
    entries = json.loads((LOCALES_DIR / f"{lang}.json").read_text(encoding="utf-8"))
    if lang == DEFAULT_LANG:
        from jobs.messages import MESSAGES
        entries.update({f"help.{name}": text for name, text in spec_help().items()})
        entries.update({f"msg.{key}": text for key, text in MESSAGES.items()})
    return entries


def spec_help() -> dict[str, str]:
    """JobSpec field name -> its English help text (the source of truth for field help)."""
    from jobs.spec import JobSpec
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(JobSpec)}


def t(key: str, lang: str | None = DEFAULT_LANG, /, **fmt: Any) -> str:
    """The text for `key` in `lang`, formatted with `fmt`.

    A key missing from `lang` falls back to English, and one missing everywhere shows as the key
    itself (logged): a page with one untranslated word beats a page that fails to render. The
    catalogue test keeps both from happening in a release.
    """
    text = catalogue(normalize(lang)).get(key)
    if text is None:
        text = catalogue(DEFAULT_LANG).get(key)
        log.warning("no %s text for %r", normalize(lang), key)
    if text is None:
        return key
    return text.format(**fmt) if fmt else text


def field_label(name: str, lang: str | None = DEFAULT_LANG) -> str:
    return t(f"field.{name}", lang)


def field_help(name: str, lang: str | None = DEFAULT_LANG) -> str:
    return t(f"help.{name}", lang)


@dataclasses.dataclass
class _Binding:
    component: Any
    props: dict[str, Any]  # prop name -> catalogue key, or a function of the language


class PageText:
    """The components whose text follows the page's language.

    ``bind`` sets the English text at build time and remembers which catalogue key (or which
    function of the language) feeds each prop; ``updates(lang)`` gives one gr.update per bound
    component, in the order of ``components()``, for a language-change handler's outputs.
    """

    def __init__(self) -> None:
        self._bindings: list[_Binding] = []

    def bind(self, component: Any, **props: str | Callable[[str], str]) -> Any:
        for binding in self._bindings:
            if binding.component is component:
                binding.props.update(props)
                break
        else:
            self._bindings.append(_Binding(component, dict(props)))
        for prop, source in props.items():
            text = _render(source, DEFAULT_LANG)
            # a value goes through the component's own postprocess, as a constructor value would
            setattr(component, prop, component.postprocess(text) if prop == "value" else text)
        return component

    def components(self) -> list[Any]:
        return [binding.component for binding in self._bindings]

    def updates(self, lang: str | None) -> list[dict[str, Any]]:
        import gradio as gr
        lang = normalize(lang)
        return [gr.update(**{prop: _render(source, lang) for prop, source in binding.props.items()})
                for binding in self._bindings]


def _render(source: str | Callable[[str], str], lang: str) -> str:
    return source(lang) if callable(source) else t(source, lang)


def language_choices() -> list[tuple[str, str]]:
    return [(name, code) for code, name in LANGUAGES.items()]
