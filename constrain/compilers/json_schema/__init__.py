r"""JSON Schema (draft 2020-12, plus the draft-07 / draft-04 spellings) to the grammar IR.

:func:`schema_to_grammar` lowers a schema to a :class:`~constrain.grammar.ir.Grammar` (and lists what lenient mode
relaxed); :func:`compile_json_schema` compiles it for a vocabulary. The language is JSON text whose value the schema
accepts, in a canonical form (below). Each (sub)schema, keyed by its JSON pointer (a set of pointers once ``allOf``
/ ``$ref`` / branches are merged), becomes one rule, so ``$ref`` cycles are rule calls; the lexical pieces (a JSON
string, number, integer, whitespace, ``true``/``false``/``null``, any value) are shared rules.

How the output is written
-------------------------
- ``whitespace="compact"`` (default): no whitespace, as ``json.dumps(x, separators=(",", ":"))``. ``"flexible"``:
  0 to ``max_whitespace`` characters of ``[ \t\n\r]`` around ``{ } [ ] , :`` inside containers (never before or
  after the top-level value). ``"indent"``: the layout of ``json.dumps(x, indent=2)``; nesting deeper than
  :data:`MAX_INDENT_DEPTH` continues compactly.
- Strings are canonical, as ``json.dumps(s, ensure_ascii=False)`` writes them: ``\"``, ``\\``, ``\b \f \n \r
  \t``, other control characters as ``\u00xx`` (lower-case hex), every other character as itself. Every decoded
  string has exactly one encoding, so constraints on the *decoded* string (``pattern``, ``format``, lengths in
  code points, enums, excluded values, property names) are translated exactly: the decoded language is an
  automaton over code points, each special character on its edges becomes its escape sequence, and the result is
  written back as a regex by state elimination. Patterns and formats therefore see escaped characters like any
  other; nothing is refused for needing an escape. When a pattern's own text (or that text with its character
  classes widened to the escapes they contain) means exactly that language, it is used as is: the automaton
  check decides, so the short form is never wrong.
- Numbers: ``integer`` as ``0`` or ``-?[1-9][0-9]*``; an unconstrained ``number`` as any JSON number; a ``number``
  with bounds, ``multipleOf`` or exclusions in plain decimal notation (no exponent, no ``-0``), where every
  constraint is exact. (``1.0`` is a valid integer that is simply never produced.)
- Objects: the names of ``properties`` (then names only in ``required``) in that order, each present or absent,
  then additional properties (keys that are none of those names, when allowed) in any order. With
  ``property_order="any"``, an object of at most :data:`MAX_ANY_ORDER_LATER_PROPERTIES` such names takes them in
  any order, each at most once, additional properties anywhere among them (one rule with a state per set of names
  read for up to :data:`MAX_ANY_ORDER_PROPERTIES` names, past that, unless the object is one of several
  alternatives of a branching keyword that may be objects, a rule per set, written when a matcher reaches it;
  ``dependentRequired`` checked on the set of names read); a larger object, one that counts
  additional properties against ``minProperties``/``maxProperties``, or one under a negated
  ``patternProperties``/``propertyNames``/``additionalProperties`` keeps the declared order.

Keywords
--------
Exact: ``type`` (lists too); ``enum``/``const`` (any JSON values, compared as JSON; the candidates are validated
against the whole conjunction, by ``jsonschema`` or, for parts of only ``type``/``enum``/``const``/``not``, by an
equivalent check of its own, so they combine exactly with anything); ``properties``,
``required``, ``additionalProperties`` (true / false / schema), ``patternProperties`` (up to
:data:`MAX_PATTERN_PROPERTIES` distinct patterns per object: the key space is split into the regions they
define), ``propertyNames`` (string constraints or enums), ``minProperties``/``maxProperties``,
``dependentRequired``, ``dependentSchemas`` and draft-07 ``dependencies`` (each trigger present or absent);
``allOf`` and ``$ref`` (merged: kinds intersected, bounds tightened, properties and requirements combined, per
schema object for ``additionalProperties``); ``anyOf``; ``oneOf`` when its branches are provably disjoint
(kinds, const/enum values, a required discriminator with disjoint values, a required name another closed branch
forbids), when split by kind of value each kind has at most one branch that always holds, or when the branches
that overlap can be made exclusive (each branch with the negation of every branch it may overlap, each negation
kept to the alternatives that can hold beside it: :meth:`~.combinators._Combinators.exclusive_one_of`, within
:data:`~.combinators.MAX_ONE_OF_COMBINATIONS` alternatives); ``not`` of anything built from ``type``,
``enum``/``const`` of scalars, single-keyword constraints (bounds, lengths, ``pattern``, ``format``,
``required``, item and property counts), ``properties``/``items``/``prefixItems``/``contains`` (rewritten
positively), ``patternProperties``/``propertyNames``/``additionalProperties`` (an object must hold a member that
witnesses each negation: :meth:`~.objects._ObjectRules.witnessed_members`, at most
:data:`~.objects.MAX_WITNESSES` per object), ``oneOf`` (no branch, or two), the dependent keywords,
``allOf``/``anyOf``/``not``/``if``; ``if``/``then``/``else`` when ``if`` can be negated so; ``$ref`` with
JSON pointers (``~0 ~1``, percent-encoding), ``$anchor``, ``$id``-based URIs inside the document,
``$defs``/``definitions``, recursion;
``$dynamicRef``/``$recursiveRef`` that resolve statically; ``items``, ``prefixItems``, draft-07 ``items`` lists
with ``additionalItems``, ``minItems``/``maxItems``; ``contains`` with ``minContains``/``maxContains`` (up to 3
on one array, beside prefix items too: counted by a small automaton over the items, each read as a variant
counted for the ``contains`` it matches); ``minLength``/``maxLength`` (code points; long bounds as blocks of
fixed-length rules); ``pattern`` (ECMAScript search semantics: each top-level alternative anchored only by its
own ``^``/``$``; the regex subset of :mod:`constrain.automata.regex`: ``\d \w \s`` ASCII, ``.`` any character
but ``\n``, lookahead ``(?=...)``/``(?!...)`` anywhere, built exactly within
:data:`~constrain.automata.regex.MAX_LOOKAROUND_STATES`; together with a length bound, one byte automaton that
counts characters beside the pattern's, only the counts that can still end in range
(:func:`~constrain.compilers.json_schema.counted._counted_dfa`), or when that is too large, blocks of a fixed
number of characters, one rule per pattern state and block count; a pattern every string satisfies leaves only
the length bound);
``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum`` (digit by digit on both sides of the point;
draft-04 boolean exclusives too);
``multipleOf`` (integer or decimal: a remainder automaton for moduli ``M / 10**k`` with ``M`` up to
:data:`MAX_MODULUS`, combined with the range, written as one regex when small, else as one rule per remainder
state, a call per digit; finite ranges are listed);
``unevaluatedProperties``/``unevaluatedItems`` (what in-place subschemas of the same conjunction evaluate;
``anyOf`` then branches on every non-empty set of holding branches, so the annotations are exact).

Formats (strings only): ``date``, ``duration``, ``ipv4`` (no leading zeros), ``ipv6`` (RFC 4291, no zone id),
``uuid``, ``json-pointer``, ``relative-json-pointer``: exact. ``time``/``date-time`` (RFC 3339 without leap
seconds), ``email`` (RFC 5321 Mailbox: dot-atom or quoted local part; LDH domain or address literal),
``hostname`` (RFC 1123 LDH labels of at most 48 characters, at most 5 labels, no ``--`` in positions 3-4 so no
IDNA A-labels), ``uri``/``uri-reference`` (RFC 3986, no IPvFuture), ``uri-template`` (RFC 6570): subsets. A
format regex never accepts an invalid value. ``idn-email``, ``idn-hostname``, ``iri``, ``iri-reference``,
``regex`` are refused (lenient: ignored); unknown formats are annotations and ignored.

``uniqueItems`` is exact when at most one item is possible or every item comes from a finite set of values, at
most :data:`MAX_UNIQUE_ENUM` in all: an enum or const, booleans, ``null``, the integers of a bounded range, or an
``anyOf``/``oneOf`` of these, each value checked against the whole item schema (prefix items may each have their
own set; ``contains`` counts are exact over the values used): one rule per set of values used so far, at most
:data:`MAX_UNIQUE_SETS`.

Refused in strict mode, relaxed in lenient mode (each relaxation listed): other ``uniqueItems: true``
(dropped); ``oneOf`` not shown exact (treated as ``anyOf``); ``not``/``if`` that cannot be negated (ignored);
more than 3 ``contains`` on one array, ``maxContains`` whose schema cannot be negated, ``unevaluatedItems``
beside ``contains`` (ignored); unsupported regex constructs and formats (ignored);
``multipleOf`` with a large modulus, a pattern/format together with a length bound whose exact combination
needs too large an automaton (a word count beside a character count, ``format: uri`` with ``maxLength: 255``), a
lookahead pattern past its bounds, counts of many optional properties, too many ``patternProperties`` (the keyword
ignored or, for keys, additional properties not produced); ``minProperties`` that repeated additional keys could
fake (kept); ``$dynamicRef``/``$recursiveRef`` with a dynamic scope (resolved statically); keywords of another
draft that this draft's validator ignores, e.g. ``dependencies`` in a schema declaring 2020-12, and the draft-03
``divisibleBy``/``disallow``/``extends`` (ignored, as a validator would). Without ``$schema``, a schema is read
as 2020-12 plus the draft-07 spellings (``dependencies``, ``items`` lists with ``additionalItems``), or as draft-07
when only the draft-07 metaschema accepts it. Unknown keywords and annotations (``title``, ``description``,
``default``, ``examples``, ``$comment``, ``deprecated``, ``readOnly``, ``writeOnly``, ``content*``, ``$schema``,
``$id``...) are ignored in both modes.

Errors (:class:`JsonSchemaError`, with the JSON pointer and keyword at fault): a schema that is not valid JSON
Schema (its metaschema; patterns are judged by the regex compiler, not by Python's ``re``), an unresolvable or
remote ``$ref``, an unsatisfiable schema (``minimum`` above ``maximum``, an empty enum, a contradictory
``allOf``, ``minLength`` above ``maxLength``, a required property that cannot be present, a recursion that never
ends). Unsatisfiable parts that are optional (an anyOf branch, an optional property) are simply left out.

Lazy lowering (``lazy=True``, the default of :func:`compile_json_schema`; strict mode): the value of a property or
of an array's items whose subschema :mod:`.deferral` certifies (it can be neither refused nor unsatisfiable, and
reaches enough subschemas to be worth it) gets a rule named now and written when a pushdown first calls it
(:attr:`~constrain.grammar.ir.Grammar.deferred`); what a compile answers does not change.

Known limits: the property order is fixed (a valid object whose keys come in another order is not produced);
additional-property keys may repeat (a grammar cannot remember unbounded key sets; ``minProperties`` that only
repeated keys could meet is refused; a repeated additional key may be the witness of a negated
``patternProperties`` or ``additionalProperties``: a text with a repeated name has no defined value);
``\d``/``\w``/``\s`` are ASCII as in ECMAScript, whereas Python's ``re``
(what jsonschema uses) also matches other Unicode digits/letters/spaces, so a negated class such as ``\D`` allows
a few characters that jsonschema would reject; formats are asserted (also on enum values of the same schema),
while jsonschema treats most of them as annotations.

The package, by concern (imports point one way: from the core to the concerns, to the pieces they share):

- :mod:`.compiler`: the core (:class:`~.compiler._Compiler`: conjunctions of parts become rules), and
  :func:`schema_to_grammar` and :func:`compile_json_schema`. The concerns are its mixins:
  :mod:`.combinators` (``anyOf``/``oneOf``/``not``/``if``, negation, the merging of ``allOf`` into a shape),
  :mod:`.enums` (``enum``/``const``), :mod:`.numbers`, :mod:`.strings`, :mod:`.arrays`, :mod:`.objects` and
  :mod:`.any_order` (the members of objects under ``property_order="any"``, which :mod:`.objects` calls on);
  :mod:`.deferral` certifies the values whose rules a lazy compile writes when a matcher first reaches them.
- :mod:`.document`: the schema document (dialect, metaschema validation, ``$ref``/``$id``/anchors, validation of
  values against its parts); :mod:`.keywords`: the keyword tables, parts and shapes; :mod:`.layout`: the
  punctuation of each whitespace mode and the rules every schema shares; :mod:`.rules`: the clean-up of a
  schema's rules.
- :mod:`.formats` (format regexes), :mod:`.cdfa` (automata over code points), :mod:`.regex_ast` (regex ASTs and
  their rendering), :mod:`.values` (JSON values and lexical pieces) and :mod:`.errors`.
"""

