"""What tests/engines runs inside a stack's engine venv: ``python in_engine.py COMMAND`` (JSON in on stdin where the
command reads any, one JSON line out on stdout).

It imports vLLM and the standard library only (never gpubox), and finds each part of vLLM where the release keeps it:
the newer module first (vLLM 0.32.0's ``vllm.entrypoints.launchers``), then the older one (0.7.3's
``vllm.entrypoints.openai``), so a release that keeps either layout needs nothing here. Commands:

- ``parse``: every case's argv (``{name: argv}``) through a parser of its own, in one process (importing vLLM costs
  some 10 s of CPU; a process per case paid it each time), then the release's own validation of the parsed
  arguments where it has one; for each case the exit status argparse gives it (0, or the SystemExit code), what it
  wrote to stderr and the namespace; then the parser's options and choices, the release's quantization registry
  and its version.
- ``keys``: the release's OpenAI app (no engine) with ``--api-key``: /v1/models without or with a wrong key, and
  /metrics.
- ``guarded``: the app built from ``--api-key k`` and argv, requests that carry a chat template, its kwargs and the
  other fields the request guard bounds, and the answers.
- ``fields``: the fields of the request models named on stdin (``["module:Class", ...]``).
- ``template_call``: the parameters of the function named on argv (``module:function``) that a request's
  chat_template_kwargs are unpacked into, and of transformers' apply_chat_template it ends in.
- ``image``: an image through the release's media loader (a data URL) and torchvision.

``build(argv)`` is also what tests/unit/test_vllm_guard.py's IN_APP_SCRIPT calls (``from in_engine import build``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys

PLAIN = (str, int, float, bool, list, type(None))


def parser_parts():
    """(the module with make_arg_parser, FlexibleArgumentParser) of this release."""
    try:
        from vllm.entrypoints.launchers import cli_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.entrypoints.openai import cli_args
        from vllm.utils import FlexibleArgumentParser
    return cli_args, FlexibleArgumentParser


def parse_args(argv: list[str]):
    cli_args, flexible = parser_parts()
    return cli_args.make_arg_parser(flexible()).parse_args(argv)


def build(argv: list[str]):
    """The release's OpenAI app (the generate task where the release asks for one), built from its parser on argv."""
    args = parse_args(argv)
    try:
        from vllm.entrypoints.launchers.app import build_app
    except ImportError:
        from vllm.entrypoints.openai.api_server import build_app

        return build_app(args)
    return build_app(args, ("generate",))


def _choice(value):
    return value if isinstance(value, PLAIN) else str(value)


def parse(cases: dict[str, list[str]]) -> dict:
    import vllm
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    cli_args, flexible = parser_parts()
    validate = getattr(cli_args, "validate_parsed_serve_args", None)
    out = {}
    for name, argv in cases.items():
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = cli_args.make_arg_parser(flexible()).parse_args(argv)
                if validate is not None:
                    validate(ns)
            parsed = {k: v for k, v in vars(ns).items() if isinstance(v, PLAIN)}
            out[name] = {"rc": 0, "stderr": err.getvalue(), "parsed": parsed}
        except SystemExit as exc:
            out[name] = {"rc": exc.code if isinstance(exc.code, int) else 1, "stderr": err.getvalue(), "parsed": None}
    parser = cli_args.make_arg_parser(flexible())
    out["__choices__"] = {a.dest: [_choice(c) for c in a.choices] for a in parser._actions if a.choices is not None}
    out["__options__"] = sorted(s for a in parser._actions for s in a.option_strings)
    out["__quantizations__"] = sorted(QUANTIZATION_METHODS)
    out["__version__"] = vllm.__version__
    return out


def keys() -> dict:
    from fastapi.testclient import TestClient

    client = TestClient(build(["--api-key", "k"]), raise_server_exceptions=False)
    return {
        "no_key": client.get("/v1/models").status_code,
        "wrong_key": client.get("/v1/models", headers={"Authorization": "Bearer x"}).status_code,
        "metrics": client.get("/metrics").status_code,
    }


def guarded(argv: list[str]) -> dict:
    from fastapi.testclient import TestClient

    client = TestClient(build(["--api-key", "k", *argv]), raise_server_exceptions=False)
    key = {"Authorization": "Bearer k"}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    def post(body, headers=key, path="/v1/chat/completions"):
        answer = client.post(path, json=body, headers=headers)
        return {"status": answer.status_code, "body": answer.text}

    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}
    return {
        "template": post({**chat, "chat_template": "{{ 1 }}"}),
        "kwargs": post({**chat, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}),
        "kwargs_tokenize": post({**chat, "chat_template_kwargs": {"tokenize": True}}),
        "mm_kwargs": post({**chat, "mm_processor_kwargs": {"code_revision": "x"}}),
        "n": post({**chat, "n": 1000000}),
        "best_of": post({"model": "m", "prompt": "x", "best_of": 100}, path="/v1/completions"),
        "guided": post({**chat, "guided_json": big}),
        "response_format": post({**chat, "response_format": {"type": "json_schema", "json_schema": {"schema": big}}}),
        "tokenize_kwargs": post({**chat, "chat_template_kwargs": {"tokenize": True}}, path="/tokenize"),
        "no_messages": post({"model": "m"}),
        "no_key": post(chat, headers={}),
    }


def _named(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def fields(models: list[str]) -> list[str]:
    return sorted({name for spec in models for name in _named(spec).model_fields})


def template_call(spec: str) -> dict:
    import inspect

    from transformers import PreTrainedTokenizerBase

    return {
        "vllm": sorted(inspect.signature(_named(spec)).parameters),
        "hf": sorted(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters),
    }


def image() -> dict:
    import torchvision.transforms.functional as F
    from PIL import Image
    from vllm.multimodal.utils import MediaConnector, encode_image_base64

    url = "data:image/jpeg;base64," + encode_image_base64(Image.new("RGB", (16, 8), (255, 0, 0)))
    loaded = MediaConnector().fetch_image(url)
    return {"size": list(loaded.size), "shape": list(F.to_tensor(F.resize(loaded, [4, 8])).shape)}


def main(argv: list[str]) -> None:
    command, rest = argv[0], argv[1:]
    if command == "parse":
        result = parse(json.load(sys.stdin))
    elif command == "keys":
        result = keys()
    elif command == "guarded":
        result = guarded(rest)
    elif command == "fields":
        result = fields(json.load(sys.stdin))
    elif command == "template_call":
        result = template_call(rest[0])
    elif command == "image":
        result = image()
    else:
        raise SystemExit(f"in_engine.py: unknown command {command!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
