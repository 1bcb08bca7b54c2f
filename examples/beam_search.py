"""Beam search under a structure: the best few outputs that match a regex, with their log-probabilities.

    python examples/beam_search.py

``constrain.beam_search`` keeps the ``num_beams`` best prefixes. Each beam carries its own matcher (copied from
its parent in O(1)), and the logits are masked before the log-softmax, so a hypothesis's score is the model's
probability conditioned on the structure, and every finished hypothesis is a complete match.
"""

import re
import sys

import constrain
from constrain.models import load_default_model

DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
PROMPT = "The first crewed Moon landing happened on (YYYY-MM-DD): "


def main() -> int:
    model, tokenizer = load_default_model()
    vocab = constrain.Vocabulary.from_tokenizer(tokenizer)
    structure = constrain.compile(constrain.Regex(DATE), vocab)

    # The model may be a transformers model (as here: each step re-reads the prefixes, without a KV cache, which
    # suits short outputs) or any callable next_logits(prefixes) -> (len(prefixes), vocab) logits.
    hypotheses = constrain.beam_search(
        model,
        tokenizer.encode(PROMPT),
        num_beams=4,
        max_new_tokens=16,
        structure=structure,  # the end tokens default to the structure's vocabulary's
        num_return_sequences=3,
        length_penalty=0.0,  # rank by the sum of log-probabilities: every date has the same length anyway
    )

    valid = True
    for rank, hypothesis in enumerate(hypotheses, 1):
        text = tokenizer.decode(hypothesis.tokens, skip_special_tokens=True)  # the end token is not text
        matches = hypothesis.finished and re.fullmatch(DATE, text) is not None
        valid = valid and matches
        print(f"{rank}. {text}  log p = {hypothesis.log_prob:.2f}  {'matches' if matches else 'DOES NOT MATCH'}")
    print("valid: every hypothesis is a finished date" if valid else "invalid")
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
