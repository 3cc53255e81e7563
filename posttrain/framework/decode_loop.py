"""One `Engine.generate` call (framework/rollout.py): the prompt ring, the slot pool and the decode loop.

The engine owns what outlives a call (the model, its decoder, the slot cache, the policy version)
and builds the `Sample`s; a DecodeLoop holds everything of one call in preallocated tensors and
hands back per-sample result tensors (`run`). The rollout module's docstring says what the loop
does and why (points 1 to 4).
"""

from __future__ import annotations

import torch

from posttrain.framework.decode_graphs import SPAN_BUCKET
from posttrain.framework.sampler import SamplingParams, draw_uniforms, sample_keys, sample_tokens, stop_ids
from posttrain.models.decode import tensor_key
from posttrain.models.gpt_mini import KVCache
from posttrain.models.heads import LOGIT_CHUNK_ELEMENTS, lm_parts

PREFILL_BATCH = 64  # prompts per prefill forward, at most
PREFILL_CHUNK = 16384  # padded prompt tokens per prefill forward (rollout.prefill_chunk): 64 prompts of 256


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
        stops = () if sampling.ignore_eos else stop_ids(engine.tokenizer, sampling.stop_ids)

        # prompt ring: group g's prompt cache lives in row g % C until its last sample is admitted.
        # Groups alive at once span at most S (one slot each) plus what is prefilled ahead.
        self.C = min(self.G, S + PREFILL_BATCH)
        self.pcache = KVCache(model.config, self.C, P, device=dev, dtype=engine.cache_dtype())
        self.plogits = torch.empty(self.C, V, device=dev)  # last-position logits per prompt
        self.pver = torch.zeros(self.C, dtype=torch.long, device=dev)  # ... and the version behind them
        self.plen = torch.tensor([len(q) for q in prompts], dtype=torch.long, device=dev)
        self.prefilled = 0  # groups [0, prefilled) are done

        # slot pool: per-slot state in tensors kept by the engine across calls (decode_state.py),
        # rows [0, n_active) are the active slots
        cut_off = keep is not None and keep < n
        # k decode steps between two read-backs (admission, retirement). Read back every step where
        # the host acts on a step's outcome: the straggler cut-off keeps the first `keep` to finish
        # (an order a window would blur), partial rollouts load weights between two given tokens
        self.k = 1 if cut_off or engine.on_decode_step is not None else engine.window(dev)
        self.bucket = engine.row_bucket(dev)
        capture = dev.type == "cuda" and engine.capture_decode and self.decoder is not None and self.k > 1
        self.span_bucket = engine.decode_span_bucket or (SPAN_BUCKET if capture else 1)
        # captured: the cache's length rounds up to the span bucket, so a longer prompt rarely reallocates it
        length = -(-(P + M) // SPAN_BUCKET) * SPAN_BUCKET if capture else P + M
        self.cache = engine._slot_cache(S, length)
        st = self.state = engine.slot_state(S, M, V, dev)
        st.reset(stops, engine.policy_version)
        self.stop_ids, self.version = st.stop_ids, st.version
        self.logits, self.tok_buf, self.lp_buf, self.ver_buf = st.logits, st.tok_buf, st.lp_buf, st.ver_buf
        self.lver, self.t, self.u, self.sid, self.last, self.live = st.lver, st.t, st.u, st.sid, st.last, st.live
        self.ar, self.slot_state = st.ar, st.slot_buffers()
        self.decode_step, self.graphs = self._step_eager, None
        if capture:
            self.decode_step = self.graphs = st.step_graphs(self._step_eager, self._graph_key(sampling))
        self.replays0: int = self.graphs.replays if self.graphs else 0  # earlier calls' replays, captures
        self.captures0: int = self.graphs.captures if self.graphs else 0

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
        self.rows_forwarded = 0  # Σ rows computed by the decode forwards (live or not)
        self.admitted_top = 0  # the longest prompt of the last admission (host side)

    def run(self):
        n = self._admit(0, self.S)
        top = self.admitted_top  # bounds every live row's position (host side)
        while n:
            n, top = self._window(n, top)
        cap = self.cache.lengths.shape[0] * self.cache.max_len
        steps = max(self.decode_steps, 1)
        generated = int(self.res_len.sum())
        # a sample of L tokens was fed L - 1 times (its last token never is), at positions P + 1 … P + L - 1
        L, P = self.res_len, self.plen.repeat_interleave(self.n)  # [N] each
        fed, kv = int(L.sum()) - self.N, int(((L - 1) * P + L * (L - 1) // 2).sum())
        stats = {
            "rollout/samples": self.N,
            "rollout/generated_tokens": generated,
            "rollout/decode_steps": self.decode_steps,
            "rollout/slots": self.S,
            "rollout/slot_occupancy": fed / steps / self.S,  # mean active / slots
            "rollout/row_use": fed / max(self.rows_forwarded, 1),  # live ÷ forwarded rows (window, bucket)
            "rollout/cache_occupancy": kv / steps / cap,  # mean used / allocated positions
            "rollout/kv_positions": kv,  # Σ over decode steps of positions attended by live rows: the KV read
            "rollout/prefills": self.prefills,  # prompts prefilled (= groups)
            "rollout/prefill_tokens": self.prefill_tokens,  # prompt tokens computed
            "rollout/prompt_tokens": int(self.plen.sum()) * self.n,  # ... without sharing
            "rollout/prefix_reuse": int(self.plen.sum()) * self.n / max(self.prefill_tokens, 1),
            "rollout/cancelled": self.N - int(self.res_kept.sum()),  # straggler cut-off
            # steps served by a CUDA graph, and the graphs this call captured (0 once a run is steady)
            "rollout/graph_replays": self.graphs.replays - self.replays0 if self.graphs else 0,
            "rollout/graph_captures": self.graphs.captures - self.captures0 if self.graphs else 0,
        }
        return self.res_tok, self.res_lp, self.res_len, self.res_stop, self.res_kept, self.res_ver, stats

    def _graph_key(self, sampling: SamplingParams) -> tuple:
        """What a captured step reads besides the slot state (decode_state.py): while it is unchanged,
        the graphs of earlier calls replay here."""
        c = self.cache
        amp = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        return (
            (sampling.temperature, sampling.top_k, sampling.top_p),
            amp,
            tensor_key((c.k, c.v, c.lengths)),
            self.decoder.addresses(),  # type: ignore[union-attr]
        )

    def _window(self, n: int, top: int) -> tuple[int, int]:
        """Up to k decode steps over the rows [0, R) of n sequences without reading anything back
        from the device, then retire the finished ones, decode the rest, refill. `top` bounds every
        row's position (rows advance by at most one a step), so each forward's span is known on
        the host. A row that finishes inside the window is frozen (`live` False: its tokens are
        not recorded, its position does not advance) until the window ends."""
        R = self._rows(n)
        self._sample(R)
        for _ in range(self.k - 1):  # in-window steps: decode every row in [0, R), then sample
            self._count(R)
            self.decode_step(R, self._span(top + 1))
            top += 1
        n = self._retire(n)  # the one read-back of the window
        if n:
            R = self._rows(n)
            span = int(self.cache.lengths[:R].max()) + 1
            self._count(R)
            self._forward(R, span)
            top = span
        if self.waiting < self.N and n < self.S:  # refill freed slots
            n = self._admit(n, self.S - n)
            top = max(top, self.admitted_top)
        return n, top

    def _span(self, need: int) -> int:
        """Positions an in-window forward attends: `need` rounded up to the span bucket (CUDA graphs)."""
        return min(-(-need // self.span_bucket) * self.span_bucket, self.cache.max_len)

    def _rows(self, n: int) -> int:
        """Rows a step computes for n sequences: n rounded up to the slot-count bucket (static shapes)."""
        b = self.bucket
        return min(self.S, -(-n // b) * b)

    def _sample(self, R: int) -> None:
        """Sample one token for rows [0, R) and record it (a frozen row's lands past its length); a
        live row that stops, reaches the cap or (straggler cut-off) whose group is full stops being live."""
        ar, live, t, M = self.ar[:R], self.live[:R], self.t[:R], self.M
        tok, lp = sample_tokens(self.logits[:R], self.sampling, None, self.u[ar, t])  # [R]
        self.tok_buf[ar, t] = tok  # a frozen row writes past its length (or into column M): never read
        self.lp_buf[ar, t] = lp
        self.ver_buf[ar, t] = self.lver[:R]
        t += live
        self.last[:R] = tok
        is_stop = (tok[:, None] == self.stop_ids).any(-1)  # [R] (isin may read back; this never)
        done = is_stop | (t >= M)
        if self.keep < self.n:  # its group already has `keep`: cancel
            done = done | self.group_full[self.sid[:R] // self.n]
        live &= ~done

    def _count(self, R: int) -> None:
        """The host side of a decode forward over R rows, before it: partial rollouts may load
        newer weights here, between two tokens (KV cache kept); the step counters."""
        if self.engine.on_decode_step is not None:
            self.engine.on_decode_step()
            self.version.fill_(self.engine.policy_version)
            if self.decoder is not None:
                self.decoder.refresh()
        self.decode_steps += 1
        self.rows_forwarded += R

    def _step_eager(self, R: int, span: int) -> None:
        """An in-window step, device work only (what decode_graphs captures): decode, then sample."""
        self._forward(R, span)
        self._sample(R)

    def _forward(self, R: int, span: int) -> None:
        """One decode forward of one token per row in [0, R), attending over `span` positions
        (at least the longest live row's); rows [0, R) are a view of the cache."""
        live = self.live[:R]
        self.lver[:R] = self.version  # a device scalar: a graph replays the version of the call, not of its capture
        if self.decoder is not None:  # the one-token path: positions of frozen rows stay
            self.logits[:R] = self.decoder(self.last[:R], self.cache, R, span, live)
        else:
            self.cache.begin(1, slice(0, R))
            self.logits[:R] = self.model(self.last[:R, None], cache=self.cache)[:, 0]
            self.cache.lengths[:R] -= (~live).long()  # frozen rows stay where they are

    def _retire(self, n: int) -> int:
        """Move the finished sequences among rows [0, n) to the results; return the new count."""
        done = ~self.live[:n]
        fin = done.nonzero().squeeze(1)  # [f] finished slots: the one read-back of a window
        if not fin.numel():
            return n
        s, t = self.sid[fin], self.t[fin]
        is_stop = (self.tok_buf[fin, t - 1, None] == self.stop_ids).any(-1)  # [f] its last token
        if self.keep < self.n:
            self._count_finished(s, (is_stop | (t >= self.M)).tolist())
        self.res_tok[s] = self.tok_buf[fin, : self.M]
        self.res_lp[s] = self.lp_buf[fin, : self.M]
        self.res_ver[s] = self.ver_buf[fin, : self.M]
        self.res_len[s] = t
        self.res_stop[s] = is_stop
        # keep the active slots packed in [0, n'): move the last active rows into the holes
        n_new = n - fin.numel()
        holes = fin[fin < n_new]
        if holes.numel():
            movers = (~done[n_new:]).nonzero().squeeze(1) + n_new  # same count as holes
            self.cache.copy_row(movers, holes)
            for buf in self.slot_state:
                buf[holes] = buf[movers]
        self.live[n_new:n] = False  # the movers' old rows
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
        self.live[lo : lo + k] = True
        first, last = (self.waiting - k) // self.n, (self.waiting - 1) // self.n
        self.admitted_top = max(len(q) for q in self.prompts[first : last + 1])
        if self.sampling.temperature > 0:  # greedy draws nothing
            base = sample_keys(self.seed, self.step, groups + self.group_offset, sids % self.n)
            self.u[lo : lo + k, : self.M] = draw_uniforms(base, self.M)  # [k, M]: every draw, hashed once
        return lo + k

    def _prefill(self, head: int, need: int) -> None:
        """Prefill prompts [self.prefilled, …) through `need`, and ahead as far as the ring
        allows without overwriting group `head` (the oldest group still being admitted). A forward
        takes up to PREFILL_BATCH prompts whose padded tokens fit the engine's `prefill_chunk`;
        a prompt longer than that goes alone, in chunks of that many tokens through its cache."""
        end = min(self.G, head + self.C)
        assert need < end, "prompt ring too small"  # C >= S >= groups per admission
        budget = self.engine.prefill_chunk
        while self.prefilled < end:
            a = b = self.prefilled
            T = 0  # the forward's width: its longest prompt (host-side lengths, no read-back)
            while b < min(end, a + PREFILL_BATCH) and (b == a or max(T, len(self.prompts[b])) * (b + 1 - a) <= budget):
                T, b = max(T, len(self.prompts[b])), b + 1
            lens = self.plen[a:b]
            ids = torch.full((b - a, T), self.pad, dtype=torch.long, device=self.dev)
            for i, q in enumerate(self.prompts[a:b]):  # right-padded; pads come after
                ids[i, : len(q)] = torch.tensor(q, dtype=torch.long)  # every real token, so causal
            rows = torch.arange(a, b, device=self.dev) % self.C  # attention never sees them
            self.pcache.reset_rows(rows)
            for lo in range(0, T - budget, budget):  # a prompt longer than the budget: its head, chunk by chunk
                self.pcache.begin(budget, rows)
                self._fill(ids[:, lo : lo + budget])
            lo = max(0, (T - 1) // budget * budget)  # the last chunk (the whole prompt when it fits)
            self.pcache.begin(T - lo, rows)
            self.plogits[rows] = self._last_logits(ids[:, lo:], lens - lo).float()  # [b-a, V]
            self.pcache.lengths[rows] = lens  # forget the pad positions
            self.pver[rows] = self.engine.policy_version
            self.prefill_tokens += sum(len(q) for q in self.prompts[a:b])
            self.prefills += b - a
            self.prefilled = b

    def _fill(self, ids: torch.Tensor) -> None:
        """A forward that only writes the prompt's keys and values (a chunk before the last)."""
        parts = lm_parts(self.model)
        if parts is None:
            self.model(ids, cache=self.pcache)
        else:
            parts[0].hidden(ids, cache=self.pcache)

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
