"""The ``constrain`` command: generate inside a structure, compile or check a structure, warm up, benchmark, demo.

Exit codes: 0 done (``check``: the text is accepted); 1 the answer is no (``check``: rejected; ``generate``: the
output ran out of tokens or failed its type's validation; ``demo``: an output was invalid); 2 bad input (a file
that cannot be read, a spec the compiler refuses, a bad flag), said in one line on stderr. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from constrain.errors import ConstrainError, IncompleteOutputError, OutputValidationError
from constrain.vocab.vocabulary import Vocabulary

#: Exit codes.
OK, NO, BAD_INPUT, INTERRUPTED = 0, 1, 2, 130

_handler: logging.Handler | None = None


class CommandError(Exception):
    """Bad input, reported in one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- main -------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose)
    # transformers' own progress bars and advice would bury the output; a caller's settings win.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return args.run(args)
        except (CommandError, ConstrainError, OSError, ValueError) as exc:
            _say(f"error: {_one_line(exc)}")
            return BAD_INPUT
        except KeyboardInterrupt:
            _say("interrupted")
            return INTERRUPTED


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="constrain",
        description="Exact structured generation: generate inside a structure, compile or check one, warm up, "
        "benchmark, serve, demo. Exit codes: 0 done, 1 no (rejected, incomplete or invalid output), 2 bad input.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level (default: INFO)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("generate", help="generate inside a structure, streaming to stdout")
    p.add_argument("prompt", help="the prompt (tip: end it without a space; the model writes the space)")
    _spec_flags(p, required=False)
    _model_flag(p, "the model: a local transformers folder or a GGUF file (default: the embedded Gemma 3 270M)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="default 256")
    p.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="default 0: no top-k")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--fast-forward",
        choices=("off", "tokens", "text"),
        default=None,
        help="append what the structure forces without sampling: 'tokens' (output unchanged), 'text' (the forced "
        "text in the tokenizer's own split; the default for JSON) or 'off'",
    )
    p.set_defaults(run=generate)

    p = commands.add_parser("compile", help="compile a structure and say what it is and costs")
    _spec_flags(p, required=True)
    _model_flag(p, "whose vocabulary: a transformers folder or a GGUF file (default: the Gemma 3 tokenizer)")
    p.set_defaults(run=compile_command)

    p = commands.add_parser("check", help="whether a structure accepts a text, and where it first fails")
    _spec_flags(p, required=True)
    p.add_argument("--text", required=True, metavar="FILE", help="the text to check ('-': stdin), read as bytes")
    _model_flag(p, "whose vocabulary: a transformers folder or a GGUF file (default: the Gemma 3 tokenizer)")
    p.set_defaults(run=check)

    p = commands.add_parser("warmup", help="load (or compile, the first time) numba's kernels")
    p.set_defaults(run=warmup_command)

    p = commands.add_parser("bench", help="MaskBench for constrain: passing schemas, TTFM and TBM")
    p.add_argument("file", help="a MaskBench file (.jsonl or .jsonl.gz): one schema and its tests a line")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="the first N schemas (after --sample)")
    p.add_argument("--sample", type=int, default=None, metavar="N", help="N schemas drawn at random")
    p.add_argument("--seed", type=int, default=0, help="the seed of --sample (default 0)")
    _model_flag(p, "whose tokenizer: a transformers folder or a GGUF file (default: the Gemma 3 tokenizer)")
    p.set_defaults(run=bench)

    p = commands.add_parser("serve", help="an OpenAI-compatible server (/v1/chat/completions, /v1/completions)")
    _model_flag(p, "the model: a local transformers folder or a GGUF file (default: the embedded Gemma 3 270M)")
    p.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="default 8000")
    p.add_argument("--max-batch", type=int, default=None, metavar="N", help="most rows decoded together (default 16)")
    p.add_argument("--model-id", default=None, help="the model's name in /v1/models (default: its folder or file)")
    p.set_defaults(run=serve_command)

    p = commands.add_parser("demo", help="structured generation with the embedded Gemma 3 270M model")
    p.add_argument("--max-new-tokens", type=int, default=96, help="per output (default 96)")
    p.set_defaults(run=demo)
    return parser


