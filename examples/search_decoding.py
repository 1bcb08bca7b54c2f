"""Best-of-n, self-consistency and MBR: sample a few structured outputs in one batch, then choose among them.

    python examples/search_decoding.py

``llm.best_of`` samples ``n`` candidates of one prompt in one batch (one forward pass per step for all of them,
a seed per row derived from ``seed``) and returns the one of highest mean log-probability per token. The same
candidates can be chosen among in other ways without sampling again: ``constrain.decoding.selection`` has the
majority vote (whole values, or field by field) and minimum Bayes risk (the candidate that agrees most with the
others).
"""

import sys

from pydantic import BaseModel, Field

import constrain
from constrain.decoding import selection


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    city: str = Field(max_length=20)


PROMPT = (
    'Text: Greta Holm, 52, lives in Vienna.\nJSON: {"name": "Greta Holm", "age": 52, "city": "Vienna"}\n\n'
    "Text: Luis Ortega, 29, lives in Madrid.\nJSON: "
)


def main() -> int:
    llm = constrain.LLM()
    best = llm.best_of(PROMPT, Person, n=4, score="mean", temperature=0.8, seed=3, max_new_tokens=32)
    for i, candidate in enumerate(best.candidates):
        print(f"{i}. {candidate.text}  log p = {candidate.logprob:.2f}  mean = {candidate.mean_logprob:.3f}")
    print(f"best-of-4 (mean log-probability): {best.value!r}")

    vote = selection.self_consistency(best.candidates, by="field", validate=Person.model_validate)
    for path, field_vote in vote.fields.items():
        print(f"  {'.'.join(path)}: {field_vote.value!r} ({field_vote.votes} of {field_vote.total})")
    print(f"self-consistency (field by field): {vote.value!r}")

    chosen = selection.mbr(best.candidates, utility="edit")
    print(f"MBR (edit similarity): {chosen.value!r}, expected utility {chosen.scores[chosen.index]:.3f}")

    candidates_valid = all(Person.model_validate_json(c.text) == c.value for c in best.candidates)
    chosen_valid = all(isinstance(s.value, Person) for s in (best, vote, chosen))
    if candidates_valid and chosen_valid:
        print("valid: every candidate and every choice is a Person")
        return 0
    print("invalid: a candidate or a choice is not a valid Person")
    return 1


if __name__ == "__main__":
    sys.exit(main())
