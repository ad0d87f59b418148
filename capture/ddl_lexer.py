"""The DDL parser's lexer and token reader: MySQL/MariaDB statement text -> tokens (names
unquoted, bare words upper-cased with their spelling kept, strings unescaped, comments dropped,
executable comments read as code), and a cursor over them for the recursive reader in
`capture.ddl`. Anything the grammar does not expect raises `Unparsed`, which the parser turns into
"not understood" (never a guess).
"""
from __future__ import annotations

import dataclasses
import re

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>/\*(?![!M]).*?\*/|--[ \t][^\n]*|\#[^\n]*)
  | (?P<exec>/\*M?!\d*)            # executable comment opener: its content is code
  | (?P<execend>\*/)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<string>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
  | (?P<number>\d+(?:\.\d+)?)
  | (?P<word>[A-Za-z_$@][\w$@]*)
  | (?P<punct>.)
""", re.VERBOSE | re.DOTALL)


@dataclasses.dataclass(frozen=True, slots=True)
class Tok:
    kind: str      # ident | string | number | word | punct
    text: str      # identifiers unquoted, words upper-cased, strings unescaped
    # Where the token is in the statement (end exclusive): an expression is kept as written.
    start: int = dataclasses.field(default=-1, compare=False)
    end: int = dataclasses.field(default=-1, compare=False)

    def is_(self, *words: str) -> bool:
        return self.kind == "word" and self.text in words


def unescape(s: str) -> str:
    q, body = s[0], s[1:-1]
    body = body.replace(q + q, q)
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "0": "\0", "r": "\r"}.get(m.group(1), m.group(1)), body)


class Unparsed(Exception):
    pass


class TokenReader:
    def __init__(self, toks: list[Tok], sql: str = "") -> None:
        self.t = toks
        self.i = 0
        self.sql = sql

    def text(self, first: Tok, last: Tok) -> str:
        """The statement's own text from first to last (inclusive); empty when unknown."""
        if not self.sql or first.start < 0 or last.end < first.start:
            return ""
        return self.sql[first.start:last.end]

    def peek(self, k: int = 0) -> Tok | None:
        j = self.i + k
        return self.t[j] if j < len(self.t) else None

    def next(self) -> Tok:
        tok = self.peek()
        if tok is None:
            raise Unparsed("unexpected end")
        self.i += 1
        return tok

    def accept(self, *words: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.is_(*words):
            self.i += 1
            return True
        return False

    def accept_punct(self, p: str) -> bool:
        tok = self.peek()
        if tok is not None and tok.kind == "punct" and tok.text == p:
            self.i += 1
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            raise Unparsed(f"expected {words}")

    def expect_punct(self, p: str) -> None:
        if not self.accept_punct(p):
            raise Unparsed(f"expected {p!r}")

    def at_end(self) -> bool:
        tok = self.peek()
        return tok is None or (tok.kind == "punct" and tok.text == ";")

    def ident(self) -> str:
        tok = self.next()
        if tok.kind == "ident":
            return tok.text
        if tok.kind == "word":
            return orig_case(tok)
        if tok.kind == "string":  # MySQL accepts 'x' as a name in a few places
            return tok.text
        raise Unparsed(f"expected a name, got {tok.text!r}")

    def name(self, default_db: str) -> tuple[str, str]:
        first = self.ident()
        if self.accept_punct("."):
            return first, self.ident()
        return default_db, first

    def skip_parens(self) -> list[Tok]:
        """Consume a balanced '( ... )' and return its inner tokens."""
        self.expect_punct("(")
        depth, start = 1, self.i
        while depth:
            tok = self.next()
            if tok.kind == "punct":
                depth += {"(": 1, ")": -1}.get(tok.text, 0)
        return self.t[start:self.i - 1]

    def skip_until_comma(self) -> None:
        """Skip to the next top-level ',' or ')' (not consumed) or the end."""
        depth = 0
        while not self.at_end():
            tok = self.peek()
            assert tok is not None
            if tok.kind == "punct":
                if tok.text == "(":
                    depth += 1
                elif tok.text == ")":
                    if depth == 0:
                        return
                    depth -= 1
                elif tok.text == "," and depth == 0:
                    return
            self.i += 1


def orig_case(tok: Tok) -> str:
    """A name as written: bare words keep their original spelling for names."""
    return tok.orig if isinstance(tok, Word) else tok.text


class Word(Tok):
    """A bare word: upper-cased for keyword checks, original spelling kept for names."""

    __slots__ = ("orig",)

    def __init__(self, text: str, start: int = -1, end: int = -1) -> None:
        super().__init__("word", text.upper(), start, end)
        object.__setattr__(self, "orig", text)


def tokenize(sql: str) -> list[Tok]:
    toks: list[Tok] = []
    for m in _TOKEN.finditer(sql):
        kind = m.lastgroup
        text = m.group()
        if kind in ("ws", "comment", "exec", "execend"):
            continue
        a, b = m.span()
        if kind == "quoted":
            toks.append(Tok("ident", text[1:-1].replace("``", "`"), a, b))
        elif kind == "string":
            toks.append(Tok("string", unescape(text), a, b))
        elif kind == "word":
            toks.append(Word(text, a, b))
        else:
            toks.append(Tok(kind or "punct", text, a, b))
    return toks
