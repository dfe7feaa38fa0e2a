"""A small interpreter for the subset of Go's text/template that jobs/export/ollama.py writes
(Ollama renders a Modelfile TEMPLATE with Go's text/template over .Messages): text, `{{ .X }}`,
`$v := ...`, `$v = ...`, `if / else if / else / end`, `range $i, $_ := ...`, and the functions
eq, ne, and, not, len, slice. Enough to render a Modelfile's prompt in a test and compare it with
the Jinja template, independently of ollama.ChatFormat.render. No whitespace trimming (`{{-`):
the writer never emits it, and it is refused here."""
from __future__ import annotations

import re

ACTION = re.compile(r"\{\{(.*?)\}\}", re.S)
TOKEN = re.compile(r'\(|\)|"(?:[^"\\]|\\.)*"|[^\s()]+')


def parse(template: str) -> list:
    pieces, pos = [], 0
    for match in ACTION.finditer(template):
        pieces.append(("text", template[pos:match.start()]))
        action = match.group(1)
        if action.startswith("-") or action.endswith("-"):
            raise ValueError("whitespace trimming is not supported")
        pieces.append(("action", action.strip()))
        pos = match.end()
    pieces.append(("text", template[pos:]))
    body, rest = _block(pieces, 0)
    if rest != len(pieces):
        raise ValueError("unbalanced {{ end }}")
    return body


def _block(pieces: list, i: int) -> tuple[list, int]:
    """Nodes until an `end`/`else` at this level (returned index points at it)."""
    nodes = []
    while i < len(pieces):
        kind, text = pieces[i]
        if kind == "text":
            nodes.append(("text", text))
        elif text == "end" or text.startswith("else"):
            return nodes, i
        elif text.startswith("if "):
            node, i = _if(pieces, i)
            nodes.append(node)
        elif text.startswith("range "):
            names, expr = text[len("range "):].split(":=")
            body, i = _block(pieces, i + 1)
            nodes.append(("range", [n.strip() for n in names.split(",")], expr.strip(), body))
        elif re.match(r"^\$\w+\s*:?=", text):
            name, expr = re.split(r"\s*:?=\s*", text, maxsplit=1)
            nodes.append(("set", name, expr))
        else:
            nodes.append(("out", text))
        i += 1
    return nodes, i


def _if(pieces: list, i: int) -> tuple[tuple, int]:
    branches, condition = [], pieces[i][1][len("if "):]
    while True:
        body, i = _block(pieces, i + 1)
        branches.append((condition, body))
        text = pieces[i][1]
        if text == "end":
            return ("if", branches), i
        condition = text[len("else if "):] if text.startswith("else if ") else "true"


def render(template: str, data: dict) -> str:
    out: list[str] = []
    _run(parse(template), data, {"$": data}, out)
    return "".join(out)


def _run(nodes: list, dot, variables: dict, out: list[str]) -> None:
    for node in nodes:
        if node[0] == "text":
            out.append(node[1])
        elif node[0] == "out":
            out.append(str(_eval(node[1], dot, variables)))
        elif node[0] == "set":
            variables[node[1]] = _eval(node[2], dot, variables)
        elif node[0] == "if":
            for condition, body in node[1]:
                if condition == "true" or _truthy(_eval(condition, dot, variables)):
                    _run(body, dot, variables, out)
                    break
        elif node[0] == "range":
            (index, value), items = node[1], _eval(node[2], dot, variables)
            for i, item in enumerate(items):
                variables[index], variables[value] = i, item
                _run(node[3], item, variables, out)


def _truthy(value) -> bool:
    return bool(value)


def _eval(expr: str, dot, variables: dict):
    tokens = TOKEN.findall(expr)
    value, rest = _pipeline(tokens, 0, dot, variables)
    if rest != len(tokens):
        raise ValueError(f"cannot parse {expr!r}")
    return value


FUNCTIONS = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "and": lambda *a: all(a) and a[-1],
    "not": lambda a: not a, "len": len, "slice": lambda seq, start: seq[start:],
}


def _pipeline(tokens: list, i: int, dot, variables: dict, stop: str | None = None):
    """A command: a function and its arguments, or one operand; up to `)` or the end."""
    if tokens[i] in FUNCTIONS:
        name, args, i = tokens[i], [], i + 1
        while i < len(tokens) and tokens[i] != ")":
            arg, i = _operand(tokens, i, dot, variables)
            args.append(arg)
        return FUNCTIONS[name](*args), i
    return _operand(tokens, i, dot, variables)


def _operand(tokens: list, i: int, dot, variables: dict):
    token = tokens[i]
    if token == "(":
        value, i = _pipeline(tokens, i + 1, dot, variables)
        return value, i + 1  # the ")"
    if token.startswith('"'):
        return token[1:-1].encode().decode("unicode_escape"), i + 1
    if re.fullmatch(r"-?\d+", token):
        return int(token), i + 1
    if token.startswith("$"):
        name, _, field = token.partition(".")
        value = variables[name]
        return (value[field] if field else value), i + 1
    if token.startswith("."):
        return dot[token[1:]], i + 1
    raise ValueError(f"unknown operand {token!r}")


def parse_modelfile(text: str) -> list[tuple[str, str]]:
    """(command, value) pairs as Ollama reads a Modelfile: a port of ParseFile in ollama/ollama's
    parser/parser.go (its state machine, its unquote, and its dropping of every rune that Go's
    strconv.IsPrint rejects, which Python's isprintable matches), so a test sees what `ollama create`
    would. PARAMETER lines come out as ("parameter <name>", value)."""
    commands, state, buf, name = [], "nil", "", ""
    for r in text:
        nxt, r = _next_state(state, r)
        if nxt != state:
            if state == "name":
                name = {"from": "model"}.get(buf.lower(), buf.lower())
                nxt = "parameter" if name == "parameter" else nxt
            elif state == "parameter":
                name = f"parameter {buf}"
            elif state == "value":
                value, ok = _unquote(buf.strip())
                if not ok or r in " \t":
                    buf += r
                    continue
                commands.append((name, value))
            buf, state = "", nxt
        if r and r.isprintable():
            buf += r
    if state == "value":
        commands.append((name, _unquote(buf.strip())[0]))
    return commands


def _next_state(state: str, r: str) -> tuple[str, str]:
    space, newline = r in " \t", r in "\r\n"
    if state == "nil":
        return ("comment", "") if r == "#" else ("nil", "") if space or newline else ("name", r)
    if state == "name":
        return ("name", r) if r.isascii() and r.isalpha() else ("value", "") if space else _refuse(r)
    if state == "value":
        return ("nil", r) if space or newline else ("value", r)
    if state == "parameter":
        return ("parameter", r) if r.isascii() and (r.isalnum() or r == "_") else ("value", "") if space else _refuse(r)
    return ("nil", "") if newline else ("comment", "")


def _refuse(r: str):
    raise ValueError(f"Ollama would refuse this Modelfile at {r!r}")


def _unquote(s: str) -> tuple[str, bool]:
    if s.startswith('"""'):
        return (s[3:-3], True) if len(s) >= 6 and s.endswith('"""') else ("", False)
    if s.startswith('"'):
        return (s[1:-1], True) if len(s) >= 2 and s.endswith('"') else ("", False)
    return s, True
