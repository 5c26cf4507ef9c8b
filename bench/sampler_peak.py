#!/usr/bin/env python3
"""Measure the live set of vLLM 0.7.3's V0 sampler during the profiling pass, on a real GPU.

Replays, with plain torch calls, the tensor operations that vLLM 0.7.3's Sampler.forward runs on the
driver rank for the profiling pass's dummy batch (one sampled token per sequence; top_k = vocab - 1,
top_p = 0.99, temperature 1, no penalties; see capacity_planner's docstring for the code path), and
prints the peak of torch's allocated bytes per (sequence x vocab entry), counting the bf16 logits the
caller holds. Needs torch with CUDA; not part of the unit tests.

    python3 bench/sampler_peak.py
"""

from __future__ import annotations

import torch


def sampler_pass(logits: torch.Tensor) -> torch.Tensor:
    seqs, vocab = logits.shape
    dev = logits.device
    temperatures = torch.ones(seqs, device=dev)
    top_p = torch.full((seqs,), 0.99, device=dev)
    top_k = torch.full((seqs,), vocab - 1, device=dev, dtype=torch.int)
    work = logits.to(torch.float)
    work.div_(temperatures.unsqueeze(1))
    # top-k / top-p over the sorted row
    ordered, order = work.sort(dim=-1, descending=False)
    cut = ordered.gather(1, (ordered.size(1) - top_k.to(torch.long)).unsqueeze(1))
    below_k = ordered < cut
    ordered.masked_fill_(below_k, -float("inf"))
    sorted_probs = ordered.softmax(dim=-1)
    cumulative = sorted_probs.cumsum(dim=-1)
    below_p = cumulative <= 1 - top_p.unsqueeze(1)
    below_p[:, -1] = False
    ordered.masked_fill_(below_p, -float("inf"))
    restored = torch.empty_like(ordered).scatter_(dim=-1, index=order, src=ordered)
    del ordered, order, cut, below_k, sorted_probs, cumulative, below_p, work
    probs = torch.softmax(restored, dim=-1, dtype=torch.float)
    logprobs = torch.log_softmax(restored, dim=-1, dtype=torch.float)
    rows = torch.arange(seqs, device=dev)
    picked = probs[rows]
    noise = torch.empty_like(picked).exponential_()
    return picked.div_(noise).argmax(dim=1) + logprobs[:, 0].long() * 0


def measure(seqs: int, vocab: int) -> float:
    torch.cuda.empty_cache()
    logits = torch.randn(seqs, vocab, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    sampler_pass(logits)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before + logits.numel() * logits.element_size()
    return peak / (seqs * vocab)


def sort_only(seqs: int, vocab: int) -> float:
    torch.cuda.empty_cache()
    work = torch.randn(seqs, vocab, device="cuda", dtype=torch.float)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = work.sort(dim=-1, descending=False)
    torch.cuda.synchronize()
    del result
    return (torch.cuda.max_memory_allocated() - before) / (seqs * vocab)


if __name__ == "__main__":
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print("seqs vocab bytes_per_elem(sampler, incl. bf16 logits) bytes_per_elem(sort alone: values+indices+temps)")
    for seqs in (1, 8, 64, 127, 128, 256, 512):
        for vocab in (32000, 128256, 151936, 152064):
            print(seqs, vocab, f"{measure(seqs, vocab):.2f}", f"{sort_only(seqs, vocab):.2f}")
