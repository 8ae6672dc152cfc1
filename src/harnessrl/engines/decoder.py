"""A batched decoder forward with a per-row KV cache, for Llama-family transformers models.

transformers' own caches give every row of a batch the same positions, which continuous batching
cannot use (each request is at its own position). This module re-implements the forward pass of
Llama-style decoders (``llama``, ``mistral``, ``qwen2``, ``qwen3``) on top of the *same parameter
tensors* as the transformers module, so loading, tying and ``load_state_dict`` keep working, with:

- a KV cache ``(rows, kv_heads, capacity, head_dim)`` per layer, grown as the rows need it
  (``ensure_capacity``) and released when idle. Rows ``0..n-1`` hold
  the decoding sequences, kept contiguous (a finished row is filled by moving the last one), so a
  decode step attends over a *view* ``cache[:n, :, :max_len]`` without gathering;
- fused QKV and gate/up projections: the transformers ``q_proj/k_proj/v_proj`` (and ``gate_proj``/
  ``up_proj``) weights are made views into one fused tensor, so one matmul replaces three and
  in-place weight updates through the transformers module land in the fused tensor;
- grouped-query attention without repeating K/V: the query heads that share a KV head are laid out
  as extra query rows of that KV head (``(B, kv_heads, groups*T, head_dim)``);
- sliding-window attention where transformers applies it (``mistral``'s ``sliding_window``; the
  ``qwen2``/``qwen3`` layers whose ``layer_types`` say ``sliding_attention``): a position there
  sees only the last ``sliding_window`` positions, as in the trainer's forward pass.

Numerics match transformers' forward to float tolerance (tests compare logprobs); differences come
from ``F.rms_norm`` and fused matmuls summing in another order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: The least a KV cache's positions grow by (``BatchedDecoder.ensure_capacity``).
LENGTH_STEP = 64
#: A KV cache's rows grow to the rows needed rounded up to a multiple of this.
ROW_STEP = 8


@dataclass
class _Layer:
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    gate_up_w: torch.Tensor
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    act: Any
    window: int | None  # sliding attention window (None: every earlier position)


def _sliding_window(cfg: Any, layer_index: int, context_length: int) -> int | None:
    """The attention window transformers gives layer ``layer_index``: ``mistral`` applies
    ``sliding_window`` to every layer, ``qwen2``/``qwen3`` to the layers ``layer_types`` marks
    ``sliding_attention``, ``llama`` to none. None when it cannot cut anything in the context."""
    window = getattr(cfg, "sliding_window", None)
    if not window or cfg.model_type == "llama":
        return None
    if cfg.model_type != "mistral":
        layer_types = getattr(cfg, "layer_types", None) or []
        if layer_index >= len(layer_types) or layer_types[layer_index] != "sliding_attention":
            return None
    return int(window) if int(window) < context_length else None


def _fuse(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of ``linears`` and make each module's tensors views into them."""
    with torch.no_grad():
        weight = torch.cat([lin.weight.data for lin in linears], dim=0).contiguous()
        has_bias = all(lin.bias is not None for lin in linears)
        bias = torch.cat([lin.bias.data for lin in linears], dim=0).contiguous() if has_bias else None
        start = 0
        for lin in linears:
            n = lin.weight.shape[0]
            lin.weight.data = weight[start : start + n]
            if bias is not None:
                lin.bias.data = bias[start : start + n]
            start += n
    return weight, bias


