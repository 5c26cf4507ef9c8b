"""The engine stand-in's model of vLLM 0.32's prefix cache (harness/engine_standin/standin.py, PrefixCache): hits
by chained block hashes, LRU eviction, the TTFT it adds and vLLM's counter names on /metrics. In-process, no
server: the stand-in's own HTTP is tested in tests/integration/test_engine_standin.py."""

from __future__ import annotations

import asyncio
import re

import pytest

from harness.engine_standin import standin
from harness.engine_standin.standin import PrefixCache

BLOCK = 16


def words(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def blocks(prefix: str, n: int) -> list[str]:
    """n full blocks and one token more (the last token is never a hit, so every full block can be)."""
    return [*words(prefix, n * BLOCK), "?"]


def test_a_shared_prefix_hits_by_whole_blocks_and_a_new_one_misses() -> None:
    cache = PrefixCache(capacity=100, block_size=BLOCK)
    system = words("s", 40)  # 2 full blocks and 8 tokens
    assert cache.admit(system + words("a", 10)) == 0  # cold
    assert cache.admit(system + words("b", 10)) == 32  # the two full system blocks; the third mixes in "a" words
    assert cache.admit(words("x", 50)) == 0  # control: another prompt finds nothing
    assert (cache.queries, cache.hits) == (50 + 50 + 50, 32)


def test_a_block_matches_only_after_the_same_prefix() -> None:
    cache = PrefixCache(capacity=100, block_size=BLOCK)
    shared = words("t", BLOCK)
    cache.admit(words("p", BLOCK) + shared + ["end"])
    # the same second block after another first one: a chained hash misses it (a per-block hash would hit)
    assert cache.admit(words("q", BLOCK) + shared + ["end"]) == 0
    assert cache.admit(words("p", BLOCK) + shared + ["end"]) == 2 * BLOCK


def test_the_last_token_is_never_a_hit() -> None:
    cache = PrefixCache(capacity=100, block_size=BLOCK)
    prompt = words("w", 2 * BLOCK)  # exactly two blocks
    cache.admit(prompt)
    assert cache.admit(prompt) == 2 * BLOCK - 1  # vLLM computes the last prompt token again


def test_the_least_recently_used_prompt_is_evicted_first() -> None:
    cache = PrefixCache(capacity=4, block_size=BLOCK)
    a, b, c = blocks("a", 2), blocks("b", 2), blocks("c", 2)
    cache.admit(a)
    cache.admit(b)
    assert cache.admit(a) == 2 * BLOCK  # a is now the most recent
    cache.admit(c)  # 6 blocks for 4: b's go
    assert cache.admit(a) == 2 * BLOCK
    assert cache.admit(b) == 0
    assert len(cache.blocks) == 4


def test_a_requests_tail_goes_before_its_head() -> None:
    cache = PrefixCache(capacity=3, block_size=BLOCK)
    long = blocks("l", 3)
    cache.admit(long)
    cache.admit(blocks("n", 1))  # one new block: the long prompt's last block goes, not its first
    assert cache.admit(long) == 2 * BLOCK


def test_reset_empties_it_and_bad_sizes_are_refused() -> None:
    cache = PrefixCache(capacity=10, block_size=BLOCK)
    prompt = words("r", 3 * BLOCK)
    cache.admit(prompt)
    cache.reset()
    assert cache.admit(prompt) == 0
    with pytest.raises(ValueError, match="--prefix-cache-blocks"):
        PrefixCache(capacity=0)


def test_chat_tokens_mark_each_role() -> None:
    request = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]}
    # the prompt ends with the generation prompt, the assistant's marker
    assert standin.prompt_words(True, request) == [
        "<|system|>", "be", "brief", "<|user|>", "hi", "there", "<|assistant|>"
    ]  # fmt: skip
    assert standin.prompt_words(False, {"prompt": "a b  c"}) == ["a", "b", "c"]


class Sink:
    """A StreamWriter's write side, kept in memory."""

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None


def serve(argv: list[str], requests: list[dict]) -> tuple[list[float], str]:
    """The stand-in's engine with ``argv``: each chat request answered (not streamed; 1 token unless it asks),
    its wall time; then /metrics."""
    engine = standin.Engine(standin.parse(["--ttft-ms", "1", "--itl-ms", "0", *argv]))
    times = []

    async def go() -> str:
        loop = asyncio.get_running_loop()
        for request in requests:
            started = loop.time()
            await engine.generate(Sink(), True, {"max_tokens": 1, **request}, True)
            times.append(loop.time() - started)
        sink = Sink()
        await engine.route(sink, "GET", "/metrics", {}, b"", True)
        return sink.data.decode()

    return times, asyncio.run(go())


def test_the_uncached_prefill_sets_the_ttft_and_vllms_counters_show_it() -> None:
    long = {"messages": [{"role": "system", "content": " ".join(words("s", 799))}]}  # 801 with the two markers
    times, metrics = serve(["--prefix-cache-blocks", "100", "--prefill-ms-per-token", "0.1"], [long, long])
    assert times[0] >= 0.080  # 801 uncached tokens at 0.1 ms
    assert times[1] < 0.030  # all but the last token cached
    queries = re.search(r'^vllm:prefix_cache_queries_total\{engine="0",model_name="tiny"\} (\d+)$', metrics, re.M)
    hits = re.search(r'^vllm:prefix_cache_hits_total\{engine="0",model_name="tiny"\} (\d+)$', metrics, re.M)
    assert queries and hits and (int(queries[1]), int(hits[1])) == (1602, 800)


def test_off_by_default_the_pace_is_the_base_ttft_alone_and_no_counters() -> None:
    long = {"messages": [{"role": "system", "content": " ".join(words("s", 799))}]}
    times, metrics = serve(["--prefill-ms-per-token", "0.1"], [long])
    assert times[0] < 0.030 and "prefix_cache" not in metrics


def test_bad_cache_flags_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        standin.parse(["--prefix-cache-blocks", "-1"])
    assert "--prefix-cache-blocks must be 0 (off) or more" in capsys.readouterr().err


def test_the_next_turn_finds_the_answer_cached() -> None:
    turn = {"messages": [{"role": "user", "content": " ".join(words("u", 40))}]}
    answer = {"role": "assistant", "content": " ".join(["tok"] * 40)}
    follow_up = {"messages": [*turn["messages"], answer, {"role": "user", "content": "and then?"}]}
    _, metrics = serve(["--prefix-cache-blocks", "100"], [{**turn, "max_tokens": 40}, follow_up])
    # the first prompt: 42 tokens (2 blocks); prompt + answer: 82 (5 blocks), all five found by the next turn
    hits = re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\d+)$", metrics, re.M)
    assert hits and int(hits[1]) == 80
