"""Lexer and parser for the subset of Go ``text/template`` that Ollama model templates use.

``parse(source, funcs)`` turns a template into a list of nodes (``Text``, ``Action``, ``Branch``,
``Jump``) that ``registry.templates`` executes. Errors name the line and column, like Go's.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace
from typing import NamedTuple

SPACE = " \t\r\n"
KEYWORDS = {"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"}
CONSTANTS = {"true": True, "false": False, "nil": None}

_ACTION = re.compile(r"""
    {{(?P<left>-[ \t\r\n])?
    (?P<body>(?:"(?:[^"\\\n]|\\.)*"|`[^`]*`|[^"`}]|}(?!}))*?)
    (?P<right>[ \t\r\n]-)?}}""", re.VERBOSE)
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<number>[+-]?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+))
  | (?P<field>\.[^\W\d]\w*)
  | (?P<dot>\.)
  | (?P<var>\$\w*)
  | (?P<decl>:=)
  | (?P<assign>=)
  | (?P<ident>[^\W\d]\w*)
  | (?P<punct>[|(),])
  | (?P<bad>.)
""", re.VERBOSE)


class TemplateError(ValueError):
    """A template that does not parse or cannot be executed; the message names line and column."""


def error(source: str, offset: int, message: str) -> TemplateError:
    line = source.count("\n", 0, offset) + 1
    column = offset - source.rfind("\n", 0, offset)
    return TemplateError(f"template line {line}, column {column}: {message}")


class Token(NamedTuple):
    kind: str
    text: str
    start: int
    end: int


class Text(NamedTuple):
    text: str


class Jump(NamedTuple):
    kind: str  # "break", "continue"
    pos: int


class ActionItem(NamedTuple):
    """What the lexer makes of one ``{{ ... }}``: its tokens, before parsing."""
    tokens: list[Token]
    pos: int

    @property
    def keyword(self) -> str | None:
        head = self.tokens[0] if self.tokens else None
        return head.text if head and head.kind == "ident" and head.text in KEYWORDS else None


@dataclass
class Operand:
    kind: str  # "dot" (. or .A.B), "var" ($x.A), "lit", "func", "pipe" ((...).A)
    value: object = None
    names: tuple[str, ...] = ()
    pos: int = 0


@dataclass
class Pipe:
    cmds: list[list[Operand]]
    decl: list[str] = field(default_factory=list)
    assign: bool = False


@dataclass
class Action:
    pipe: Pipe
    pos: int
    names: tuple[str, ...] = ()


@dataclass
class Branch:
    kind: str  # "if", "range", "with"
    pipe: Pipe
    body: list
    else_body: list | None
    pos: int


_END = ActionItem([Token("ident", "end", 0, 0)], 0)


def lex(source: str) -> list[Text | ActionItem]:
    """Split the source into text and actions, applying ``{{- `` and `` -}}`` trimming."""
    items: list[Text | ActionItem] = []
    i, trim_next = 0, False
    while True:
        start = source.find("{{", i)
        match = _ACTION.match(source, start) if start >= 0 else None
        if start >= 0 and match is None:
            raise error(source, start, "unclosed action")
        text = source[i:start] if match else source[i:]
        text = text.lstrip(SPACE) if trim_next else text
        text = text.rstrip(SPACE) if match and match["left"] else text
        if text:
            items.append(Text(text))
        if match is None:
            return items
        if not _COMMENT.fullmatch(match["body"]):
            items.append(ActionItem(_tokens(source, match.start("body"), match.end("body")), start))
        i, trim_next = match.end(), bool(match["right"])


def _tokens(source: str, start: int, end: int) -> list[Token]:
    tokens = []
    for match in _TOKEN.finditer(source, start, end):
        if match.lastgroup == "bad":
            raise error(source, match.start(), f"unexpected {match.group()!r} in action")
        if match.lastgroup != "space":
            tokens.append(Token(match.lastgroup or "", match.group(), match.start(), match.end()))
    return tokens


def parse(source: str, funcs: set[str] | frozenset[str]) -> list:
    return _Parser(source, lex(source), funcs).parse()


class _Parser:
    def __init__(self, source: str, items: list[Text | ActionItem], funcs) -> None:
        self.source, self.items, self.funcs = source, items, funcs
        self.i = 0
        self.vars = ["$"]
        self.loops = 0

    def error(self, pos: int, message: str) -> TemplateError:
        return error(self.source, pos, message)

    def parse(self) -> list:
        nodes, stop = self.list()
        if stop is not None:
            raise self.error(stop.pos, f"unexpected {{{{{stop.keyword}}}}}")
        return nodes

    def list(self) -> tuple[list, ActionItem | None]:
        """Nodes up to the next ``{{else}}``/``{{end}}`` (returned) or the end of the source (None)."""
        nodes: list = []
        while self.i < len(self.items):
            item = self.items[self.i]
            self.i += 1
            if isinstance(item, Text):
                nodes.append(item)
            elif item.keyword in ("end", "else"):
                return nodes, item
            else:
                nodes.append(self.action(item))
        return nodes, None

    def action(self, item: ActionItem):
        keyword = item.keyword
        if keyword in ("if", "range", "with"):
            return self.branch(keyword, item, 1)
        if keyword in ("break", "continue"):
            if not self.loops or len(item.tokens) > 1:
                raise self.error(item.pos, f"{{{{{keyword}}}}} outside {{{{range}}}}")
            return Jump(keyword, item.pos)
        if keyword is not None:
            raise self.error(item.pos, f"{{{{{keyword}}}}} is not supported")
        pipe = self.pipe(item.tokens, item.pos)
        return Action(pipe, item.pos, tuple(pipe_names(pipe)))

    def branch(self, kind: str, item: ActionItem, skip: int) -> Branch:
        mark = len(self.vars)
        pipe = self.pipe(item.tokens[skip:], item.pos, range_decl=kind == "range")
        self.loops += kind == "range"
        body, stop = self.list()
        self.loops -= kind == "range"
        else_body = None
        if stop is not None and stop.keyword == "else":
            else_body, stop = self.else_list(kind, stop)
        del self.vars[mark:]
        if stop is None:
            raise self.error(item.pos, f"unexpected EOF: {{{{{kind}}}}} has no {{{{end}}}}")
        if len(stop.tokens) > 1:
            raise self.error(stop.tokens[1].start, f"unexpected {stop.tokens[1].text!r} in end")
        return Branch(kind, pipe, body, else_body, item.pos)

    def else_list(self, kind: str, item: ActionItem) -> tuple[list, ActionItem | None]:
        """The body after ``{{else}}`` and the ``{{end}}`` closing it; ``else if``/``else with`` chain."""
        rest = item.tokens[1:]
        if not rest:
            return self.until_end(self.list())
        if rest[0].text not in ("if", "with") or rest[0].kind != "ident":
            raise self.error(rest[0].start, f"unexpected {rest[0].text!r} in else")
        nested = self.branch(rest[0].text, item, 2)
        if rest[0].text == kind:
            return [nested], _END
        more, stop = self.until_end(self.list())
        return [nested, *more], stop

    def until_end(self, parsed: tuple[list, ActionItem | None]) -> tuple[list, ActionItem | None]:
        nodes, stop = parsed
        if stop is not None and stop.keyword != "end":
            raise self.error(stop.pos, "expected {{end}}, found {{else}}")
        return nodes, stop

    def pipe(self, tokens: list[Token], pos: int, range_decl: bool = False) -> Pipe:
        decl, assign, tokens = self.declaration(tokens, range_decl, pos)
        cmds, i = self.commands(tokens, 0, pos)
        if i < len(tokens):
            raise self.error(tokens[i].start, f"unexpected {tokens[i].text!r}")
        for name in decl:
            if assign and name not in self.vars:
                raise self.error(pos, f"undefined variable {name!r}")
            self.vars.append(name)
        return Pipe(cmds, decl, assign)

    def declaration(self, tokens: list[Token], range_decl: bool, pos: int):
        names, i = [], 0
        while i + 1 < len(tokens) and tokens[i].kind == "var":
            names.append(tokens[i].text)
            if tokens[i + 1].text != ",":
                break
            i += 2
        if not names or i + 1 >= len(tokens) or tokens[i + 1].kind not in ("decl", "assign"):
            return [], False, tokens
        if len(names) > (2 if range_decl else 1):
            raise self.error(pos, "too many declarations in pipeline")
        return names, tokens[i + 1].kind == "assign", tokens[i + 2:]

    def commands(self, tokens: list[Token], i: int, pos: int) -> tuple[list[list[Operand]], int]:
        """``cmd | cmd | ...`` from ``tokens[i:]`` up to a ``)`` or the end."""
        cmds: list[list[Operand]] = []
        while True:
            args = []
            while i < len(tokens) and tokens[i].text not in ("|", ")"):
                operand, i = self.operand(tokens, i)
                args.append(operand)
            if not args:
                raise self.error(tokens[i].start if i < len(tokens) else pos, "missing value for command")
            if (cmds or len(args) > 1) and args[0].kind != "func":
                raise self.error(args[0].pos, "can't give argument to non-function")
            cmds.append(args)
            if i >= len(tokens) or tokens[i].text != "|":
                return cmds, i
            i += 1

    def operand(self, tokens: list[Token], i: int) -> tuple[Operand, int]:
        tok = tokens[i]
        if tok.kind in ("string", "raw", "number"):
            return Operand("lit", self.literal(tok), pos=tok.start), i + 1
        if tok.kind == "ident":
            return self.ident(tok), i + 1
        if tok.kind == "dot":
            operand = Operand("dot", pos=tok.start)
        elif tok.kind == "field":
            operand = Operand("dot", names=(tok.text[1:],), pos=tok.start)
        elif tok.kind == "var":
            if tok.text not in self.vars:
                raise self.error(tok.start, f"undefined variable {tok.text!r}")
            operand = Operand("var", tok.text, pos=tok.start)
        elif tok.text == "(":
            cmds, j = self.commands(tokens, i + 1, tok.start)
            if j >= len(tokens) or tokens[j].text != ")":
                raise self.error(tok.start, "unclosed left paren")
            operand, i = Operand("pipe", Pipe(cmds), pos=tok.start), j
        else:
            raise self.error(tok.start, f"unexpected {tok.text!r} in operand")
        return _chain(operand, tokens, i + 1)

    def ident(self, tok: Token) -> Operand:
        if tok.text in CONSTANTS:
            return Operand("lit", CONSTANTS[tok.text], pos=tok.start)
        if tok.text in KEYWORDS or tok.text not in self.funcs:
            raise self.error(tok.start, f"function {tok.text!r} not defined")
        return Operand("func", tok.text, pos=tok.start)

    def literal(self, tok: Token):
        if tok.kind == "raw":
            return tok.text[1:-1]
        try:
            return ast.literal_eval(tok.text)  # Go and Python agree on string escapes and number syntax
        except (ValueError, SyntaxError):
            raise self.error(tok.start, f"bad {tok.kind} literal {tok.text}") from None


def _chain(operand: Operand, tokens: list[Token], i: int) -> tuple[Operand, int]:
    """Absorb ``.A.B`` written right after an operand (no space between)."""
    names = list(operand.names)
    while i < len(tokens) and tokens[i].kind == "field" and tokens[i].start == tokens[i - 1].end:
        names.append(tokens[i].text[1:])
        i += 1
    return replace(operand, names=tuple(names)), i


def pipe_names(pipe: Pipe) -> list[str]:
    names: list[str] = []
    for cmd in pipe.cmds:
        for operand in cmd:
            names += operand.names
            if operand.kind == "pipe":
                names += pipe_names(operand.value)  # type: ignore[arg-type]
    return names


def identifiers(nodes: list) -> list[str]:
    """Every field name the nodes reference (``.Messages``, ``$.System``, ``.Function.Name``)."""
    names: list[str] = []
    for node in nodes:
        if isinstance(node, Action):
            names += node.names
        elif isinstance(node, Branch):
            names += pipe_names(node.pipe) + identifiers(node.body) + identifiers(node.else_body or [])
    return names


def cut_after(nodes: list, name: str) -> tuple[list, bool]:
    """The nodes up to and including the first action that uses field ``name`` (Ollama's
    "render only up to ``{{ .Response }}``"), and whether one was found."""
    kept: list = []
    for node in nodes:
        if isinstance(node, Action) and name in node.names:
            return [*kept, node], True
        found = False
        if isinstance(node, Branch):
            node, found = _cut_branch(node, name)
        kept.append(node)
        if found:
            return kept, True
    return kept, False


def _cut_branch(node: Branch, name: str) -> tuple[Branch, bool]:
    body, found = cut_after(node.body, name)
    if found:
        return replace(node, body=body, else_body=None), True
    if node.else_body is None:
        return node, False
    else_body, found = cut_after(node.else_body, name)
    return replace(node, else_body=else_body), found