class BatchedDecoder:
    """Prefill and decode over a row-indexed KV cache, using a transformers causal LM's parameters."""

    def __init__(self, model: Any, *, max_rows: int, context_length: int, initial_capacity: int = 256):
        cfg = model.config
        if cfg.model_type not in SUPPORTED_MODEL_TYPES:
            raise NotImplementedError(f"model_type {cfg.model_type!r} (supported: {SUPPORTED_MODEL_TYPES})")
        self.model = model
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        self.lm_head = model.lm_head.weight
        self.eps = float(cfg.rms_norm_eps)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.groups = self.n_heads // self.n_kv
        self.q_size = self.n_heads * self.head_dim
        self.kv_size = self.n_kv * self.head_dim
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        self.layers: list[_Layer] = []
        for index, layer in enumerate(inner.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv_w, qkv_b = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up_w, gate_up_b = _fuse([mlp.gate_proj, mlp.up_proj])
            q_norm = getattr(attn, "q_norm", None)
            k_norm = getattr(attn, "k_norm", None)
            self.layers.append(
                _Layer(
                    qkv_w=qkv_w,
                    qkv_b=qkv_b,
                    o_w=attn.o_proj.weight,
                    o_b=attn.o_proj.bias,
                    gate_up_w=gate_up_w,
                    gate_up_b=gate_up_b,
                    down_w=mlp.down_proj.weight,
                    down_b=mlp.down_proj.bias,
                    in_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    q_norm=None if q_norm is None else q_norm.weight,
                    k_norm=None if k_norm is None else k_norm.weight,
                    act=mlp.act_fn,
                    window=_sliding_window(cfg, index, context_length),
                )
            )
        self.context_length = context_length
        self.max_rows = max_rows
        # RoPE table for every position, from the model's own rotary module (its inv_freq already
        # includes any rope scaling; attention_scaling is 1.0 for the default rope type).
        rotary = inner.rotary_emb
        inv_freq = rotary.inv_freq.to(torch.float32)
        positions = torch.arange(context_length, dtype=torch.float32, device=self.device)
        freqs = torch.outer(positions, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.cos = (emb.cos() * scaling).to(self.dtype)  # (P, head_dim)
        self.sin = (emb.sin() * scaling).to(self.dtype)
        self._initial_capacity = min(initial_capacity, context_length)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.rows_cap = 0
        self.len_cap = 0

    # --- cache management ----------------------------------------------------------------------------

    def ensure_capacity(self, rows: int, length: int) -> None:
        """Grow the cache so that ``rows`` rows of ``length`` positions fit: rows to a multiple of
        ``ROW_STEP``, positions by an eighth (at least ``LENGTH_STEP``), so a cache holds at most
        ``ROW_STEP - 1`` rows and ~12% (or 64 positions) more than its rows need. Every row is as
        long as the longest, so the slack is paid once per row: with 32 rows of SmolLM2 in fp32,
        256 spare positions were 0.38 GB. Growing copies the cache (~50 ms for 0.75 GB here, against
        a decode step of ~0.3-1.5 s at 32 rows on 2 cores), at most a few times per busy period: the
        cache is released when the engine is idle. Layer by layer: while it grows, one layer's old
        tensors are held beside the new ones, not the whole old cache."""
        if rows <= self.rows_cap and length <= self.len_cap:
            return
        new_rows = min(max(self.rows_cap, -(-rows // ROW_STEP) * ROW_STEP), self.max_rows)
        new_len = max(self.len_cap, self._initial_capacity)
        while new_len < length:
            new_len += max(LENGTH_STEP, new_len // 8)
        new_len = min(max(new_len, length), self.context_length)
        shape = (new_rows, self.n_kv, new_len, self.head_dim)
        if not self.k_cache:
            self.k_cache = [torch.empty(0)] * len(self.layers)
            self.v_cache = [torch.empty(0)] * len(self.layers)
        for cache in (self.k_cache, self.v_cache):
            for i, old in enumerate(cache):
                new = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if old.numel():  # keep what is cached
                    new[: self.rows_cap, :, : self.len_cap] = old
                cache[i] = new
                del old
        self.rows_cap, self.len_cap = new_rows, new_len

    def release(self) -> None:
        """Free the cache (when idle), so memory use follows the load."""
        self.k_cache, self.v_cache = [], []
        self.rows_cap = self.len_cap = 0

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of row ``src`` into row ``dst``."""
        for k, v in zip(self.k_cache, self.v_cache, strict=True):
            k[dst, :, :length] = k[src, :, :length]
            v[dst, :, :length] = v[src, :, :length]

    # --- forward -------------------------------------------------------------------------------------

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _project_qkv(
        self, layer: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, hidden) -> q (B, T, H, D), k and v (B, T, KV, D), with q/k norms and RoPE applied."""
        B, T, _ = h.shape
        qkv = F.linear(h, layer.qkv_w, layer.qkv_b)
        q = qkv[..., : self.q_size].view(B, T, self.n_heads, self.head_dim)
        k = qkv[..., self.q_size : self.q_size + self.kv_size].view(B, T, self.n_kv, self.head_dim)
        v = qkv[..., self.q_size + self.kv_size :].view(B, T, self.n_kv, self.head_dim)
        if layer.q_norm is not None:  # qwen3 normalizes each head before RoPE
            q = F.rms_norm(q, (self.head_dim,), layer.q_norm, self.eps)
            k = F.rms_norm(k, (self.head_dim,), layer.k_norm, self.eps)
        cos_ = cos[:, :, None, :]  # (B, T, 1, D)
        sin_ = sin[:, :, None, :]
        return self._rope(q, cos_, sin_), self._rope(k, cos_, sin_), v

    def _mlp_and_residual(self, layer: _Layer, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + F.linear(attn_out, layer.o_w, layer.o_b)
        h = F.rms_norm(x, (x.shape[-1],), layer.post_norm, self.eps)
        gate_up = F.linear(h, layer.gate_up_w, layer.gate_up_b)
        inter = gate_up.shape[-1] // 2
        return x + F.linear(
            layer.act(gate_up[..., :inter]) * gate_up[..., inter:], layer.down_w, layer.down_b
        )

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        x = F.rms_norm(x, (x.shape[-1],), self.final_norm, self.eps)
        return F.linear(x, self.lm_head).float()

    def prefill(self, row: int, token_ids: list[int], start: int) -> torch.Tensor:
        """Run ``token_ids`` at positions ``start..`` of ``row`` (its cache already holds ``start``
        positions); return the float32 logits of the last position, shape (V,)."""
        return self.prefill_packed([(row, token_ids, start)])[0]

    def prefill_packed(self, segments: list[tuple[int, list[int], int]]) -> torch.Tensor:
        """Prefill several ``(row, token_ids, start)`` segments in one pass -> last-position logits (S, V).

        The projections and MLPs run on all segments' tokens packed into one (1, sum T) sequence, so
        the matmuls are large enough to be efficient; only attention runs per segment.
        """
        ends = [start + len(ids) for _, ids, start in segments]
        self.ensure_capacity(max(row for row, _, _ in segments) + 1, max(ends))
        packed = [t for _, ids, _ in segments for t in ids]
        positions = torch.cat(
            [
                torch.arange(start, end, device=self.device)
                for (_, _, start), end in zip(segments, ends, strict=True)
            ]
        )
        ids = torch.tensor([packed], dtype=torch.long, device=self.device)
        x = F.embedding(ids, self.embed)  # (1, N, hidden)
        cos = self.cos[positions][None]  # (1, N, D)
        sin = self.sin[positions][None]
        offsets: list[int] = []
        masks: dict[int | None, list[torch.Tensor]] = {w: [] for w in {layer.window for layer in self.layers}}
        offset = 0
        for (_, seg_ids, start), end in zip(segments, ends, strict=True):
            offsets.append(offset)
            offset += len(seg_ids)
            # Query (g, t) may see keys 0..start+t (the last `window` of them in a sliding-window
            # layer); the mask is the same for every group g.
            q_pos = torch.arange(start, end, device=self.device)
            k_pos = torch.arange(end, device=self.device)
            for window, layer_masks in masks.items():
                mask_T_L = k_pos[None, :] <= q_pos[:, None]
                if window is not None:
                    mask_T_L &= k_pos[None, :] > q_pos[:, None] - window
                layer_masks.append(mask_T_L.repeat(self.groups, 1))  # (G*T, L)
        for i, layer in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), layer.in_norm, self.eps)
            q, k, v = self._project_qkv(layer, h, cos, sin)  # (1, N, heads, D)
            kc, vc = self.k_cache[i], self.v_cache[i]
            outs = []
            for (row, seg_ids, start), end, off, mask in zip(
                segments, ends, offsets, masks[layer.window], strict=True
            ):
                T = len(seg_ids)
                kc[row, :, start:end] = k[0, off : off + T].transpose(0, 1)
                vc[row, :, start:end] = v[0, off : off + T].transpose(0, 1)
                # (T, H, D) -> (1, KV, G*T, D): the heads sharing a KV head become its query rows.
                q_seg = q[0, off : off + T].view(T, self.n_kv, self.groups, self.head_dim).permute(1, 2, 0, 3)
                q_seg = q_seg.reshape(1, self.n_kv, self.groups * T, self.head_dim)
                out = F.scaled_dot_product_attention(
                    q_seg, kc[row : row + 1, :, :end], vc[row : row + 1, :, :end], mask
                )
                outs.append(out.view(self.n_kv, self.groups, T, self.head_dim).permute(2, 0, 1, 3))
            attn = torch.cat(outs, dim=0).reshape(1, offset, self.q_size)
            x = self._mlp_and_residual(layer, x, attn)
        last = torch.tensor(
            [off + len(seg_ids) - 1 for off, (_, seg_ids, _) in zip(offsets, segments, strict=True)],
            device=self.device,
        )
        return self._logits(x[0, last])

    def decode(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step for rows ``0..B-1``: ``token_ids`` (B,) at ``positions`` (B,) -> float32 logits (B, V)."""
        token_ids, positions = token_ids.to(self.device), positions.to(self.device)  # e.g. from the CPU
        B = token_ids.shape[0]
        max_len = int(positions.max()) + 1
        self.ensure_capacity(B, max_len)
        x = F.embedding(token_ids[:, None], self.embed)  # (B, 1, hidden)
        cos = self.cos[positions][:, None]  # (B, 1, D)
        sin = self.sin[positions][:, None]
        k_pos = torch.arange(max_len, device=self.device)
        masks: dict[int | None, torch.Tensor] = {}
        for window in {layer.window for layer in self.layers}:
            mask_B_L = k_pos[None, :] <= positions[:, None]
            if window is not None:
                mask_B_L &= k_pos[None, :] > positions[:, None] - window
            masks[window] = mask_B_L[:, None, None, :]
        rows = torch.arange(B, device=self.device)
        for i, layer in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), layer.in_norm, self.eps)
            q, k, v = self._project_qkv(layer, h, cos, sin)
            kc, vc = self.k_cache[i], self.v_cache[i]
            kc[rows, :, positions] = k[:, 0]  # (B, KV, D) into each row's own position
            vc[rows, :, positions] = v[:, 0]
            q = q.view(B, self.n_kv, self.groups, self.head_dim)  # (B, KV, G, D): one query per head
            mask = masks[layer.window]
            out = F.scaled_dot_product_attention(q, kc[:B, :, :max_len], vc[:B, :, :max_len], mask)
            x = self._mlp_and_residual(layer, x, out.reshape(B, 1, self.q_size))
        return self._logits(x[:, 0])
