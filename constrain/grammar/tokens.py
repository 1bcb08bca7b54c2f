"""Tokens named in a grammar (:class:`~constrain.grammar.ir.Token`, :class:`~constrain.grammar.ir.TokensExcept`),
resolved against a vocabulary when the grammar is compiled.

Every named token is given a *token literal* (:func:`~constrain.vocab.vocabulary.token_literal`, bytes no text
holds) in a vocabulary derived for the structure (:meth:`~constrain.vocab.vocabulary.Vocabulary.with_token_literals`):

- ``Token(t)`` becomes the literal of ``t``: that token, and no spelling of its text by other tokens;
- ``Repeat(TokensExcept(ts), 0 or 1, None)`` becomes any (non-empty) UTF-8 text: literals are not text, so the
  tokens ``ts`` cannot occur in it (the text ones among them get a literal), and neither can any special token;
- any other use of ``TokensExcept`` (exactly one token, or a counted number) is refused: over bytes the matcher
  cannot tell where one token ends, so it could not honour it exactly.
"""

from __future__ import annotations

import numpy as np

from constrain.automata.text import ANY_TEXT, SOME_TEXT
from constrain.errors import GrammarError
from constrain.grammar.ir import Alt, Expr, Grammar, Literal, Regex, Repeat, Seq, Token, TokensExcept
from constrain.vocab.vocabulary import Vocabulary, token_literal


def token_id(ref: int | str, vocab: Vocabulary) -> int:
    """The id a token reference names: an id, a special token's name, or the exact text of one token."""
    if isinstance(ref, bool) or not isinstance(ref, (int, str)):
        raise GrammarError(f"a token is named by an id or a text, not {ref!r}")
    if isinstance(ref, int):
        if not 0 <= ref < vocab.size:
            raise GrammarError(f"names token {ref}, outside this vocabulary's ids 0..{vocab.size - 1}")
        return ref
    for i, name in vocab.special_names.items():
        if name == ref:
            return i
    data = ref.encode()
    lengths = np.diff(vocab.offsets)
    found = [
        i for i in np.flatnonzero(vocab.matchable & (lengths == len(data))).tolist() if vocab.token_bytes(i) == data
    ]
    if len(found) > 1:
        ids = ", ".join(map(str, found))
        raise GrammarError(f"names the token {ref!r}, a text that tokens {ids} share: name one by id (<[id]>)")
    if not found:
        raise GrammarError(f"names the token {ref!r}, which is not one token of this vocabulary")
    return found[0]


def resolve_tokens(grammar: Grammar, vocab: Vocabulary) -> tuple[Grammar, Vocabulary]:
    """``grammar`` with its named tokens written as token literals, and the vocabulary to compile it for."""
    if not grammar.names_tokens:
        return grammar, vocab
    named: set[int] = set()
    rules = {}
    for name, body in grammar.rules.items():
        try:
            rules[name] = _resolve(body, vocab, named, {})
        except GrammarError as exc:
            where = grammar.origins.get(name)
            raise GrammarError(f"rule {name!r}{f' ({where})' if where else ''} {exc}") from None
    if not named:
        return Grammar(rules, grammar.start, grammar.origins), vocab
    return Grammar(rules, grammar.start, grammar.origins), vocab.with_token_literals(named)


def _resolve(expr: Expr, vocab: Vocabulary, named: set[int], done: dict[int, Expr]) -> Expr:
    kind = type(expr)
    if kind is Token:
        i = token_id(expr.ref, vocab)
        if i in vocab.eos_ids:
            raise GrammarError(
                f"names token {i} ({vocab.token_text(i)!r}), which ends the sequence: a structure ends where it "
                "is complete, without naming it"
            )
        named.add(i)
        return Literal(token_literal(i))
    if kind is TokensExcept:
        raise GrammarError(
            "reads exactly one token other than some (!<...>), which a byte-level matcher cannot honour exactly; "
            "only a repetition of it (!<...>* or !<...>+: text without those tokens) is supported"
        )
    if kind not in (Seq, Alt, Repeat):
        return expr
    found = done.get(id(expr))
    if found is not None:
        return found
    if kind is Repeat:
        if type(expr.item) is TokensExcept and expr.max is None and expr.min <= 1:
            excluded = (token_id(ref, vocab) for ref in expr.item.refs)
            named.update(i for i in excluded if vocab.matchable[i])  # a special one is never text anyway
            out: Expr = Regex(SOME_TEXT if expr.min else ANY_TEXT)
        else:
            item = _resolve(expr.item, vocab, named, done)
            out = expr if item is expr.item else Repeat(item, expr.min, expr.max)
    else:
        items = tuple(_resolve(item, vocab, named, done) for item in expr.items)
        out = expr if all(a is b for a, b in zip(items, expr.items)) else kind(items)
    done[id(expr)] = out
    return out