def _spec_flags(parser: argparse.ArgumentParser, *, required: bool) -> None:
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--schema", metavar="FILE", help="a JSON Schema file")
    group.add_argument("--pydantic", metavar="MODULE:TYPE", help="a Pydantic model or other type, from a module")
    group.add_argument("--regex", metavar="PATTERN", help="a regular expression the whole output matches")
    group.add_argument("--grammar", metavar="NAME|FILE", help="a bundled grammar (json.gbnf...) or a .lark/.gbnf file")
    group.add_argument("--choices", metavar="A,B,C", help="one of these texts, as written between the commas")
    parser.add_argument(
        "--lenient", action="store_true", help="relax (and list) what a schema says that cannot be honoured exactly"
    )


def _model_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--model", metavar="PATH", default=None, help=help_text)


def _configure_logging(verbose: bool) -> None:
    """The ``constrain`` logger to stderr, as ``constrain: message``; the library itself configures no handler."""
    global _handler
    logger = logging.getLogger("constrain")
    if _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("constrain: %(message)s"))
        logger.addHandler(_handler)
        logger.propagate = False
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)


def _show_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    _say(f"{category.__name__}: {message}")


def _say(text: str) -> None:
    print(f"constrain: {text}", file=sys.stderr, flush=True)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    line = text.splitlines()[0] if text else type(exc).__name__
    if "refused in strict mode" in line:
        line += "; --lenient relaxes it"
    return line


# -- specs and vocabularies ----------------------------------------------------------------------------------------


