"""(jobs) YAML config files read with a bound on what aliases can expand to.

YAML aliases (`&a [...]` then `*a`) let a few hundred bytes describe billions of values (the
"billion laughs" shape: 9 anchors of 9 references each). PyYAML's composer shares one node per
anchor, so composing stays cheap; the cost comes later, from whatever walks the values as if they
were written out. So the document is composed first, the size each top-level key would have
written out is counted over the node graph (memoized per node, so the count itself is fast), and
only a document under the bound is constructed. A self-referring alias and nesting past the limit
are refused the same way. The idea is that of defusedxml's entity-expansion limits for XML."""
from __future__ import annotations

from typing import Any

import yaml

from jobs.errors import SpecError
from jobs.messages import say

# A job config is one flat mapping with at most a few dozen values per key (target_modules is the
# longest list); 10,000 leaves room for any real file and none for an alias bomb.
MAX_YAML_VALUES = 10_000
MAX_YAML_NESTING = 100


class _TooBig(Exception):
    """What is too big about a value, and the fix (a jobs/messages/ sentence)."""


def load_config_yaml(text: str, source: str) -> Any:
    """The document in `text` (None when empty); a SpecError naming the key whose aliases expand
    past MAX_YAML_VALUES, or that refers to itself, or nests past MAX_YAML_NESTING, or that is
    written twice in one mapping."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise SpecError(None, say("yaml_too_deep", source=source, limit=MAX_YAML_NESTING)) from None
        if node is None:
            return None
        _check_size(node, source)   # first: an alias bomb is refused before any walk of its values
        _refuse_duplicate_keys(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _refuse_duplicate_keys(node: yaml.Node, source: str, depth: int = 0) -> None:
    """A key written twice in one mapping is refused, naming it and both lines: PyYAML keeps the last
    silently, so the first value (perhaps the one the user meant) would be dropped without a word.
    (YAML 1.2 says keys are unique; ruamel.yaml refuses duplicates the same way.)"""
    if depth > MAX_YAML_NESTING or not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        return
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            _refuse_duplicate_keys(child, source, depth + 1)
        return
    first_lines: dict[tuple[str, str], int] = {}
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if (key_node.tag, key) in first_lines:
                message = say("yaml_duplicate_key", source=source, key=key, line=line,
                              first_line=first_lines[key_node.tag, key])
                raise SpecError(key if depth == 0 else None, message)   # a nested key is no config key
            first_lines[key_node.tag, key] = line
        _refuse_duplicate_keys(value_node, source, depth + 1)


def _check_size(node: yaml.Node, source: str) -> None:
    sizes: dict[int, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            _refuse_if_big(value_node, sizes, source, key)
    else:
        _refuse_if_big(node, sizes, source, None)


def _refuse_if_big(node: yaml.Node, sizes: dict[int, int], source: str, key: str | None) -> None:
    try:
        _expanded_size(node, sizes, set(), 0)
    except _TooBig as exc:
        message = (say("yaml_key_too_big", source=source, key=key, problem=exc) if key
                   else say("yaml_document_too_big", source=source, problem=exc))
        raise SpecError(key, message) from None


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int], depth: int) -> int:
    """How many values `node` holds once every alias is written out (memoized in `sizes`)."""
    ident = id(node)
    if ident in sizes:
        return sizes[ident]
    if ident in open_nodes:
        raise _TooBig(say("yaml_self_alias"))
    if depth > MAX_YAML_NESTING:
        raise _TooBig(say("yaml_nests", limit=MAX_YAML_NESTING))
    total = 1
    if not isinstance(node, yaml.ScalarNode):
        open_nodes.add(ident)
        children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
        for child in children:
            total += _expanded_size(child, sizes, open_nodes, depth + 1)
            if total > MAX_YAML_VALUES:
                raise _TooBig(say("yaml_expands", limit=MAX_YAML_VALUES))
        open_nodes.discard(ident)
    sizes[ident] = total
    return total
