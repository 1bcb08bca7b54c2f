"""Generate text in a Lark grammar: arithmetic and SQL, from the grammars bundled with constrain.

    python examples/lark_grammar.py

``constrain.Lark(text)`` says that a string is a Lark grammar (a bare str would be read as a regex). As an
``output_type`` it returns the generated text, which the grammar accepts as a whole; lark itself parses it here
to show that. The structure is exact: the output is a full sentence of the grammar, not merely a prefix. It says
nothing about meaning: the 270M base model often gets the arithmetic or the query wrong, in valid syntax.
"""

import sys

import lark

import constrain
from constrain import grammars

# arithmetic.lark's expressions end nowhere in particular: a base model would keep appending "+ 1" until
# max_new_tokens. A rule of our own ends each expression at a newline, which the model writes naturally after
# the few-shot example; start= names it.
ARITHMETIC = grammars.load("arithmetic.lark") + '\nline: sum "\\n"\n'
SQL = grammars.load("sql_select.lark")

ARITHMETIC_PROMPT = """Write each sentence as an arithmetic expression.

Sentence: three times the sum of four and five
Expression: 3 * (4 + 5)

Sentence: {sentence}
Expression: """

SQL_PROMPT = """Table employees(id, name, department, salary).
Question: {question}
SQL:
"""


class Evaluate(lark.Transformer):
    """Computes the value of an arithmetic.lark parse tree (its rule aliases are add, sub, mul, div, neg, number)."""

    def number(self, children):
        return float(children[0])

    def add(self, children):
        return children[0] + children[1]

    def sub(self, children):
        return children[0] - children[1]

    def mul(self, children):
        return children[0] * children[1]

    def div(self, children):
        return children[0] / children[1]

    def neg(self, children):
        return -children[0]

    def line(self, children):
        return children[0]


def main() -> int:
    llm = constrain.LLM()

    arithmetic = constrain.Lark(ARITHMETIC, start="line")
    sentences = ["ten minus two, divided by four", "the product of six and seven, plus one"]
    for sentence in sentences:
        text = llm.generate(ARITHMETIC_PROMPT.format(sentence=sentence), output_type=arithmetic, max_new_tokens=32)
        # lark raises an exception if the text is not a sentence of the grammar.
        tree = lark.Lark(ARITHMETIC, start="line").parse(text)
        print(f"{sentence!r} -> {text.strip()!r} = {Evaluate().transform(tree):g}")

    sql = constrain.Lark(SQL)  # start="start", the grammar's own
    question = "the names of the five best-paid employees in the sales department."
    query = llm.generate(SQL_PROMPT.format(question=question), output_type=sql, max_new_tokens=48)
    tree = lark.Lark(SQL).parse(query)
    table = next(tree.find_data("table")).children[0]
    print(f"SQL: {' '.join(query.split())}")
    print(f"     (parsed by lark: SELECT from table {table})")

    print("valid: lark parses every output with its grammar")
    return 0


if __name__ == "__main__":
    sys.exit(main())
