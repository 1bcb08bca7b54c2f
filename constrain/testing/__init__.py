"""Helpers for testing code that uses constrain: tiny vocabularies, brute-force masks, random walks under a mask.

constrain's own tests use them, and so can yours::

    from constrain.testing import byte_vocabulary, check_mask, random_walk

    structure = compile_regex(r"[a-c]{2,5}", byte_vocabulary())
    matcher = structure.matcher()
    check_mask(matcher)                      # the mask equals the tokens a brute-force search allows
    tokens = random_walk(structure, rng=0)   # allowed tokens drawn until the structure may end

- :mod:`constrain.testing.vocabularies`: :func:`byte_vocabulary` (every byte a token), :func:`tiny_vocabulary`
  (the tokens you list) and :func:`random_vocabulary` (seeded random runs of a few units, so that tokens cross
  the boundaries of a grammar's pieces). Each puts one end-of-sequence id after its tokens.
- :mod:`constrain.testing.masks`: :func:`brute_force_mask`, the oracle for :meth:`Matcher.mask
  <constrain.runtime.matcher.Matcher.mask>`, found by trying every token's bytes on the structure without masks;
  :func:`brute_force_state_mask` for a structure's state; :func:`check_mask`, which compares the two and names
  the tokens that differ.
- :mod:`constrain.testing.walks`: :func:`random_walk` (seeded walks under the mask), :func:`accepts_text`
  (whether a structure reads a text byte by byte and may end there) and :func:`token_length_weights` (weights
  that prefer short tokens, so that walks end sooner).
- :mod:`constrain.testing.memory`: :func:`~constrain.testing.memory.status_mib`, a process's memory (resident,
  peak, anonymous) as Linux reports it, for tests that bound it.

The library itself never imports this package.
"""

from constrain.testing.masks import brute_force_mask, brute_force_state_mask, check_mask
from constrain.testing.vocabularies import byte_vocabulary, random_vocabulary, tiny_vocabulary
from constrain.testing.walks import accepts_text, random_walk, token_length_weights

__all__ = [
    "accepts_text",
    "brute_force_mask",
    "brute_force_state_mask",
    "byte_vocabulary",
    "check_mask",
    "random_vocabulary",
    "random_walk",
    "tiny_vocabulary",
    "token_length_weights",
]