def _spec(args: argparse.Namespace) -> Any:
    """What the spec flags name, as :func:`constrain.compile` and an ``output_type`` take it; None: no flag."""
    from constrain.compilers.specs import GBNF, Lark, Regex

    if args.schema is not None:
        text = _read_text(args.schema, "schema")
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise CommandError(f"{args.schema} is not JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise CommandError(f"{args.schema} is not a JSON Schema (an object or a boolean)")
        return schema
    if args.pydantic is not None:
        return _import_type(args.pydantic)
    if args.regex is not None:
        return Regex(args.regex)
    if args.grammar is not None:
        from constrain import grammars

        name = args.grammar
        text = grammars.load(name) if name in grammars.names() else _read_text(name, "grammar")
        if name.endswith(".lark"):
            return Lark(text)
        if name.endswith(".gbnf"):
            return GBNF(text)
        raise CommandError(f"--grammar {name}: a bundled grammar ({', '.join(grammars.names())}) or a .lark/.gbnf file")
    if args.choices is not None:
        choices = args.choices.split(",")  # as written: a leading space can be part of a choice
        if "" in choices:
            raise CommandError(f"--choices {args.choices!r}: an empty choice")
        return choices
    return None


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CommandError(f"the {what} {path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def _import_type(target: str) -> Any:
    """``module:Name`` (or ``path/to/file.py:Name``; ``Name`` may be dotted), imported from the current folder."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise CommandError(f"--pydantic {target}: write MODULE:TYPE, e.g. models:Person or models.py:Person")
    try:
        if module_name.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            if spec is None or spec.loader is None or not Path(module_name).is_file():
                raise CommandError(f"--pydantic {target}: no file {module_name}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except CommandError:
        raise
    except Exception as exc:  # whatever the user's module raises while it is imported
        raise CommandError(f"--pydantic {target}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    found: Any = module
    for part in name.split("."):
        if not hasattr(found, part):
            raise CommandError(f"--pydantic {target}: {module_name} has no {name}")
        found = getattr(found, part)
    return found


@dataclass(frozen=True)
class _Tokenizer:
    """A vocabulary, and how to tokenise a text with it (no special tokens)."""

    name: str
    vocab: Vocabulary
    encode: Callable[[str], list[int]]


def _tokenizer(model: str | None) -> _Tokenizer:
    """The Gemma 3 tokenizer (no model weights needed), or a model's: a GGUF file or a transformers folder."""
    from constrain.extras import require

    began = time.perf_counter()
    if model is None:
        from constrain.models.tokenizers import load_gemma_tokenizer

        hf = load_gemma_tokenizer()
        found = _Tokenizer("Gemma 3", Vocabulary.from_tokenizer(hf), lambda t: hf.encode(t, add_special_tokens=False))
    else:
        path = Path(model)
        if path.is_file() and path.suffix.lower() == ".gguf":
            llama_cpp = require("llama_cpp", "llamacpp", feature="a GGUF model")
            from constrain.integrations.llamacpp import vocabulary_from_llama

            llama = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
            encode = lambda t: llama.tokenize(t.encode(), add_bos=False, special=False)  # noqa: E731
            found = _Tokenizer(path.name, vocabulary_from_llama(llama), encode)
        elif path.is_dir():
            require("transformers", "transformers", feature="a transformers tokenizer")
            from transformers import AutoTokenizer

            hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            found = _Tokenizer(
                path.name, Vocabulary.from_tokenizer(hf), lambda t: hf.encode(t, add_special_tokens=False)
            )
        else:
            raise CommandError(f"--model {model}: not a GGUF file or a local transformers folder")
    seconds = time.perf_counter() - began
    logging.getLogger("constrain").info(
        "the %s vocabulary (%s tokens) in %.1f s", found.name, f"{found.vocab.size:,}", seconds
    )
    return found


def _compile(spec: Any, vocab: Vocabulary, lenient: bool) -> tuple[Any, float]:
    """The structure of ``spec`` and the seconds its compile took (never from the compile cache)."""
    from constrain.compilers.api import compile as compile_structure

    began = time.perf_counter()
    structure = compile_structure(spec, vocab, strict=not lenient, cache=False)
    return structure, time.perf_counter() - began


# -- generate ---------------------------------------------------------------------------------------------------


def generate(args: argparse.Namespace) -> int:
    """Stream the output to stdout, then a newline unless it ends with one; the figures on stderr."""
    from constrain.compilers.output_types import output_type
    from constrain.decoding.loop import Decoding
    from constrain.decoding.params import SamplingParams
    from constrain.generation import LLM
    from constrain.generation.streaming import TextStream

    spec = _spec(args)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    resolved = output_type(spec)
    llm = LLM(args.model)
    structure = llm.structure(spec, strict=not args.lenient)
    # The decoding loop llm.stream runs, run here: llm.stream yields text, and the summary counts tokens.
    decoding = Decoding(
        llm.backend,
        [llm.backend.encode(args.prompt)],
        structures=structure,
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        eos_ids=[int(t) for t in llm.vocab.eos_ids],
        fast_forward=args.fast_forward or ("text" if resolved.is_json else "tokens"),
        tokenize=llm.backend.tokenize,
    )
    text = TextStream(llm.vocab)
    began = time.perf_counter()
    try:
        for step in decoding:
            sys.stdout.write("".join(text.push(token) for _, token in step))
            sys.stdout.flush()
    finally:  # the line ends (once) even when the decoding stops on an error
        tail = text.close()
        sys.stdout.write(tail if text.text.endswith("\n") else tail + "\n")
        sys.stdout.flush()
    seconds = time.perf_counter() - began
    row = decoding.rows[0]
    _say(
        f"{len(row.tokens)} tokens ({row.forced} forced) in {seconds:.1f} s ({len(row.tokens) / seconds:.1f} "
        f"tokens/s), prompt {row.prompt_tokens} tokens, finished: {row.finish_reason}"
    )
    if not row.complete:
        _say(f"error: the output is incomplete after {len(row.tokens)} tokens; raise --max-new-tokens")
        return NO
    try:
        resolved.parse(text.text)
    except OutputValidationError as exc:
        _say(f"error: {_one_line(exc)}")
        return NO
    return OK


# -- compile and check ------------------------------------------------------------------------------------------


def compile_command(args: argparse.Namespace) -> int:
    """The structure's size, its compile time and first mask, and what lenient mode relaxed."""
    from constrain.compilers.api import RelaxationWarning
    from constrain.compilers.warmup import warmup

    spec = _spec(args)
    tokenizer = _tokenizer(args.model)
    logging.getLogger("constrain").info(
        "kernels ready in %.1f s", warmup(tokenizer.vocab)
    )  # not charged to the compile
    warnings.simplefilter("ignore", RelaxationWarning)  # listed below instead
    structure, seconds = _compile(spec, tokenizer.vocab, args.lenient)
    began = time.perf_counter()
    structure.matcher().mask()
    first_mask = time.perf_counter() - began
    print(f"structure:  {_shape(structure)}, {_size(structure.nbytes)} of automata")
    print(f"compiled:   {1e3 * seconds:.1f} ms, first mask {1e3 * first_mask:.2f} ms ({tokenizer.name} vocabulary)")
    relaxations = getattr(structure, "relaxations", None) or []
    if relaxations:
        print(f"relaxed:    {len(relaxations)} (lenient mode)")
        for note in relaxations:
            print(f"  {note}")
    elif hasattr(structure, "relaxations"):
        print("relaxed:    nothing")
    return OK


def _shape(structure: Any) -> str:
    """What the automata of a structure are, in numbers."""
    pushdown = getattr(structure, "pushdown", None)
    if pushdown is not None:
        return f"a pushdown automaton of {len(pushdown.rules):,} rules, {pushdown.num_states:,} states"
    dfa = getattr(structure, "dfa", None)
    if dfa is not None:
        return f"a DFA of {dfa.num_states:,} states"
    return repr(structure)


def check(args: argparse.Namespace) -> int:
    """Read the text's bytes through the structure; where it stops, if it does."""
    spec = _spec(args)
    if args.text == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = Path(args.text).read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read the text {args.text}: {exc.strerror or exc}") from None
    structure, _ = _compile(spec, _tokenizer(args.model).vocab, args.lenient)
    at = first_refusal(structure, data)
    if at is None:
        print(f"accepted: {len(data):,} bytes")
        return OK
    print(f"rejected {_where(data, at)}")
    print(f"  {_around(data, at)}")
    if at == len(data) - 1 and data.endswith(b"\n"):
        print("  (the file's last newline: leave it out if it is not part of the text)")
    return NO


def first_refusal(structure: Any, data: bytes) -> int | None:
    """The offset of the first byte ``structure`` cannot read (``len(data)``: the text stops before the structure
    may end), or None when it reads all of ``data`` and may end there. Each byte is read as a single-byte token;
    :class:`~constrain.errors.VocabularyError` when the vocabulary has none for a byte of ``data``."""
    from constrain.errors import VocabularyError

    vocab = structure.vocab
    single = {vocab.token_bytes(i): i for i in range(vocab.size) if vocab.matchable[i] and _one_byte(vocab, i)}
    ids = []
    for offset, byte in enumerate(data):
        token = single.get(bytes([byte]))
        if token is None:
            raise VocabularyError(f"byte {byte:#04x} at offset {offset} has no single-byte token in this vocabulary")
        ids.append(token)
    matcher = structure.matcher()
    read = matcher.validate_tokens(ids)
    if read < len(ids):
        return read
    matcher.advance(ids)
    return None if matcher.is_accepting() else len(data)


def _one_byte(vocab: Vocabulary, token: int) -> bool:
    return int(vocab.offsets[token + 1] - vocab.offsets[token]) == 1


def _where(data: bytes, at: int) -> str:
    """Byte offset, character offset, line and column of ``data[at]`` (its character's, when inside one)."""
    start = at
    while 0 < start < len(data) and data[start] & 0xC0 == 0x80:  # a continuation byte: back to its character
        start -= 1
    chars = sum(1 for b in data[:start] if b & 0xC0 != 0x80)
    line_start = data.rfind(b"\n", 0, start) + 1
    column = sum(1 for b in data[line_start:start] if b & 0xC0 != 0x80) + 1
    line = data.count(b"\n", 0, start) + 1
    if at == len(data):
        return f"at the end (byte {at:,}, character {chars:,}): the text stops before the structure is complete"
    return f"at byte {at:,} (character {chars:,}, line {line}, column {column}): the structure cannot read it"


def _around(data: bytes, at: int, width: int = 30) -> str:
    """The text around ``data[at]``, that character in ⟦ ⟧ (⟦⟧ at the end), control characters escaped."""
    start = at
    while 0 < start < len(data) and data[start] & 0xC0 == 0x80:
        start -= 1
    end = start + 1
    while end < len(data) and data[end] & 0xC0 == 0x80:
        end += 1
    before = data[:start].decode("utf-8", "replace")[-width:]
    char = data[start:end].decode("utf-8", "replace") if start < len(data) else ""
    after = data[end:].decode("utf-8", "replace")[:width]
    return "".join(_visible(part) for part in (before, "⟦", char, "⟧", after)) if char else _visible(before) + "⟦⟧"


def _visible(text: str) -> str:
    return "".join(c if c.isprintable() or c in "⟦⟧" else c.encode("unicode_escape").decode() for c in text)


def _size(nbytes: int) -> str:
    return f"{nbytes:,} bytes" if nbytes < 1 << 10 else f"{nbytes / (1 << 10):,.1f} KiB"


# -- warmup and bench -------------------------------------------------------------------------------------------


def warmup_command(args: argparse.Namespace) -> int:
    from constrain.compilers.warmup import warmup

    print(f"numba kernels ready in {warmup():.1f} s")
    return OK


def serve_command(args: argparse.Namespace) -> int:
    """Serve the model over HTTP until interrupted."""
    if args.max_batch is not None and args.max_batch < 1:
        raise CommandError(f"--max-batch {args.max_batch}: at least 1")
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port {args.port}: 0 to 65535")
    from constrain.generation import LLM
    from constrain.server import serve

    llm = LLM(args.model)
    _say(f"serving on http://{args.host}:{args.port}/v1 (Ctrl-C stops)")
    serve(llm, args.host, args.port, max_batch=args.max_batch, model_id=args.model_id)
    return OK


def bench(args: argparse.Namespace) -> int:
    """The constrain-only MaskBench harness (:mod:`constrain.testing.maskbench`) over a file."""
    from constrain.compilers.warmup import warmup
    from constrain.testing import maskbench

    try:
        records = maskbench.load_records(args.file, limit=args.limit, sample=args.sample, seed=args.seed)
    except OSError as exc:
        raise CommandError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    tokenizer = _tokenizer(args.model)
    logging.getLogger("constrain").info("kernels ready in %.1f s", warmup(tokenizer.vocab))
    results = [maskbench.run_schema(r, tokenizer.vocab, tokenizer.encode) for r in _progress(records, "schemas")]
    print(f"MaskBench, constrain only: {len(records)} schemas of {args.file}, the {tokenizer.name} vocabulary")
    print(maskbench.summarise(results))
    failing = [r for r in results if not r.passing]
    for r in failing[:20]:
        if r.error is not None:
            why = f"refused: {r.error}"
        elif r.valid_rejected:
            why = f"valid instance {r.valid_rejected[0][0]} rejected at {r.valid_rejected[0][1]}"
        else:
            why = f"invalid instance {r.invalid_accepted[0]} accepted"
        print(f"  {r.name}: {why}")
    if len(failing) > 20:
        print(f"  ... and {len(failing) - 20} more")
    return OK


def _progress(items: list[Any], unit: str) -> Any:
    """``items`` with a progress bar on stderr where tqdm is installed (it comes with transformers)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, unit=f" {unit}", leave=False, file=sys.stderr, disable=None)


# -- demo -------------------------------------------------------------------------------------------------------

#: An arithmetic grammar (the bundled ``arithmetic.lark`` with its spaces written out) that a newline ends: a base
#: model does not stop an expression on its own, and after the newline nothing but the end of sequence is allowed.
DEMO_ARITHMETIC = """
start: sum "\\n"
?sum: product | sum " + " product | sum " - " product
?product: atom | product " * " atom | product " / " atom
?atom: NUMBER | "-" atom | "(" sum ")"
%import common.NUMBER
"""

#: A nested JSON Schema: an object in an object, an array of objects, enums and bounded integers.
DEMO_ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "country": {"enum": ["UK", "France", "Germany", "Spain"]},
            },
            "required": ["name", "country"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "product": {"enum": ["laptop", "phone", "tablet", "charger"]},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["product", "quantity"],
                "additionalProperties": False,
            },
        },
        "status": {"enum": ["pending", "shipped", "delivered"]},
    },
    "required": ["customer", "items", "status"],
    "additionalProperties": False,
}

# The prompts give the 270M base model one example where it helps; each ends where the output starts, without a
# trailing space (the model writes a word's space itself: a regex that starts with a word allows it).
_DEMO_PERSON_EXAMPLE = (
    'Text: John Smith is 52 and lives in Leeds.\nJSON: {"name":"John Smith","age":52,"city":"Leeds"}\n'
)
_DEMO_ORDER_EXAMPLE = (
    "Order: Anna Schmidt from Germany bought 3 tablets and 1 phone. Status: shipped.\n"
    'JSON: {"customer":{"name":"Anna Schmidt","country":"Germany"},"items":[{"product":"tablet","quantity":3},'
    '{"product":"phone","quantity":1}],"status":"shipped"}\n\n'
)
_DEMO_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
_DEMO_EMAIL = r" [a-z][a-z0-9._]{0,20}@[a-z0-9-]{1,20}\.(com|org|net)"


@dataclass(frozen=True)
class _DemoCase:
    title: str
    prompt: str
    output_type: Any
    #: A worked example put before the prompt (not shown).
    example: str
    #: Checks the text on its own (not through constrain); raises when it is invalid.
    validate: Callable[[str], Any]
    validator: str


def _demo_cases() -> list[_DemoCase]:
    import re

    import jsonschema
    import lark
    from pydantic import BaseModel, Field

    from constrain.compilers.specs import Lark, Regex

    class Person(BaseModel):
        name: str = Field(max_length=30)
        age: int = Field(ge=0, le=120)
        city: str = Field(max_length=20)

    def full_match(pattern: str) -> Callable[[str], Any]:
        def validate(text: str) -> None:
            if re.fullmatch(pattern, text) is None:
                raise ValueError(f"{text!r} does not match {pattern!r}")

        return validate

    return [
        _DemoCase(
            "Pydantic extraction: Person(name <= 30 chars, 0 <= age <= 120, city <= 20 chars)",
            "Text: Maria Garcia is 34 and lives in Lisbon.\nJSON: ",
            Person,
            _DEMO_PERSON_EXAMPLE,
            Person.model_validate_json,
            "pydantic",
        ),
        _DemoCase(
            "JSON Schema: an order (nested objects, an array of 1-3 items, enums, bounded integers)",
            "Order: Pierre Dubois from France bought 2 laptops and 1 charger. Status: shipped.\nJSON: ",
            DEMO_ORDER_SCHEMA,
            _DEMO_ORDER_EXAMPLE,
            lambda text: jsonschema.validate(json.loads(text), DEMO_ORDER_SCHEMA),
            "jsonschema",
        ),
        _DemoCase(
            f"Regex: an ISO date {_DEMO_DATE}",
            "The Berlin Wall fell on 9 November 1989 (1989-11-09). Apollo 11 landed on the Moon on 20 July 1969 (",
            Regex(_DEMO_DATE),
            "",
            full_match(_DEMO_DATE),
            "re.fullmatch",
        ),
        _DemoCase(
            f"Regex: a space, then an email address {_DEMO_EMAIL.lstrip()}",
            "Email addresses at Example Corp (example.com) are first.last: Jane Doe's is jane.doe@example.com and "
            "John Smith's is",
            Regex(_DEMO_EMAIL),
            "",
            full_match(_DEMO_EMAIL),
            "re.fullmatch",
        ),
        _DemoCase(
            "Lark grammar: an arithmetic expression (arithmetic.lark, ended by a newline)",
            "12 times 7 plus 3 is",
            Lark(DEMO_ARITHMETIC),
            "2 times 3 plus 1 is 2 * 3 + 1\n",
            lark.Lark(DEMO_ARITHMETIC).parse,
            "lark",
        ),
    ]


def demo(args: argparse.Namespace) -> int:
    """Generate one output per case with the embedded model, greedy; exit 1 if one is invalid."""
    from constrain.compilers.warmup import warmup
    from constrain.generation import LLM

    began = time.perf_counter()
    llm = LLM()
    loaded = time.perf_counter() - began
    print(
        f"Gemma 3 270M (base) and its vocabulary ({llm.vocab.size:,} tokens) loaded in {loaded:.1f} s, numba's "
        f"kernels and its walks in {warmup(llm.vocab):.1f} s; greedy decoding on the CPU\n"
    )
    failures = 0
    for number, case in enumerate(_demo_cases(), 1):
        print(f"{number}. {case.title}")
        print(f"   prompt : {case.prompt!r}" + (" (after a worked example)" if case.example else ""))
        compiled = time.perf_counter()
        llm.structure(case.output_type)
        compile_ms = 1e3 * (time.perf_counter() - compiled)
        try:
            completion = llm.complete(case.example + case.prompt, case.output_type, max_new_tokens=args.max_new_tokens)
        except (IncompleteOutputError, OutputValidationError) as exc:
            failures += 1
            print(f"   output : {exc.text!r}\n   INVALID: {_one_line(exc)}\n")
            continue
        try:
            case.validate(completion.text)
            verdict = f"valid ({case.validator})"
        except Exception as exc:  # whatever the validator raises: the output is invalid
            failures += 1
            verdict = f"INVALID ({case.validator}: {_one_line(exc)})"
        count = len(completion.tokens)
        print(f"   output : {completion.text!r}")
        if case.validator == "pydantic":
            print(f"   value  : {completion.value!r}")
        print(
            f"   {verdict}; {count} tokens in {completion.seconds:.1f} s ({count / completion.seconds:.1f} tokens/s), "
            f"compiled in {compile_ms:.0f} ms\n"
        )
    print("every output is valid" if not failures else f"{failures} output(s) INVALID")
    return NO if failures else OK


if __name__ == "__main__":
    sys.exit(main())
