"""What tests/engines knows of each vLLM release that its engine cannot tell: data, one ``Known`` per release.

The request guard (roles/vllm_service/files/gpubox_vllm_guard.py) is checked inside each release's own app:
tests/unit/test_vllm_guard.py's IN_APP_PROBES go to every POST route the app registers (no data needed), and the
cases below go to the routes each release added, each a body that route's own request model takes. A release's
request models and the fields of the guard it lacks are data too: a renamed field would pass unguarded. A stack whose
release has no entry here fails test_the_guard_is_checked_against_every_stacks_release, naming this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from test_vllm_guard import (
    ANTHROPIC_TOOL,
    BOUND,
    CHAT_TOOL,
    DEPTH,
    HUGE_SCHEMA,
    NAMED,
    RESPONSES_TOOL,
    chat_tool,
    nested,
    schema_of,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 4, "messages": CHAT["messages"]}  # the Anthropic API's
HALF_SCHEMA = {"name": "s", "schema": schema_of(BOUND // 2)}
GUIDED_0_7_3 = frozenset(
    {"guided_json", "guided_regex", "guided_grammar", "guided_choice", "guided_whitespace_pattern"}
)
ONLY_0_32 = frozenset(
    {"structured_outputs", "prompt_embeds", "text", "output_config", "items", "questions", "sampling_params"}
)


@dataclass(frozen=True)
class Known:
    """``reached``: what a route whose request model took the body answers in the app without an engine (its handler
    ran). ``routes``: POST routes the app must register. ``cases``: name -> (route, body, the field the guard names,
    or None for a control it passes on). ``request_models``: "module:Class" of every request model the guard's
    fields reach. ``guard_fields_absent``: the fields the guard reads that this release's models lack (they are
    another release's). ``template_call``: "module:function" a request's chat_template_kwargs are unpacked into
    ("" where the release has none to check)."""

    reached: str
    routes: frozenset[str]
    cases: dict[str, tuple[str, dict[str, Any], str | None]]
    request_models: tuple[str, ...]
    guard_fields_absent: frozenset[str]
    template_call: str = ""


KNOWN: dict[str, Known] = {
    "0.7.3": Known(
        # Without an engine the handler fails with starlette's plain 500.
        reached="Internal Server Error",
        routes=frozenset({"/v1/embeddings", "/invocations"}),
        cases={
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
            "backend": ("/v1/chat/completions",
                        {**CHAT, "guided_regex": "a+", "guided_decoding_backend": "outlines"},
                        "guided_decoding_backend"),
            "completion_backend": ("/v1/completions", {"model": "m", "prompt": "x", "guided_regex": "a+",
                                   "guided_decoding_backend": "lm-format-enforcer"}, "guided_decoding_backend"),
            "backend_null": ("/v1/chat/completions",
                             {**CHAT, "guided_regex": "a+", "guided_decoding_backend": None}, None),
            # a schema nested deeper than 0.32.0 compiles: 0.7.3 has no bound of its own
            "deep_schema": ("/v1/chat/completions", {**CHAT, "guided_json": nested(DEPTH + 20)}, "guided_json"),
            "schema_at_depth": ("/v1/chat/completions", {**CHAT, "guided_json": nested(DEPTH)}, None),
        },
        request_models=(
            "vllm.entrypoints.openai.protocol:ChatCompletionRequest",
            "vllm.entrypoints.openai.protocol:CompletionRequest",
            "vllm.entrypoints.openai.protocol:TokenizeChatRequest",
        ),
        guard_fields_absent=ONLY_0_32,
        # chat_utils.apply_hf_chat_template, ending in transformers' apply_chat_template (CVE-2025-62426)
        template_call="vllm.entrypoints.chat_utils:apply_hf_chat_template",
    ),
    "0.32.0": Known(
        # Without an engine the handler fails missing its serving object.
        reached="'State' object has no attribute",
        routes=frozenset({"/v1/responses", "/v1/chat/completions/batch", "/v1/messages", "/generative_scoring"}),
        cases={
            # guided decoding through tools (tool_parsers/utils.py 449-488), 90 times the bound
            "tool_named": ("/v1/chat/completions", {**CHAT, "tools": [CHAT_TOOL], "tool_choice": NAMED}, "tools"),
            "tool_required": ("/v1/chat/completions",
                              {**CHAT, "tools": [CHAT_TOOL], "tool_choice": "required"}, "tools"),
            "tool_none": ("/v1/chat/completions", {**CHAT, "tools": [CHAT_TOOL], "tool_choice": "none"}, None),
            "responses_tool": ("/v1/responses", {"model": "m", "input": "hi", "tools": [RESPONSES_TOOL],
                               "tool_choice": {"type": "function", "name": "f"}}, "tools"),
            "anthropic_any": ("/v1/messages",
                              {**MESSAGES, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any"}}, "tools"),
            "anthropic_none": ("/v1/messages",
                               {**MESSAGES, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "none"}}, None),
            # 0.32.0's own guided fields
            "structured_outputs": ("/v1/chat/completions", {**CHAT, "structured_outputs": {"json": HUGE_SCHEMA}},
                                   "structured_outputs"),
            "structured_small": ("/v1/chat/completions", {**CHAT, "structured_outputs": {"regex": "a+"}}, None),
            "responses_format": ("/v1/responses", {"model": "m", "input": "hi", "text": {"format": {
                                 "type": "json_schema", "name": "s", "schema": HUGE_SCHEMA}}}, "text.format"),
            "responses_plain": ("/v1/responses",
                                {"model": "m", "input": "hi", "text": {"format": {"type": "text"}}}, None),
            "anthropic_format": ("/v1/messages", {**MESSAGES, "output_config": {"format": {
                                 "type": "json_schema", "schema": HUGE_SCHEMA}}}, "output_config.format"),
            # fan-out: prompts under 0.32.0's own 1024 (completion/protocol.py 612-643), token-id lists,
            # conversations, items
            "prompt_list": ("/v1/completions", {"model": "m", "prompt": ["x"] * 1000}, "prompt"),
            "token_prompts": ("/v1/completions", {"model": "m", "prompt": [[1, 2, 3]] * 9}, "prompt"),
            "prompts_times_n": ("/v1/completions", {"model": "m", "prompt": ["x", "y"], "n": 8}, "prompt"),
            "prompts_at_bound": ("/v1/completions", {"model": "m", "prompt": ["x"] * 8}, None),
            "one_token_prompt": ("/v1/completions", {"model": "m", "prompt": list(range(1000)), "n": 8}, None),
            "conversations": ("/v1/chat/completions/batch",
                              {"model": "m", "messages": [CHAT["messages"]] * 9}, "messages"),
            "conversations_at_bound": ("/v1/chat/completions/batch",
                                       {"model": "m", "messages": [CHAT["messages"]] * 8}, None),
            "scoring_items": ("/generative_scoring",
                              {"model": "m", "query": "q", "items": ["a"] * 9, "label_token_ids": [1]}, "items"),
            # nesting: 0.32.0 bounds a schema at 64 levels only when it compiles it, behind the route
            "deep_tool": ("/v1/chat/completions",
                          {**CHAT, "tools": [chat_tool("f", nested(DEPTH))], "tool_choice": NAMED}, "tools"),
            # the backend field the batch route still takes (chat_completion/protocol.py 1170)
            "batch_backend": ("/v1/chat/completions/batch", {"model": "m", "messages": [CHAT["messages"]],
                              "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
        },
        request_models=(
            "vllm.entrypoints.anthropic.protocol:AnthropicMessagesRequest",
            "vllm.entrypoints.generate.generative_scoring.serving:GenerativeScoringRequest",
            "vllm.entrypoints.generate.structured_decisions.protocol:StructuredDecisionRequest",
            "vllm.entrypoints.openai.chat_completion.protocol:BatchChatCompletionRequest",
            "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
            "vllm.entrypoints.openai.completion.protocol:CompletionRequest",
            "vllm.entrypoints.openai.responses.protocol:ResponsesRequest",
            "vllm.entrypoints.scale_out.token_in_token_out.protocol:GenerateRequest",
            "vllm.entrypoints.serve.tokenize.protocol:TokenizeChatRequest",
            "vllm.entrypoints.serve.tokenize.protocol:TokenizeCompletionRequest",
        ),
        # The guided_* fields are gone from 0.32.0 (entrypoints/serve/engine/protocol.py 25-34); the guard keeps
        # them for 0.7.3.
        guard_fields_absent=GUIDED_0_7_3,
    ),
}  # fmt: skip
