"""Command line: ``constrain demo`` generates structured output with the embedded Gemma 3 270M model."""

from __future__ import annotations

import argparse
import re
import sys
import time

DEMO_CASES = [
    ("The first crewed Moon landing happened on (YYYY-MM-DD): ", r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"),
    ("Contact email for John Smith at Example Corp: ", r"[a-z][a-z0-9._]{0,20}@[a-z0-9-]{1,20}\.(com|org|net)"),
    ("Review: 'The battery died after two days.' Sentiment: ", r"(positive|negative|neutral)"),
    ("The three primary colours, as a comma-separated list: ", r"[A-Za-z]{3,10}(, [A-Za-z]{3,10}){2}"),
    ("Temperature reading of the sensor in °C: ", r"-?\d{1,2}\.\d °C"),
]


def demo(args: argparse.Namespace) -> int:
    from transformers import LogitsProcessorList

    from constrain.compilers.api import compile as compile_structure
    from constrain.integrations.transformers import StructureLogitsProcessor
    from constrain.models.gemma import default_eos_ids, load_default_model
    from constrain.vocab.vocabulary import Vocabulary

    t0 = time.perf_counter()
    model, tokenizer = load_default_model()
    vocab = Vocabulary.from_tokenizer(tokenizer)
    print(f"loaded Gemma 3 270M and its vocabulary ({vocab.size:,} tokens) in {time.perf_counter() - t0:.1f} s\n")
    eos = default_eos_ids(tokenizer)
    failures = 0
    for prompt, pattern in DEMO_CASES:
        t = time.perf_counter()
        structure = compile_structure(pattern, vocab)
        compile_ms = 1e3 * (time.perf_counter() - t)
        inputs = tokenizer(prompt, return_tensors="pt")
        t = time.perf_counter()
        out = model.generate(
            **inputs,
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([StructureLogitsProcessor(structure)]),
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id,
        )
        seconds = time.perf_counter() - t
        new_tokens = [t for t in out[0, inputs["input_ids"].shape[1] :].tolist() if t not in eos]
        text = tokenizer.decode(new_tokens)
        valid = re.fullmatch(pattern, text) is not None
        failures += not valid
        print(f"prompt : {prompt}")
        print(f"regex  : {pattern}   (compiled in {compile_ms:.1f} ms)")
        print(
            f"output : {text!r}   {'matches' if valid else 'DOES NOT MATCH'}, "
            f"{len(new_tokens)} tokens in {seconds:.1f} s\n"
        )
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="constrain", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo_parser = commands.add_parser("demo", help="constrained generation with the embedded Gemma 3 270M model")
    demo_parser.add_argument("--max-new-tokens", type=int, default=32)
    demo_parser.set_defaults(run=demo)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
