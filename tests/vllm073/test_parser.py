"""Prove rendered command lines are valid for the REAL vLLM 0.7.3, and that the pins install.

Installs roles/python_env/files/requirements-vllm-0.7.3.txt under constraints-vllm-0.7.3.txt into
a cached venv (default ~/.cache/gpubox/vllm073-venv; about 7 GB, minutes on first run), reusing it
while its versions match the pins (the role's own gpubox_pins.py decides). Then, in a subprocess of
that venv, vLLM's own parser (make_arg_parser(FlexibleArgumentParser())) parses the arguments the
vllm_service role renders for each production topology.

Run: /tmp/v/bin/pytest -m vllm073 tests/vllm073
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import venv
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import REQUEST_TEMPLATE_GUARD, vllm_args
from test_vllm_args import TOPOLOGIES, group_state
from test_vllm_guard import (
    BOUND,
    CHAT_TOOL,
    DEPTH,
    IN_APP_SCRIPT,
    NAMED,
    check_in_app,
    guard_fields,
    in_app_job,
    nested,
    schema_of,
)

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.vllm073

FILES = REPO / "roles" / "python_env" / "files"
REQUIREMENTS = FILES / "requirements-vllm-0.7.3.txt"
CONSTRAINTS = FILES / "constraints-vllm-0.7.3.txt"
VENV = Path(os.environ.get("GPUBOX_VLLM073_VENV", Path.home() / ".cache" / "gpubox" / "vllm073-venv"))


def _pins_report(python: Path) -> dict[str, Any]:
    out = subprocess.run(
        [str(python), str(FILES / "gpubox_pins.py"), "--requirements", str(REQUIREMENTS),
         "--constraints", str(CONSTRAINTS), "--lock", str(FILES / "constraints-vllm-0.7.3.hashes.txt")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = VENV / "bin" / "python"
    if python.exists() and _pins_report(python)["satisfied"]:
        return python
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    started = time.monotonic()
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet",
         "--requirement", str(REQUIREMENTS), "--constraint", str(CONSTRAINTS)],
        check=True,
    )  # fmt: skip
    print(f"vllm 0.7.3 stack installed in {time.monotonic() - started:.0f} s into {VENV}")
    report = _pins_report(python)
    if report["broken_scripts"]:  # the same repair as roles/python_env/tasks/packages.yml: by hash, from the lock
        repair = VENV / "repair-hashes.txt"
        repair.write_text(report["repair_lock"])
        assert not report["repair_unlocked"], report
        subprocess.run(
            [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet",
             "--force-reinstall", "--no-deps", "--require-hashes", "--requirement", str(repair)],
            check=True,
        )  # fmt: skip
        report = _pins_report(python)
    assert report["satisfied"], f"the pins did not install as written: {report}"
    return python


# Runs inside the vLLM venv: every case's argv (JSON on stdin) through a parser of its own, in one process
# (importing vLLM 0.7.3 costs some 10 s of CPU; a process per case paid it ten times). For each case: the
# exit status argparse gives it (0, or the SystemExit code), what it wrote to stderr, and the namespace.
PARSE_MANY = """
import contextlib, io, json, sys
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils import FlexibleArgumentParser
plain = (str, int, float, bool, list, type(None))
out = {}
for name, argv in json.load(sys.stdin).items():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        ns = {k: v for k, v in vars(ns).items() if isinstance(v, plain)}
        out[name] = {"rc": 0, "stderr": err.getvalue(), "parsed": ns}
    except SystemExit as exc:
        out[name] = {"rc": exc.code if isinstance(exc.code, int) else 1, "stderr": err.getvalue(), "parsed": None}
parser = make_arg_parser(FlexibleArgumentParser())
out["__choices__"] = {a.dest: list(a.choices) for a in parser._actions if a.choices is not None}
out["__options__"] = sorted(s for a in parser._actions for s in a.option_strings)
print(json.dumps(out))
"""

REFUSED_SPELLINGS = ["--api_key", "--api-ke", "--max_model_len", "-tp4", "-qawq", "--served-model"]
UNKNOWN_FLAG = "--no-such-flag-in-vllm-073"


def _cases() -> dict[str, list[str]]:
    """Every command line the parser tests below hand to vLLM 0.7.3's parser, by name."""
    # As the role renders them by default (vllm_service_allow_request_chat_template: false): with the guard.
    cases = {
        f"rendered:{group}": list(vllm_args(group_state(group), refuse_request_chat_template=True))
        for group in TOPOLOGIES
    }
    base = cases[f"rendered:{TOPOLOGIES[0]}"]
    cases["unknown"] = [*base, UNKNOWN_FLAG]
    for flag in REFUSED_SPELLINGS:
        value = [] if flag.startswith(("-tp", "-q")) else ["x" if "api" in flag or "served" in flag else "4096"]
        cases[f"spelling:{flag}"] = [*base, flag, *value]
    return cases


