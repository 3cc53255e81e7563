"""One `Engine.generate` call (framework/rollout.py): the prompt ring, the slot pool and the decode loop.

The engine owns what outlives a call (the model, its decoder, the slot cache, the policy version)
and builds the `Sample`s; a DecodeLoop holds everything of one call in preallocated tensors and
hands back per-sample result tensors (`run`). The rollout module's docstring says what the loop
does and why (points 1 to 4).
"""

from __future__ import annotations

import torch

from posttrain.framework.sampler import SamplingParams, draw_uniforms, sample_keys, sample_tokens
from posttrain.models.gpt_mini import KVCache
from posttrain.models.heads import lm_parts
from posttrain.sizing.memory import LOGIT_CHUNK_ELEMENTS

PREFILL_BATCH = 64  # prompts per prefill forward


class DecodeLoop:
    """One generate() call: the prompt ring, the slot pool and the decode loop."""

    def __init__(self, engine, prompts, n, sampling: SamplingParams, seed, step, group_offset, keep=None):
        model = engine.model
        self.model, self.prompts, self.n, self.sampling = model, prompts, n, sampling
        self.engine = engine
        self.decoder = engine.decoder()
        if self.decoder is not None:
            self.decoder.refresh()  # the weights as they are now
        self.seed, self.step, self.group_offset = seed, step, group_offset
        self.G, self.N = len(prompts), len(prompts) * n
        self.S = S = min(engine.max_slots, self.N)  # slots actually used
        self.M = M = sampling.max_new_tokens
        P = max(len(p) for p in prompts)
        p = next(model.parameters())
        dev, V = p.device, model.config.vocab_size
        self.dev, self.pad = dev, engine.tokenizer.pad_id
        stops = () if sampling.ignore_eos else tuple({engine.tokenizer.eot_id, *sampling.stop_ids})
        self.stop_ids = torch.tensor(stops, dtype=torch.long, device=dev)

        # prompt ring: group g's prompt cache lives in row g % C until its last sample is admitted.
        # Groups alive at once span at most S (one slot each) plus what is prefilled ahead.
        self.C = min(self.G, S + PREFILL_BATCH)
        self.pcache = KVCache(model.config, self.C, P, device=dev, dtype=engine.cache_dtype())
        self.plogits = torch.empty(self.C, V, device=dev)  # last-position logits per prompt
        self.pver = torch.zeros(self.C, dtype=torch.long, device=dev)  # ... and the version behind them
        self.plen = torch.tensor([len(q) for q in prompts], dtype=torch.long, device=dev)
        self.prefilled = 0  # groups [0, prefilled) are done

        # slot pool: per-slot state in tensors, rows [0, n_active) are the active slots
        self.cache = engine._slot_cache(S, P + M)
        self.logits = torch.empty(S, V, device=dev)  # next-token logits per slot
        self.tok_buf = torch.zeros(S, M, dtype=torch.long, device=dev)
        self.lp_buf = torch.zeros(S, M, device=dev)
        self.ver_buf = torch.zeros(S, M, dtype=torch.long, device=dev)  # version behind each token
        self.lver = torch.zeros(S, dtype=torch.long, device=dev)  # version behind each slot's logits
        self.t = torch.zeros(S, dtype=torch.long, device=dev)  # tokens generated so far
        self.u = torch.zeros(S, M, dtype=torch.float64, device=dev)  # the uniform of each draw of the slot's sample
        self.sid = torch.zeros(S, dtype=torch.long, device=dev)  # sample id = group * n + index
        self.last = torch.zeros(S, dtype=torch.long, device=dev)  # last token: next forward's input
        self.ar = torch.arange(S, device=dev)

        # results per sample, filled as sequences finish
        self.res_tok = torch.zeros(self.N, M, dtype=torch.long, device=dev)
        self.res_lp = torch.zeros(self.N, M, device=dev)
        self.res_ver = torch.zeros(self.N, M, dtype=torch.long, device=dev)
        self.res_len = torch.zeros(self.N, dtype=torch.long, device=dev)
        self.res_stop = torch.zeros(self.N, dtype=torch.bool, device=dev)
        # straggler cut-off: finished samples counted per group; a full group cancels the rest
        self.keep = n if keep is None else keep
        self.res_kept = torch.full((self.N,), self.keep == n, dtype=torch.bool, device=dev)
        self.group_count = [0] * self.G
        self.group_full = torch.zeros(self.G, dtype=torch.bool, device=dev)
        self.waiting = 0  # next sample id to admit
        self.prefill_tokens = self.prefills = self.decode_steps = 0
        self.active_sum = 0
        self.cache_used = torch.zeros((), dtype=torch.long, device=dev)

    def run(self):
        n = self._admit(0, self.S)
        while n:
            n = self._step(n)
        cap = self.cache.lengths.shape[0] * self.cache.max_len
        steps = max(self.decode_steps, 1)
        generated = int(self.res_len.sum())
        stats = {
            "rollout/samples": self.N,
            "rollout/generated_tokens": generated,
            "rollout/decode_steps": self.decode_steps,
            "rollout/slots": self.S,
            "rollout/slot_occupancy": self.active_sum / steps / self.S,  # mean active / slots
            "rollout/cache_occupancy": float(self.cache_used) / steps / cap,  # mean used / allocated positions
            "rollout/kv_positions": int(self.cache_used),  # Σ over decode steps of positions attended: the KV read
            "rollout/prefills": self.prefills,  # prompts prefilled (= groups)
            "rollout/prefill_tokens": self.prefill_tokens,  # prompt tokens computed
            "rollout/prompt_tokens": int(self.plen.sum()) * self.n,  # ... without sharing
            "rollout/prefix_reuse": int(self.plen.sum()) * self.n / max(self.prefill_tokens, 1),
            "rollout/cancelled": self.N - int(self.res_kept.sum()),  # straggler cut-off
        }
        return self.res_tok, self.res_lp, self.res_len, self.res_stop, self.res_kept, self.res_ver, stats

    def _step(self, n: int) -> int:
        """Sample one token for the n active slots, retire finished ones, decode, refill."""
        t, M = self.t[:n], self.M
        tok, lp = sample_tokens(self.logits[:n], self.sampling, None, self.u[self.ar[:n], t])  # [n]
        self.tok_buf[self.ar[:n], t] = tok
        self.lp_buf[self.ar[:n], t] = lp
        self.ver_buf[self.ar[:n], t] = self.lver[:n]
        t += 1
        self.last[:n] = tok
        is_stop = torch.isin(tok, self.stop_ids)  # [n]
        done = is_stop | (t >= M)
        if self.keep < self.n:  # its group already has `keep`: cancel
            done = done | self.group_full[self.sid[:n] // self.n]
        if bool(done.any()):
            n = self._retire(n, done, is_stop)
        if n:
            if self.engine.on_decode_step is not None:  # partial rollouts: newer weights may load
                self.engine.on_decode_step()  # here, between two tokens (KV cache kept)
                if self.decoder is not None:
                    self.decoder.refresh()
            self.lver[:n] = self.engine.policy_version
            # one forward, one token per active slot; rows [0, n) are a view of the cache
            if self.decoder is not None:  # gpt_mini's one-token path
                self.logits[:n] = self.decoder(self.last[:n], self.cache, n)
            else:
                self.cache.begin(1, slice(0, n))
                self.logits[:n] = self.model(self.last[:n, None], cache=self.cache)[:, 0]
            self.decode_steps += 1
            self.active_sum += n
            self.cache_used += self.cache.lengths[:n].sum()
        if self.waiting < self.N and n < self.S:  # refill freed slots
            n = self._admit(n, self.S - n)
        return n

    def _retire(self, n: int, done: torch.Tensor, is_stop: torch.Tensor) -> int:
        fin = done.nonzero().squeeze(1)  # [f] finished slots
        s = self.sid[fin]
        if self.keep < self.n:
            self._count_finished(s, (is_stop[fin] | (self.t[fin] >= self.M)).tolist())
        self.res_tok[s] = self.tok_buf[fin]
        self.res_lp[s] = self.lp_buf[fin]
        self.res_ver[s] = self.ver_buf[fin]
        self.res_len[s] = self.t[fin]
        self.res_stop[s] = is_stop[fin]
        # keep the active slots packed in [0, n'): move the last active rows into the holes
        n_new = n - fin.numel()
        holes = fin[fin < n_new]
        if holes.numel():
            movers = (~done[n_new:]).nonzero().squeeze(1) + n_new  # same count as holes
            self.cache.copy_row(movers, holes)
            for buf in (self.tok_buf, self.lp_buf, self.ver_buf, self.lver, self.t, self.u, self.sid, self.last):
                buf[holes] = buf[movers]
        return n_new

    def _count_finished(self, sids: torch.Tensor, natural: list[bool]) -> None:
        """Keep the first `keep` samples of a group to finish (ties by sample id); cancelled
        ones (natural = False) and late finishers are not kept."""
        for sid, ok in sorted(zip(sids.tolist(), natural)):
            g = sid // self.n
            if ok and self.group_count[g] < self.keep:
                self.group_count[g] += 1
                self.res_kept[sid] = True
                if self.group_count[g] == self.keep:
                    self.group_full[g] = True

    def _admit(self, lo: int, free: int) -> int:
        """Put the next waiting samples into slots [lo, lo + k); return the new active count."""
        k = min(free, self.N - self.waiting)
        if k <= 0:
            return lo
        sids = torch.arange(self.waiting, self.waiting + k, device=self.dev)
        self.waiting += k
        groups = sids // self.n
        last_group = int(groups[-1])
        if last_group >= self.prefilled:
            self._prefill(int(groups[0]), last_group)
        rows = groups % self.C
        slots = self.ar[lo : lo + k]
        self.cache.copy_row(rows, slots, source=self.pcache)  # the shared prompt, computed once
        self.logits[lo : lo + k] = self.plogits[rows]
        self.lver[lo : lo + k] = self.pver[rows]
        self.t[lo : lo + k] = 0
        self.sid[lo : lo + k] = sids
        if self.sampling.temperature > 0:  # greedy draws nothing
            base = sample_keys(self.seed, self.step, groups + self.group_offset, sids % self.n)
            self.u[lo : lo + k] = draw_uniforms(base, self.M)  # [k, M]: every draw, hashed once
        return lo + k

    def _prefill(self, head: int, need: int) -> None:
        """Prefill prompts [self.prefilled, …) through `need`, and ahead as far as the ring
        allows without overwriting group `head` (the oldest group still being admitted)."""
        end = min(self.G, head + self.C)
        assert need < end, "prompt ring too small"  # C >= S >= groups per admission
        while self.prefilled < end:
            a, b = self.prefilled, min(end, self.prefilled + PREFILL_BATCH)
            lens = self.plen[a:b]
            T = int(lens.max())
            ids = torch.full((b - a, T), self.pad, dtype=torch.long, device=self.dev)
            for i, q in enumerate(self.prompts[a:b]):  # right-padded; pads come after
                ids[i, : len(q)] = torch.tensor(q, dtype=torch.long)  # every real token, so causal
            rows = torch.arange(a, b, device=self.dev) % self.C  # attention never sees them
            self.pcache.reset_rows(rows)
            self.pcache.begin(T, rows)
            self.plogits[rows] = self._last_logits(ids, lens).float()  # [b-a, V]
            self.pcache.lengths[rows] = lens  # forget the pad positions
            self.pver[rows] = self.engine.policy_version
            self.prefill_tokens += int(lens.sum())
            self.prefills += b - a
            self.prefilled = b

    def _last_logits(self, ids: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Next-token logits [b, V] after each prompt: the head at the last real positions only when
        [b, T, V] would pass a logit chunk (framework/logprobs.py; 2.5 GB for 64 × 64 tokens at
        151,936) and the model allows it (lm_parts), else from the whole logits, as before."""
        last = torch.arange(ids.shape[0], device=self.dev), lens - 1
        parts = lm_parts(self.model)
        if parts is None or ids.numel() * self.model.config.vocab_size <= LOGIT_CHUNK_ELEMENTS:
            return self.model(ids, cache=self.pcache)[last]  # [b, T, V] → [b, V]
        trunk, head = parts
        return head(trunk.hidden(ids, cache=self.pcache)[last])  # [b, d] → [b, V]