from constrain.compilers.json_schema.any_order import (
    MAX_ANY_ORDER_LATER_NAME_BYTES,
    MAX_ANY_ORDER_LATER_PROPERTIES,
    MAX_ANY_ORDER_PROPERTIES,
    MAX_ANY_ORDER_STATES,
    MAX_ANY_ORDER_STATES_TOTAL,
)
from constrain.compilers.json_schema.arrays import MAX_CONTAINS_STATES, MAX_UNIQUE_ENUM, MAX_UNIQUE_SETS
from constrain.compilers.json_schema.cdfa import MAX_AUTOMATON_STATES, MAX_REGEX_CHARS
from constrain.compilers.json_schema.combinators import MAX_ONE_OF_COMBINATIONS
from constrain.compilers.json_schema.compiler import (
    DEFAULT_TIME_LIMIT,
    MAX_RULES,
    compile_json_schema,
    schema_to_grammar,
)
from constrain.compilers.json_schema.deferral import (
    MAX_DEFERRING_NODES,
    MIN_DEFERRED_SUBSCHEMAS,
    MIN_DEFERRING_NODES,
)
from constrain.compilers.json_schema.layout import MAX_INDENT_DEPTH
from constrain.compilers.json_schema.numbers import MAX_ENUMERATED_MULTIPLES, MAX_MODULUS
from constrain.compilers.json_schema.objects import MAX_PATTERN_PROPERTIES, MAX_WITNESSES
from constrain.compilers.json_schema.strings import (
    LENGTH_BLOCK,
    LENGTH_BLOCK_THRESHOLD,
    MAX_BYTE_STATES,
    MAX_COUNTED_BYTE_STATES,
    MAX_COUNTED_STATES,
)
from constrain.errors import JsonSchemaError

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "LENGTH_BLOCK",
    "LENGTH_BLOCK_THRESHOLD",
    "MAX_ANY_ORDER_LATER_NAME_BYTES",
    "MAX_ANY_ORDER_LATER_PROPERTIES",
    "MAX_ANY_ORDER_PROPERTIES",
    "MAX_ANY_ORDER_STATES",
    "MAX_ANY_ORDER_STATES_TOTAL",
    "MAX_AUTOMATON_STATES",
    "MAX_BYTE_STATES",
    "MAX_CONTAINS_STATES",
    "MAX_COUNTED_BYTE_STATES",
    "MAX_COUNTED_STATES",
    "MAX_DEFERRING_NODES",
    "MAX_ENUMERATED_MULTIPLES",
    "MAX_INDENT_DEPTH",
    "MAX_MODULUS",
    "MAX_ONE_OF_COMBINATIONS",
    "MAX_PATTERN_PROPERTIES",
    "MAX_REGEX_CHARS",
    "MAX_RULES",
    "MAX_UNIQUE_ENUM",
    "MAX_UNIQUE_SETS",
    "MAX_WITNESSES",
    "MIN_DEFERRED_SUBSCHEMAS",
    "MIN_DEFERRING_NODES",
    "JsonSchemaError",
    "compile_json_schema",
    "schema_to_grammar",
]
