"""Expressions over a document's columns: the language of a source's `keep` and `repeat` (pipeline.py).

    keep   = "quality >= 0.7 and lang == 'en' and chars > 200"
    repeat = "min(score * 2, 3)"

A small, closed grammar read by the recursive-descent parser below into a tree that the engine evaluates over
Arrow arrays with pyarrow.compute (one call per node and block, not per document); nothing is ever passed to
Python's eval. The grammar and its checks are here (a job's typo is one line when its config is made); the
engine evaluates the tree (engine/pipeline.py). From the loosest binding to the tightest:

    or  ->  and  ->  not  ->  comparison (== != < <= > >=, in [...], not in [...], is null, is not null)
        ->  + -  ->  * /  ->  unary -  ->  a number, 'string' or "string", true, false, a name, name(args), (...)

A name is a column (Parquet, Lance) or field (JSON Lines); a dotted name reaches into a struct or a nested JSON
object (`meta.lang`), and `backquotes` take a name with other characters. `chars` and `bytes` are the text's
length in characters and in UTF-8 bytes. Functions: min, max, abs, if(condition, then, else), lower, length.
Arithmetic is in float64. A comparison with a null (a missing value) is null, and `keep` keeps a document only
where it is true, so `score >= 0.5` drops documents without a score; `score is null or score >= 0.5` keeps them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from zephon_titan.errors import ConfigError

# Slots per document a repeat expression may ask for: each is a position of a lane's shuffle window.
MAX_COPIES = 16
# An expression is a line of a config: these bound what a typo or a generated one can cost (the parser recurses
# once per nesting level; the evaluator makes one Arrow call per node and block).
MAX_EXPRESSION_CHARS = 4096
MAX_DEPTH = 64
DERIVED = {"chars": "the text's length in characters", "bytes": "the text's length in UTF-8 bytes"}
FUNCTIONS = {"min": (2, 8), "max": (2, 8), "abs": (1, 1), "if": (3, 3), "lower": (1, 1), "length": (1, 1)}
_KEYWORDS = {"and", "or", "not", "in", "is", "null", "true", "false"}
COMPARE = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal"}
ARITHMETIC = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}
_TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
    r"|(?P<string>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*|`[^`]+`)"
    r"|(?P<op>==|!=|<=|>=|[<>+\-*/(),\[\]]))"
)


class ExpressionError(ConfigError):
    """An expression that cannot be read, or whose parts do not fit together (a ConfigError: it is in the job)."""


# The tree. `kind` is what a node gives: "bool", "number", "string", or "any" (a column: known from the data).
@dataclass(frozen=True)
class Node:
    kind: str


@dataclass(frozen=True)
class Literal(Node):
    value: bool | float | str


@dataclass(frozen=True)
class Column(Node):
    path: str


@dataclass(frozen=True)
class Derived(Node):
    name: str


@dataclass(frozen=True)
class Apply(Node):
    """An operator or function over its arguments (`op`: a pyarrow.compute name or one of this module's)."""

    op: str
    args: tuple[Node, ...]
    values: tuple[bool | float | str, ...] = ()
    """The list of `in [...]`."""


@dataclass(frozen=True)
class Expression:
    text: str
    tree: Node

    def columns(self) -> list[str]:
        """The columns and fields it reads, in first-use order."""
        return list(dict.fromkeys(n.path for n in _walk(self.tree) if isinstance(n, Column)))

    def uses_text(self) -> bool:
        return bool(self.derived())

    def derived(self) -> list[str]:
        """The derived values it uses (`chars`, `bytes`)."""
        return list(dict.fromkeys(n.name for n in _walk(self.tree) if isinstance(n, Derived)))


def _walk(node: Node) -> Iterator[Node]:
    yield node
    if isinstance(node, Apply):
        for a in node.args:
            yield from _walk(a)


def parse(text: str, what: str, want: str) -> Expression:
    """`text` as a tree giving `want` ("bool" or "number"); ExpressionError naming `what` (the config key) and
    the place of a mistake."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"{what} has {len(text):,} characters, over {MAX_EXPRESSION_CHARS:,}; shorten it")
    tree = _Parser(text, what).parse()
    if tree.kind not in (want, "any"):
        raise ExpressionError(f"{what} = {text!r} gives a {tree.kind}, expected a {_KIND_WORD[want]}")
    return Expression(text, tree)


_KIND_WORD = {"bool": "condition (true or false)", "number": "number", "string": "string"}


class _Parser:
    def __init__(self, text: str, what: str):
        self.text, self.what = text, what
        self.tokens: list[tuple[str, str, int]] = []
        at = 0
        while at < len(text):
            match = _TOKEN.match(text, at)
            if match is None or match.end() == at:
                if not text[at:].strip():
                    break
                at += len(text[at:]) - len(text[at:].lstrip())
                self.fail(at, f"cannot read {text[at : at + 10]!r}")
            assert match is not None
            kind = match.lastgroup or ""
            value, start = match.group(kind), match.start(kind)
            if kind == "name" and value in _KEYWORDS:
                kind = "keyword"
            self.tokens.append((kind, value, start))
            at = match.end()
        self.i = 0
        self.depth = 0

    def fail(self, at: int, problem: str) -> None:
        raise ExpressionError(f"{self.what} = {self.text!r}: {problem} at character {at + 1}")

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "", len(self.text))

    def accept(self, *values: str) -> str | None:
        kind, value, _ = self.peek()
        if kind in ("op", "keyword") and value in values:
            self.i += 1
            return value
        return None

    def expect(self, value: str) -> None:
        if self.accept(value) is None:
            _, got, at = self.peek()
            self.fail(at, f"expected {value!r}, found {got or 'the end'!r}")

    def parse(self) -> Node:
        if not self.tokens:
            self.fail(0, "the expression is empty")
        node = self.logical("or")
        kind, value, at = self.peek()
        if kind != "end":
            self.fail(at, f"unexpected {value!r}")
        return node

    def need(self, node: Node, kinds: tuple[str, ...], at: int, role: str) -> Node:
        if node.kind not in (*kinds, "any"):
            self.fail(at, f"{role} needs a {' or '.join(_KIND_WORD[k] for k in kinds)}, got a {node.kind}")
        return node

    def nested(self, parse: Callable[[], Node]) -> Node:
        """`parse()` one level deeper (parentheses, a call's arguments, `not`, unary minus): each level is a dozen
        Python frames, so the depth is bounded before Python's own limit is."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(self.peek()[2], f"nested over {MAX_DEPTH} levels deep; write it flatter")
        try:
            return parse()
        finally:
            self.depth -= 1

    def logical(self, op: str) -> Node:
        below: Callable[[], Node] = (lambda: self.logical("and")) if op == "or" else self.negation
        at = self.peek()[2]
        items = [below()]
        while self.accept(op):
            items.append(below())
        if len(items) == 1:
            return items[0]
        args = tuple(self.need(n, ("bool",), at, f"'{op}'") for n in items)
        return Apply("bool", f"{op}_kleene", args)

    def negation(self) -> Node:
        at = self.peek()[2]
        if self.accept("not"):
            return Apply("bool", "invert", (self.need(self.nested(self.negation), ("bool",), at, "'not'"),))
        return self.comparison()

    def comparison(self) -> Node:
        at = self.peek()[2]
        left = self.arithmetic(("+", "-"))
        op = self.accept(*COMPARE)
        if op:
            right = self.arithmetic(("+", "-"))
            if "any" not in (left.kind, right.kind) and left.kind != right.kind:
                self.fail(at, f"'{op}' compares a {left.kind} with a {right.kind}")
            return Apply("bool", COMPARE[op], (left, right))
        if self.accept("is"):
            negate = bool(self.accept("not"))
            self.expect("null")
            return Apply("bool", "is_valid" if negate else "is_null", (left,))
        if self.peek()[1] == "not" and self.i + 1 < len(self.tokens) and self.tokens[self.i + 1][1] == "in":
            self.i += 2
            return Apply("bool", "invert", (self.membership(left, at),))
        if self.accept("in"):
            return self.membership(left, at)
        return left

    def membership(self, left: Node, at: int) -> Node:
        self.expect("[")
        values: list[bool | float | str] = []
        while not self.accept("]"):
            item = self.atom()
            if not isinstance(item, Literal):
                self.fail(self.peek()[2], "a list after 'in' holds numbers or strings only")
            assert isinstance(item, Literal)
            values.append(item.value)
            if not self.accept(","):
                self.expect("]")
                break
        kinds = {"string" if isinstance(v, str) else "bool" if isinstance(v, bool) else "number" for v in values}
        if not values or len(kinds) > 1 or ("any" != left.kind and kinds != {left.kind}):
            self.fail(at, "'in' needs a non-empty list of values of the kind it tests")
        return Apply("bool", "is_in", (left,), tuple(values))

    def arithmetic(self, ops: tuple[str, ...]) -> Node:
        below: Callable[[], Node] = (lambda: self.arithmetic(("*", "/"))) if ops == ("+", "-") else self.unary
        at = self.peek()[2]
        node = below()
        while op := self.accept(*ops):
            right = below()
            node = Apply(
                "number",
                ARITHMETIC[op],
                (self.need(node, ("number",), at, f"'{op}'"), self.need(right, ("number",), at, f"'{op}'")),
            )
        return node

    def unary(self) -> Node:
        at = self.peek()[2]
        if self.accept("-"):
            return Apply("number", "negate", (self.need(self.nested(self.unary), ("number",), at, "'-'"),))
        return self.atom()

    def atom(self) -> Node:
        kind, value, at = self.peek()
        self.i += 1
        if kind == "number":
            return Literal("number", float(value))
        if kind == "string":
            return Literal("string", _unquote(value))
        if kind == "keyword" and value in ("true", "false"):
            return Literal("bool", value == "true")
        if kind == "op" and value == "(":
            node = self.nested(lambda: self.logical("or"))
            self.expect(")")
            return node
        if kind == "name":
            if self.accept("("):
                return self.call(value, at)
            if value.startswith("`"):
                return Column("any", value[1:-1])
            return Derived("number", value) if value in DERIVED else Column("any", value)
        self.i -= 1
        self.fail(at, f"expected a value, found {value or 'the end'!r}")
        raise AssertionError  # fail() raised

    def call(self, name: str, at: int) -> Node:
        if name not in FUNCTIONS:
            self.fail(at, f"unknown function {name!r} (functions: {', '.join(FUNCTIONS)})")
        args: list[Node] = []
        while not self.accept(")"):
            args.append(self.nested(lambda: self.logical("or")))
            if not self.accept(","):
                self.expect(")")
                break
        least, most = FUNCTIONS[name]
        if not least <= len(args) <= most:
            count = str(least) if least == most else f"{least} to {most}"
            self.fail(at, f"{name}() takes {count} arguments, got {len(args)}")
        if name == "if":
            self.need(args[0], ("bool",), at, "if()'s condition")
            kinds = {a.kind for a in args[1:]} - {"any"}
            if len(kinds) > 1:
                self.fail(at, "if() gives a value of one kind in both branches")
            return Apply(kinds.pop() if kinds else "any", "if_else", tuple(args))
        if name in ("lower", "length"):
            self.need(args[0], ("string",), at, f"{name}()")
            return Apply("string" if name == "lower" else "number", f"utf8_{name}", tuple(args))
        for a in args:
            self.need(a, ("number",), at, f"{name}()")
        op = {"min": "min_element_wise", "max": "max_element_wise", "abs": "abs"}[name]
        return Apply("number", op, tuple(args))


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", r"\1", token[1:-1])


def upper_bound(expression: Expression) -> float:
    """The largest value a numeric expression can take for any column values (interval arithmetic): inf when
    nothing bounds it. A repeat expression must be bounded: it sets how many copies of a document a shuffle
    window has room for."""
    return _interval(expression.tree)[1]


def _interval(node: Node) -> tuple[float, float]:
    inf = math.inf
    if isinstance(node, Literal):
        v = float(node.value) if not isinstance(node.value, str) else 0.0
        return v, v
    if isinstance(node, Derived):
        return 0.0, inf
    if not isinstance(node, Apply) or node.kind == "bool":
        return (0.0, 1.0) if node.kind == "bool" else (-inf, inf)
    spans = [_interval(a) for a in node.args]
    if node.op == "utf8_length":
        return 0.0, inf
    if node.op == "negate":
        return -spans[0][1], -spans[0][0]
    if node.op == "abs":
        lo, hi = spans[0]
        return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if node.op == "min_element_wise":
        return min(s[0] for s in spans), min(s[1] for s in spans)
    if node.op == "max_element_wise":
        return max(s[0] for s in spans), max(s[1] for s in spans)
    if node.op == "if_else":
        return min(spans[1][0], spans[2][0]), max(spans[1][1], spans[2][1])
    (a, b), (c, d) = spans
    if node.op == "add":
        return a + c, b + d
    if node.op == "subtract":
        return a - d, b - c
    if node.op == "divide":
        if c <= 0 <= d:
            return -inf, inf
        c, d = 1 / d, 1 / c
    ends = [x * y for x in (a, b) for y in (c, d) if not (math.isinf(x) and y == 0 or math.isinf(y) and x == 0)]
    return (min(ends), max(ends)) if ends else (-inf, inf)


def check_keep(text: str, what: str) -> None:
    """A `keep` setting: a condition ("" is none)."""
    if text:
        parse(text, what, "bool")


def check_repeat(text: str, what: str) -> None:
    """A `repeat` setting: a number with an upper bound of at most MAX_COPIES ("" is none)."""
    if text:
        copies_of(parse(text, what, "number"), what)


def copies_of(repeat: Expression, what: str) -> int:
    """How many slots per document a repeat expression needs: the ceiling of its upper bound (at least 1)."""
    bound = upper_bound(repeat)
    if not math.isfinite(bound) or bound > MAX_COPIES:
        raise ExpressionError(
            f"{what} = {repeat.text!r} can be {'any number' if not math.isfinite(bound) else f'up to {bound:g}'}: "
            f"bound it, e.g. min({repeat.text}, 3) (a pass trains a document at most {MAX_COPIES} times)"
        )
    return max(1, math.ceil(bound))