@pytest.fixture(scope="session")
def parser_runs(vllm_python: Path) -> dict[str, Any]:
    """Each case of _cases() as vLLM 0.7.3's parser read it, and the parser's choices (__choices__)."""
    cases = _cases()
    started = time.monotonic()
    out = subprocess.run(
        [str(vllm_python), "-c", PARSE_MANY], input=json.dumps(cases), capture_output=True, text=True, timeout=600
    )
    print(f"parser import + {len(cases)} parses took {time.monotonic() - started:.1f} s")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_installed_versions_match_the_pins(vllm_python: Path) -> None:
    versions = _pins_report(vllm_python)["versions"]
    assert versions["vllm"] == "0.7.3"
    assert versions["torch"] == "2.5.1"
    assert versions["xformers"] == "0.0.28.post3"
    assert versions["modelscope"] == "1.40.2"
    assert versions["modelscope-hub"] == "0.5.1"


def test_modelscope_cli_runs_beside_vllm(vllm_python: Path) -> None:
    # model_store runs this environment's `modelscope` CLI; its deps must load beside vLLM's pins.
    cli = vllm_python.parent / "modelscope"
    result = subprocess.run([str(cli), "download", "--help"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--revision" in result.stdout
    assert "LOCAL_DIR" in result.stdout


def test_transformers_sees_torch(vllm_python: Path) -> None:
    # Newer transformers silently disable PyTorch below 2.6; vLLM then cannot load any model.
    code = "import transformers.utils as u, sys; sys.exit(0 if u.is_torch_available() else 3)"
    result = subprocess.run([str(vllm_python), "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("group", TOPOLOGIES)
def test_real_parser_accepts_rendered_args(parser_runs: dict[str, Any], group: str) -> None:
    profile = group_state(group)
    result = parser_runs[f"rendered:{group}"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    parsed = result["parsed"]

    assert parsed["model"] == profile["gpubox_model_dir"]
    assert parsed["served_model_name"] == [profile["gpubox_served_model_name"]]
    assert parsed["host"] == "0.0.0.0"
    assert parsed["port"] == profile["gpubox_port"]
    assert parsed["tensor_parallel_size"] == profile["gpubox_tensor_parallel_size"]
    assert parsed["pipeline_parallel_size"] == profile["gpubox_pipeline_parallel_size"]
    assert parsed["gpu_memory_utilization"] == pytest.approx(profile["gpubox_gpu_memory_utilization"])
    assert parsed["max_model_len"] == profile["gpubox_max_model_len"]
    assert parsed["max_num_seqs"] == profile["gpubox_max_num_seqs"]
    assert parsed["max_num_batched_tokens"] == profile["gpubox_max_num_batched_tokens"]
    assert parsed["dtype"] == profile["gpubox_model_dtype"]
    assert parsed["quantization"] == profile["gpubox_model_quantization"]
    assert parsed["kv_cache_dtype"] == profile["gpubox_kv_cache_dtype"]
    assert parsed["enforce_eager"] is profile["gpubox_enforce_eager"]
    assert parsed["disable_log_requests"] is True
    assert parsed["api_key"] is None


def test_real_parser_rejects_an_unknown_flag(parser_runs: dict[str, Any]) -> None:
    result = parser_runs["unknown"]
    assert result["rc"] == 2, (result["rc"], result["stderr"][-2000:])
    assert UNKNOWN_FLAG in result["stderr"]


def test_desired_state_choices_are_vllm_073s(parser_runs: dict[str, Any]) -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks, vllm_words

    # the desired state, the catalog and the planner take these lists from vllm_words, not copies
    assert state_checks.QUANTIZATIONS is vllm_words.QUANTIZATIONS and state_checks.DTYPES is vllm_words.DTYPES

    choices = parser_runs["__choices__"]
    assert set(vllm_words.DTYPES) == set(choices["dtype"])
    assert set(vllm_words.KV_CACHE_DTYPES) == set(choices["kv_cache_dtype"])
    assert set(vllm_words.QUANTIZATIONS) | {None} >= set(choices["quantization"]) - {None}
    assert set(choices["quantization"]) - {None} == set(vllm_words.QUANTIZATIONS)
    assert set(vllm_words.BLOCK_SIZES) <= set(choices["block_size"])


def test_the_flags_refused_as_planner_blind_are_vllm_073s(parser_runs: dict[str, Any]) -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks

    options = set(parser_runs["__options__"])
    assert set(state_checks.PLANNER_BLIND_FLAGS) <= options, set(state_checks.PLANNER_BLIND_FLAGS) - options
    for flag in state_checks.PLANNER_BLIND_FLAGS:
        assert "which the planner does not model" in (state_checks.flag_problem(flag) or ""), flag


@pytest.mark.parametrize("flag", REFUSED_SPELLINGS)
def test_the_parser_reads_refused_spellings_as_rendered_flags(parser_runs: dict[str, Any], flag: str) -> None:
    """Every spelling state_checks refuses really is read by vLLM 0.7.3 as the key or a rendered flag."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks

    assert state_checks.flag_problem(flag) is not None
    result = parser_runs[f"spelling:{flag}"]
    if flag == "-tp4" and result["rc"] == 2:
        return  # vLLM 0.7.3 refuses it itself: refusing it before the box changes loses nothing
    assert result["rc"] == 0, result["stderr"][-2000:]
    parsed = result["parsed"]
    changed = {
        "--api_key": parsed["api_key"] == "x",
        "--api-ke": parsed["api_key"] == "x",
        "--max_model_len": parsed["max_model_len"] == 4096,
        "-tp4": parsed["tensor_parallel_size"] == 4,
        "-qawq": parsed["quantization"] == "awq",
        "--served-model": parsed["served_model_name"] == ["x"],
    }[flag]
    assert changed, parsed


# Runs inside the vLLM venv: vLLM 0.7.3's own OpenAI app on the pinned fastapi/starlette/python-multipart (moved off
# their advisories, see roles/python_env/files/advisories.yml), without an engine: the routes import and register, the
# API-key middleware guards /v1, and the /metrics mount answers.
APP = """
import json
from fastapi.testclient import TestClient
from vllm.entrypoints.openai.api_server import build_app
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils import FlexibleArgumentParser
app = build_app(make_arg_parser(FlexibleArgumentParser()).parse_args(["--api-key", "k"]))
client = TestClient(app, raise_server_exceptions=False)
print(json.dumps({
    "no_key": client.get("/v1/models").status_code,
    "wrong_key": client.get("/v1/models", headers={"Authorization": "Bearer x"}).status_code,
    "metrics": client.get("/metrics").status_code,
}))
"""


def test_vllm_app_runs_on_the_pinned_http_stack(vllm_python: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    out = subprocess.run([str(vllm_python), "-c", APP], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    codes = json.loads(out.stdout.strip().splitlines()[-1])
    assert codes == {"no_key": 401, "wrong_key": 401, "metrics": 200}, codes


# Runs inside the vLLM venv: vLLM 0.7.3's own app built from the command line the role renders, with the request
# guard (roles/vllm_service/files on PYTHONPATH, as the unit's PYTHONPATH does on the box) loaded by --middleware.
GUARDED_APP = """
import json, sys
from fastapi.testclient import TestClient
from vllm.entrypoints.openai.api_server import build_app
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--api-key", "k", *sys.argv[1:]])
client = TestClient(build_app(args), raise_server_exceptions=False)
key = {"Authorization": "Bearer k"}
chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
def post(body, headers=key):
    r = client.post("/v1/chat/completions", json=body, headers=headers)
    return {"status": r.status_code, "body": r.text}
def tokenize(body):
    r = client.post("/tokenize", json=body, headers=key)
    return {"status": r.status_code, "body": r.text}
big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}
print(json.dumps({
    "template": post({**chat, "chat_template": "{{ 1 }}"}),
    "kwargs": post({**chat, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}),
    "kwargs_tokenize": post({**chat, "chat_template_kwargs": {"tokenize": True}}),
    "mm_kwargs": post({**chat, "mm_processor_kwargs": {"code_revision": "x"}}),
    "n": post({**chat, "n": 1000000}),
    "best_of": client.post("/v1/completions", json={"model": "m", "prompt": "x", "best_of": 100}, headers=key).json(),
    "guided": post({**chat, "guided_json": big}),
    "response_format": post({**chat, "response_format": {"type": "json_schema", "json_schema": {"schema": big}}}),
    "tokenize_kwargs": tokenize({**chat, "chat_template_kwargs": {"tokenize": True}}),
    "no_messages": post({"model": "m"}),
    "no_key": post(chat, headers={}),
}))
"""


def test_vllm_app_loads_the_guard_and_refuses_a_request_template(vllm_python: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env["PYTHONPATH"] = str(REPO / "roles" / "vllm_service" / "files")
    argv = ["--middleware", REQUEST_TEMPLATE_GUARD]
    out = subprocess.run(
        [str(vllm_python), "-c", GUARDED_APP, *argv], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    for case, param in (
        ("template", "chat_template"),
        ("kwargs", "chat_template_kwargs.chat_template"),
        ("kwargs_tokenize", "chat_template_kwargs.tokenize"),  # CVE-2025-62426
        ("mm_kwargs", "mm_processor_kwargs.code_revision"),  # CVE-2026-114053
        ("n", "n"),  # CVE-2026-34756
        ("guided", "guided_json"),  # CVE-2025-32381
        ("response_format", "response_format"),
        ("tokenize_kwargs", "chat_template_kwargs.tokenize"),  # /tokenize takes the same kwargs
    ):
        assert got[case]["status"] == 400, got[case]
        assert json.loads(got[case]["body"])["error"]["param"] == param, got[case]
    assert got["best_of"]["error"]["param"] == "best_of", got["best_of"]
    # Any other body reaches vLLM whole: its own request model names the missing field (vLLM's 400, not the guard's).
    assert got["no_messages"]["status"] == 400 and "messages" in got["no_messages"]["body"], got["no_messages"]
    assert "request_chat_template" not in got["no_messages"]["body"]
    assert got["no_key"]["status"] == 401, got["no_key"]  # the key check still stands behind the guard


def test_jinja2_is_past_the_chat_template_sandbox_escape(vllm_python: Path) -> None:
    # vLLM 0.7.3 renders a request's chat_template in jinja2's sandbox; CVE-2025-27516 is fixed in 3.1.6.
    from packaging.version import Version

    assert Version(_pins_report(vllm_python)["versions"]["jinja2"]) >= Version("3.1.6")


# Runs inside the vLLM venv: an image through vLLM 0.7.3's own media loader (data URL -> PIL) and torchvision, on the
# pillow moved off CVE-2026-25990 (12.x; vLLM 0.7.3 was released against 11.x).
IMAGE = """
import json
import torchvision.transforms.functional as F
from PIL import Image
from vllm.multimodal.utils import MediaConnector, encode_image_base64
url = "data:image/jpeg;base64," + encode_image_base64(Image.new("RGB", (16, 8), (255, 0, 0)))
image = MediaConnector().fetch_image(url)
print(json.dumps({"size": list(image.size), "shape": list(F.to_tensor(F.resize(image, [4, 8])).shape)}))
"""


def test_vllm_media_loader_runs_on_the_pinned_pillow(vllm_python: Path) -> None:
    out = subprocess.run([str(vllm_python), "-c", IMAGE], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"size": [16, 8], "shape": [3, 4, 8]}


# Runs inside the vLLM venv: the parameters of the call vLLM 0.7.3 unpacks chat_template_kwargs into, and of the
# tokenizer method it ends in; the guard must never let a request set one of them (CVE-2025-62426). Also the request
# fields the guard bounds must be fields of vLLM 0.7.3's request models (a renamed field would pass unguarded).
SIGNATURES = """
import inspect, json
from transformers import PreTrainedTokenizerBase
from vllm.entrypoints import chat_utils
from vllm.entrypoints.openai import protocol
fields = set()
for model in (protocol.ChatCompletionRequest, protocol.CompletionRequest, protocol.TokenizeChatRequest):
    fields |= set(model.model_fields)
print(json.dumps({
    "vllm": sorted(inspect.signature(chat_utils.apply_hf_chat_template).parameters),
    "hf": sorted(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters),
    "fields": sorted(fields),
}))
"""


def test_the_guard_knows_the_template_call_and_the_request_fields(vllm_python: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpubox_vllm_guard", REPO / "roles/vllm_service/files/gpubox_vllm_guard.py"
    )
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    out = subprocess.run([str(vllm_python), "-c", SIGNATURES], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    named = {p for p in got["vllm"] + got["hf"] if p not in ("self", "kwargs")}
    assert named <= guard.TEMPLATE_CALL_PARAMETERS, named - guard.TEMPLATE_CALL_PARAMETERS
    # Every field the guard reads is one of 0.7.3's, but for those only 0.32.0 has (tests/vllm032 checks them there).
    assert guard_fields(guard) - set(got["fields"]) == ONLY_0_32, guard_fields(guard) - set(got["fields"])


ONLY_0_32 = {"structured_outputs", "prompt_embeds", "text", "output_config", "items", "questions", "sampling_params"}


# vLLM 0.7.3's OpenAI app (build_app, no engine) for tests/unit/test_vllm_guard.py's IN_APP_SCRIPT. Without an engine a
# route whose request model took the body fails in its handler with starlette's plain 500: "Internal Server Error".
BUILD_APP = """
from vllm.entrypoints.openai.api_server import build_app
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils import FlexibleArgumentParser
def build(argv):
    return build_app(make_arg_parser(FlexibleArgumentParser()).parse_args(argv))
"""
REACHED = "Internal Server Error"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
HALF_SCHEMA = {"name": "s", "schema": schema_of(BOUND // 2)}
# route, a body that route's own request model takes, and the field the guard names (None: a control it passes on)
CASES = {
    # guided decoding through a named tool's parameters (protocol.py 503-517), 90 times the bound
    "tool_named": ("/v1/chat/completions", {**CHAT, "tools": [CHAT_TOOL], "tool_choice": NAMED}, "tools"),
    "tool_named_invocations": ("/invocations", {**CHAT, "tools": [CHAT_TOOL], "tool_choice": NAMED}, "tools"),
    "tool_none": ("/v1/chat/completions", {**CHAT, "tools": [CHAT_TOOL], "tool_choice": "none"}, None),
    # two guided fields, each under the bound, one grammar over it
    "guided_split": (
        "/v1/chat/completions",
        {**CHAT, "guided_regex": "a" * (BOUND // 2 + 1),
         "response_format": {"type": "json_schema", "json_schema": HALF_SCHEMA}},
        "response_format",
    ),
    "guided_one": ("/v1/chat/completions", {**CHAT, "guided_regex": "a" * (BOUND // 2 + 1)}, None),
    # fan-out: prompts times n or best_of (serving_completion.py 118-152)
    "prompt_list": ("/v1/completions", {"model": "m", "prompt": ["x"] * 300_000}, "prompt"),
    "token_prompts": ("/v1/completions", {"model": "m", "prompt": [[1, 2, 3]] * 9}, "prompt"),
    "prompts_times_n": ("/v1/completions", {"model": "m", "prompt": ["x", "y"], "n": 8}, "prompt"),
    "prompts_best_of": ("/v1/completions", {"model": "m", "prompt": ["x", "y"], "best_of": 5}, "prompt"),
    "prompts_at_bound": ("/v1/completions", {"model": "m", "prompt": ["x"] * 8}, None),
    "one_token_prompt": ("/v1/completions", {"model": "m", "prompt": list(range(1000)), "n": 8}, None),
    # the backend (protocol.py 338 and 714)
    "backend": ("/v1/chat/completions", {**CHAT, "guided_regex": "a+", "guided_decoding_backend": "outlines"},
                "guided_decoding_backend"),
    "completion_backend": ("/v1/completions", {"model": "m", "prompt": "x", "guided_regex": "a+",
                           "guided_decoding_backend": "lm-format-enforcer"}, "guided_decoding_backend"),
    "backend_null": ("/v1/chat/completions", {**CHAT, "guided_regex": "a+", "guided_decoding_backend": None}, None),
    # a schema nested deeper than 0.32.0 compiles: 0.7.3 has no bound of its own
    "deep_schema": ("/v1/chat/completions", {**CHAT, "guided_json": nested(DEPTH + 20)}, "guided_json"),
    "schema_at_depth": ("/v1/chat/completions", {**CHAT, "guided_json": nested(DEPTH)}, None),
}  # fmt: skip


def test_the_guard_bounds_each_effect_on_every_route_of_vllm_073s_app(vllm_python: Path) -> None:
    """Every POST route of 0.7.3's app refuses each class of tests/unit/test_vllm_guard.py's EFFECT_PROBES, naming the
    field; each case above is taken by 0.7.3's own request model in the app without the guard (the control: it
    reaches the route's handler) and refused, or passed on, by the app with it."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env["PYTHONPATH"] = str(REPO / "roles" / "vllm_service" / "files")
    script = IN_APP_SCRIPT.format(build=BUILD_APP, guard=REQUEST_TEMPLATE_GUARD)
    out = subprocess.run(
        [str(vllm_python), "-c", script], input=in_app_job(CASES), capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "/v1/embeddings" in got["routes"] and "/invocations" in got["routes"], got["routes"]
    check_in_app(got, CASES, REACHED)
