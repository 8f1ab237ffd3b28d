"""Context: the KV cache and decode calls of one model (one or more sequences)."""
from __future__ import annotations

import functools
import logging
import os
import threading

import numpy as np

from ._ffi import PowerInferError, check, ffi, lib
from .cli_args import KV_TYPES
from .encoder import is_encoder
from .lora import set_context_adapters
from .model import Model

_KV_TYPE_IDS = {name: getattr(lib, "PI_TYPE_" + name.upper()) for name in KV_TYPES}
THRESHOLD_ENV = "LLAMA_SPARSE_PRED_THRESHOLD"
DEFAULT_N_CTX = 4096      # llama.cpp's default context size
log = logging.getLogger("powerinfer")


def kv_types(kv_type: str | tuple[str, str]) -> tuple[str, str]:
    """The (K, V) cache types of kv_type: one of KV_TYPES for both, or a (K, V) pair of them."""
    pair = (kv_type, kv_type) if isinstance(kv_type, str) else tuple(kv_type)
    if len(pair) != 2 or any(t not in _KV_TYPE_IDS for t in pair):
        raise ValueError(f"kv_type must be one of {list(KV_TYPES)} or a (K, V) pair of them, got {kv_type!r}")
    return pair


def resolve_n_ctx(model: Model, n_ctx: int | None) -> int:
    """The context size for a request: None -> 4096, or the model's training context if that is
    smaller; 0 or less -> the training context. Above the training context: a warning (the model
    was not trained on positions that far; quality degrades)."""
    train = model.hparams.n_ctx_train
    n = min(DEFAULT_N_CTX, train) if n_ctx is None else train if n_ctx <= 0 else int(n_ctx)
    if n > train and not is_encoder(model.hparams.arch):   # an encoder's inputs are limited one by one (Embedder)
        log.warning("warning: n_ctx = %d is larger than the model's training context (%d): expect worse output "
                    "past %d tokens", n, train, train)
    return n


def resolve_threshold(model: Model, explicit: float | None) -> float:
    """The predictor threshold: an explicit value, else $LLAMA_SPARSE_PRED_THRESHOLD, else the file's
    powerinfer.sparse_threshold, else 0.0."""
    if explicit is not None:
        value = float(explicit)
    elif os.environ.get(THRESHOLD_ENV, "").strip():
        try:
            value = float(os.environ[THRESHOLD_ENV])
        except ValueError:
            raise ValueError(f"{THRESHOLD_ENV}={os.environ[THRESHOLD_ENV]!r} is not a number") from None
    else:
        value = model.sparse_threshold
    if value != value:
        raise ValueError("sparse threshold is NaN")
    return value


def _int32s(values, what: str) -> np.ndarray:
    """values as a flat int32 array; ValueError (never a silent wrap or truncation) for non-integers
    and integers outside int32."""
    a = np.asarray(values)
    if a.size == 0:
        return np.zeros(0, dtype=np.int32)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        if a.dtype != object or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                        for v in a.reshape(-1)):
            raise ValueError(f"decode: {what} must be integers, got {a.dtype} values")
    lo, hi = int(a.min()), int(a.max())
    if lo < -2**31 or hi >= 2**31:
        raise ValueError(f"decode: {what} value {lo if lo < -2**31 else hi} does not fit in int32")
    return np.ascontiguousarray(a, dtype=np.int32).reshape(-1)


def _is_int32(v) -> bool:
    return type(v) is int and -2**31 <= v < 2**31


def _single_int32(values) -> bool:
    """values is a list/tuple of exactly one plain int32 (the one-token decode's fast path)."""
    return type(values) in (list, tuple) and len(values) == 1 and _is_int32(values[0])


def _serialised(method):
    """Run the method holding the context's lock: the C context (KV cache, scratch buffers, thread
    pool) must never be entered by two threads at once."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)
    return locked


def _token_limit(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0 (0: no limit), got {value!r}")
    return value


class Context:
    """Decoding state over a Model.

    decode() runs a whole batch (e.g. a prompt) in one C call; logits(i) reads the
    logits of batch row i afterwards.

    Threads: every call that touches the C context (decode, the kv_* calls, the sparse
    statistics) holds `self.lock`, so calls from several threads are serialised, never
    interleaved. A decode() and the logits() that reads its result are two calls: a thread that
    shares the context holds `with ctx.lock:` around both (the lock is re-entrant).

    GPU placement (once, here; see powerinfer.offload): for PowerInfer files vram_budget (bytes;
    None: free device memory minus 256 MiB when the library sees a device, 0: CPU only),
    reset_gpu_index and disable_gpu_index; for dense files n_gpu_layers (the last N layers, -1: all
    with the output head). What was placed is in .offload (None: CPU only), the plan in .gpu_plan,
    the hot sets in .gpu_index, warnings in .gpu_warnings, the original's log lines in .gpu_log.

    kv_type: the cache's type for K and V ("f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl",
    "q5_0", "q5_1"), or a (K, V) pair (llama.cpp's -ctk / -ctv); .type_k and .type_v say which. Quantized
    caches need a head size that is a multiple of 32 and keep the attention on the CPU (the GPU
    kernels read f16 and f32 caches).
    """

    def __init__(self, model: Model, *, n_ctx: int | None = 512, n_batch: int = 512, n_seq_max: int = 1,
                 n_threads: int | None = None, n_threads_batch: int | None = None,
                 kv_type: str | tuple[str, str] = "f16",
                 sparse_threshold: float | None = None, dense: bool = False, count_neurons: bool = False,
                 vram_budget: int | None = None, reset_gpu_index: bool = False, disable_gpu_index: bool = False,
                 n_gpu_layers: int | None = None,
                 main_gpu: int = 0, sparsity: float | None = None, act_histogram: bool = False,
                 sparse_batch_max: int = 0, sparse_gather_max: int = 1):
        self.type_k, self.type_v = kv_types(kv_type)
        n_ctx = resolve_n_ctx(model, n_ctx)
        self.model = model
        self.lock = threading.RLock()
        params = ffi.new("pi_context_params *", lib.pi_context_default_params())
        params.n_ctx = n_ctx
        params.n_batch = min(n_batch, n_ctx) if n_batch > 0 else n_ctx
        params.n_seq_max = n_seq_max
        params.n_threads = n_threads or 0
        params.n_threads_batch = n_threads_batch or 0       # prompts (calls of more than one token); 0: n_threads
        params.type_k, params.type_v = _KV_TYPE_IDS[self.type_k], _KV_TYPE_IDS[self.type_v]
        self.sparse = (model.sparse or model.gate_sparse) and not dense
        self.sparse_threshold = resolve_threshold(model, sparse_threshold)
        # gate-sparse files: one threshold per layer, from a stored level unless a threshold is given
        self.layer_thresholds, self.input_thresholds, self.sparsity = None, None, None
        self.attn_thresholds = None
        if sparsity is not None and not model.gate_sparse:
            raise ValueError("sparsity levels need a gate-sparse file (tools/sparsify.py); "
                             "PowerInfer files take --sparse-threshold")
        if model.gate_sparse and not dense:
            explicit = sparse_threshold is not None or os.environ.get(THRESHOLD_ENV, "").strip()
            if sparsity is not None and explicit:
                raise ValueError("give a sparsity level or a sparse threshold, not both")
            levels = model.sparsity_levels
            level = sparsity if sparsity is not None else None if explicit else levels.default
            if level is not None:
                self.sparsity = float(level)
                self.layer_thresholds = levels.thresholds_for(float(level))
                self.input_thresholds = levels.input_thresholds_for(float(level))
                self.attn_thresholds = levels.attn_thresholds_for(float(level))
        params.sparse_threshold = self.sparse_threshold
        params.sparse_mode = lib.PI_SPARSE_ALL if dense else lib.PI_SPARSE_PREDICT
        params.count_neurons = 1 if count_neurons else 0
        params.act_histogram = 1 if act_histogram else 0
        # gate-sparse files: calls of more tokens than sparse_batch_max run the dense model; of more than
        # sparse_gather_max (and within sparse_batch_max) the level through the dense kernels (powerinfer.h)
        params.sparse_batch_max = self.sparse_batch_max = _token_limit("sparse_batch_max", sparse_batch_max)
        params.sparse_gather_max = self.sparse_gather_max = _token_limit("sparse_gather_max", sparse_gather_max)
        out = ffi.new("pi_context **")
        check(lib.pi_context_create(model._ptr, params, out), "creating context")
        self._ptr = ffi.gc(out[0], lib.pi_context_free)
        if self.layer_thresholds is not None:
            self.set_sparse_thresholds(self.layer_thresholds)
        if self.input_thresholds is not None:
            self.set_gate_input_thresholds(self.input_thresholds)
        if self.attn_thresholds is not None:
            self.set_attn_input_thresholds(self.attn_thresholds)
        self.n_ctx = params.n_ctx
        self.n_batch = params.n_batch
        self.n_seq_max = n_seq_max
        self.n_threads = params.n_threads if params.n_threads > 0 else None
        self.n_threads_batch = params.n_threads_batch if params.n_threads_batch > 0 else None
        self._abort_handle = None
        self.lora: tuple = ()       # set_lora: the (LoraAdapter, scale) pairs the decodes apply
        self._one = None   # reused cffi buffers of the one-token decode
        self._row0_pending = False   # the one-token decode's outputs, read from the C buffers on first use
        self._logits: dict[int, np.ndarray] = {}
        self.outputs = ("logits",)   # set_outputs: what a decode returns for its rows
        self._embd: dict[int, np.ndarray] = {}
        # GPU placement (powerinfer.offload): sparse files by vram_budget (bytes; None: free device memory
        # minus 256 MiB when there is a device) and the .gpuidx hot neurons, dense files by n_gpu_layers
        self.gpu_plan = None
        self.gpu_index = None
        self.offload = None
        self.gpu_warnings: list[str] = []
        self.gpu_log: list[str] = []   # the placement's log lines (also logged at INFO)
        if is_encoder(model.hparams.arch):   # embeddings only (pi_set_outputs), on the CPU (pi_context_offload)
            self.outputs = ("embeddings",)
            if n_gpu_layers or vram_budget:
                msg = f"{model.hparams.arch} is an encoder model: it runs on the CPU, the GPU offload is ignored"
                self.gpu_warnings.append(msg)
                log.warning(msg)
            n_gpu_layers, vram_budget = 0, None
        from .offload import place
        place(self, vram_budget=vram_budget, reset_gpu_index=reset_gpu_index, disable_gpu_index=disable_gpu_index,
              n_gpu_layers=n_gpu_layers, main_gpu=main_gpu, kv_type=(self.type_k, self.type_v))

    @_serialised
    def decode(self, tokens, pos=None, seq_id=0, logits: str | np.ndarray = "last") -> None:
        """Evaluate tokens in one step.

        tokens: ints; pos: their positions (default: continue seq_id after its last cached position);
        seq_id: int or per-token ints; logits: "last", "all", "none" or a boolean mask per token.
        Batches longer than n_batch are split; logits rows stay numbered over the whole call.
        """
        if (isinstance(logits, str) and logits == "last" and _is_int32(seq_id) and _single_int32(tokens)
                and (pos is None or _single_int32(pos))):
            return self._decode_one(tokens[0], seq_id, None if pos is None else pos[0])   # generation loops
        tok = _int32s(tokens, "tokens")
        n = len(tok)
        if n == 0:
            raise ValueError("decode: no tokens")
        seq_arr = np.asarray(seq_id)
        try:
            seq_arr = np.broadcast_to(seq_arr, (n,))
        except ValueError:
            raise ValueError(f"decode: seq_id has shape {seq_arr.shape}, expected one id or {n}") from None
        seq = _int32s(seq_arr, "seq_id")
        if pos is None:
            if np.any(seq != seq[0]):
                raise ValueError("decode: give pos explicitly when tokens belong to several sequences")
            start = self.seq_pos_max(int(seq[0])) + 1
            pos = np.arange(start, start + n, dtype=np.int32)
        pos = _int32s(pos, "pos")
        if len(pos) != n:
            raise ValueError("decode: pos and tokens differ in length")
        if n > self.n_batch and is_encoder(self.model.hparams.arch):   # chunks would not see each other
            raise ValueError(f"decode: {n} tokens for an encoder model, whose sequences are decoded whole: at most "
                             f"n_batch ({self.n_batch}) per call")
        if isinstance(logits, str):
            want = np.zeros(n, dtype=np.int8)
            if logits == "all":
                want[:] = 1
            elif logits == "last":
                want[-1] = 1
            elif logits != "none":
                raise ValueError(f"decode: logits must be 'last', 'all', 'none' or a mask, got {logits!r}")
        else:
            want = (np.asarray(logits).reshape(-1) != 0).astype(np.int8)
            if len(want) != n:
                raise ValueError("decode: logits mask and tokens differ in length")
        self._row0_pending, self._logits, self._embd = False, {}, {}   # a failed decode leaves none
        batch = ffi.new("pi_batch *")
        rows: dict[int, np.ndarray] = {}
        embd: dict[int, np.ndarray] = {}
        for s in range(0, n, self.n_batch):
            e = min(n, s + self.n_batch)
            batch.n_tokens = e - s
            batch.token = ffi.from_buffer("int32_t[]", tok[s:e])
            batch.pos = ffi.from_buffer("int32_t[]", pos[s:e])
            batch.seq_id = ffi.from_buffer("int32_t[]", seq[s:e])
            batch.logits = ffi.from_buffer("int8_t[]", want[s:e])
            status = lib.pi_decode(self._ptr, batch)
            if status != lib.PI_OK and s > 0:
                message = ffi.string(lib.pi_last_error()).decode("utf-8", "replace")
                for q, p in zip(seq[:s].tolist(), pos[:s].tolist()):   # undo the chunks already cached
                    lib.pi_kv_seq_rm(self._ptr, q, p, p + 1)
                raise PowerInferError(f"decode: {message}", status)
            check(status, "decode")
            for i in np.flatnonzero(want[s:e]):
                if "logits" in self.outputs:
                    rows[s + int(i)] = self._read_logits(int(i))
                if "embeddings" in self.outputs:
                    embd[s + int(i)] = self._read_embeddings(int(i))
        self._logits = rows
        self._embd = embd

    @_serialised
    def decode_embd(self, embd, pos=None, seq_id: int = 0, span: int = 0, logits: str = "none") -> None:
        """Evaluate input vectors in place of tokens (an image's projected embeddings): embd float32 [n, n_embd],
        entering the first layer as given (not scaled by the model's embedding scale, as llama.cpp feeds them);
        pos: their positions (default: after seq_id's last cached position); span > 0: the rows see each other
        bidirectionally (gemma3's image tokens, llama.cpp's non-causal image decode) and must fit one call
        (n_batch); logits: "none" or "last". """
        e = np.ascontiguousarray(embd, dtype=np.float32)
        E = self.model.hparams.n_embd
        if e.ndim != 2 or e.shape[1] != E or len(e) == 0:
            raise ValueError(f"decode_embd: embeddings of shape {e.shape}, expected (n, {E})")
        n = len(e)
        if span > 0 and n > self.n_batch:
            raise ValueError(f"decode_embd: {n} bidirectional rows do not fit one batch of {self.n_batch} "
                             "(raise n_batch / --batch-size)")
        if pos is None:
            start = self.seq_pos_max(int(seq_id)) + 1
            pos = np.arange(start, start + n, dtype=np.int32)
        pos = _int32s(pos, "pos")
        if len(pos) != n:
            raise ValueError("decode_embd: pos and embeddings differ in length")
        if logits not in ("none", "last"):
            raise ValueError(f"decode_embd: logits must be 'none' or 'last', got {logits!r}")
        seq = np.full(n, seq_id, dtype=np.int32)
        spans = np.full(n, span, dtype=np.int32)
        self._row0_pending, self._logits, self._embd = False, {}, {}
        batch = ffi.new("pi_batch *")
        for s in range(0, n, self.n_batch):
            t = min(n, s + self.n_batch)
            want = np.zeros(t - s, dtype=np.int8)
            if logits == "last" and t == n:
                want[-1] = 1
            batch.n_tokens = t - s
            batch.token = ffi.NULL
            batch.embd = ffi.from_buffer("float[]", e[s:t])
            batch.pos = ffi.from_buffer("int32_t[]", pos[s:t])
            batch.seq_id = ffi.from_buffer("int32_t[]", seq[s:t])
            batch.span = ffi.from_buffer("int32_t[]", spans[s:t]) if span > 0 else ffi.NULL
            batch.logits = ffi.from_buffer("int8_t[]", want)
            status = lib.pi_decode(self._ptr, batch)
            if status != lib.PI_OK and s > 0:
                message = ffi.string(lib.pi_last_error()).decode("utf-8", "replace")
                lib.pi_kv_seq_rm(self._ptr, int(seq_id), int(pos[0]), int(pos[s - 1]) + 1)
                raise PowerInferError(f"decode: {message}", status)
            check(status, "decode")
        if logits == "last":
            if "logits" in self.outputs:
                self._logits = {n - 1: self._read_logits(t - s - 1)}
            if "embeddings" in self.outputs:
                self._embd = {n - 1: self._read_embeddings(t - s - 1)}

    def _decode_one(self, token: int, seq: int, p: int | None) -> None:
        """decode([token], [p], seq_id=seq) (p None: after the sequence's last position), without numpy. Its
        logits (n_vocab floats, a 1 MB copy for Gemma 3) are copied out of the C context when logits() asks for
        them, not here: a loop that never reads them (a benchmark's, or embeddings only) does not pay for the
        copy (Gemma 3 270M, 128 tokens, Zen 5, alternated runs: 6.33 ms a token against 6.52, median of 5)."""
        if p is None:
            p = self.seq_pos_max(seq) + 1   # checks seq (ValueError), as the general path
        if self._one is None:
            self._one = (ffi.new("pi_batch *"), ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("int32_t[1]"),
                         ffi.new("int8_t[1]", [1]))
        batch, t, ps, sq, want = self._one
        t[0], ps[0], sq[0] = token, p, seq
        batch.n_tokens, batch.token, batch.pos, batch.seq_id, batch.logits = 1, t, ps, sq, want
        self._row0_pending, self._logits, self._embd = False, {}, {}   # a failed decode leaves none
        check(lib.pi_decode(self._ptr, batch), "decode")
        self._row0_pending = True

    def _read_pending(self) -> None:
        """The one-token decode's row 0, copied out of the C context (valid until the next decode)."""
        with self.lock:
            if self._row0_pending:
                self._logits = {0: self._read_logits(0)} if "logits" in self.outputs else {}
                self._embd = {0: self._read_embeddings(0)} if "embeddings" in self.outputs else {}
                self._row0_pending = False

    def _read_logits(self, i: int) -> np.ndarray:
        p = lib.pi_get_logits(self._ptr, i)
        if p == ffi.NULL:
            raise PowerInferError(ffi.string(lib.pi_last_error()).decode())
        return np.frombuffer(ffi.buffer(p, 4 * self.model.n_vocab), dtype=np.float32).copy()

    @_serialised
    def set_outputs(self, logits: bool = True, embeddings: bool = False) -> None:
        """What decode() returns for the rows its `logits` argument selects: the logits (default),
        the final hidden states (`embeddings(i)`: the output norm's result, the head's input), or
        both. Embeddings alone skip the output head (a matmul over the whole vocabulary)."""
        flags = (lib.PI_OUTPUT_LOGITS if logits else 0) | (lib.PI_OUTPUT_EMBD if embeddings else 0)
        if not flags:
            raise ValueError("set_outputs: ask for logits, embeddings or both")
        check(lib.pi_set_outputs(self._ptr, flags), "set_outputs")
        self.outputs = tuple(k for k, on in (("logits", logits), ("embeddings", embeddings)) if on)
        self._row0_pending, self._logits, self._embd = False, {}, {}

    def _read_embeddings(self, i: int) -> np.ndarray:
        p = lib.pi_get_embeddings(self._ptr, i)
        if p == ffi.NULL:
            raise PowerInferError(ffi.string(lib.pi_last_error()).decode())
        return np.frombuffer(ffi.buffer(p, 4 * self.model.hparams.n_embd), dtype=np.float32).copy()

    def embeddings(self, i: int = -1) -> np.ndarray:
        """[n_embd] float32 final hidden state of row i of the last decode (-1: the last row that
        has one); needs set_outputs(embeddings=True)."""
        if "embeddings" not in self.outputs:
            raise PowerInferError("no embeddings: the context outputs logits only (set_outputs(embeddings=True))")
        self._read_pending()
        if not self._embd:
            raise PowerInferError("no embeddings: the last decode asked for none")
        if i < 0:
            i = max(self._embd)
        if i not in self._embd:
            raise PowerInferError(f"no embeddings for batch row {i}")
        return self._embd[i]

    def logits(self, i: int = -1) -> np.ndarray:
        """[n_vocab] float32 logits of row i of the last decode (-1: the last row that has them)."""
        if "logits" not in self.outputs:
            raise PowerInferError("no logits: the context outputs embeddings only (set_outputs(logits=True))")
        self._read_pending()
        if not self._logits:
            raise PowerInferError("no logits: the last decode asked for none")
        if i < 0:
            i = max(self._logits)
        if i not in self._logits:
            raise PowerInferError(f"no logits for batch row {i}")
        return self._logits[i]

    @property
    def exact_batch_max(self) -> int:
        """The most tokens one decode call may hold for its rows to be the bits of those tokens decoded one at a
        time (0: any number; the numeric contract): a gate-sparse level runs other kernels above sparse_gather_max
        and the dense model above sparse_batch_max (speculative decoding keeps its batches within it)."""
        if not (self.sparse and self.model.gate_sparse):
            return 0
        return min((n for n in (self.sparse_gather_max, self.sparse_batch_max) if n > 0), default=0)

    # ---- KV cache ----
    @_serialised
    def seq_pos_max(self, seq: int = 0) -> int:
        if not 0 <= seq < self.n_seq_max:
            raise ValueError(f"sequence id {seq} out of range [0, {self.n_seq_max})")
        return int(lib.pi_kv_seq_pos_max(self._ptr, seq))

    @_serialised
    def kv_seq_rm(self, seq: int = -1, p0: int = 0, p1: int = -1) -> None:
        check(lib.pi_kv_seq_rm(self._ptr, seq, p0, p1), "kv_seq_rm")

    @_serialised
    def kv_seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        check(lib.pi_kv_seq_cp(self._ptr, src, dst, p0, p1), "kv_seq_cp")

    @_serialised
    def kv_clear(self) -> None:
        lib.pi_kv_clear(self._ptr)

    @_serialised
    def kv_seq_state(self, seq: int, p0: int = 0, p1: int = -1) -> bytes:
        """Sequence seq's KV state over positions [p0, p1) (p1 < 0: to the end): the positions and K/V rows of every
        layer, in position order (pi_kv_seq_state_get), for kv_seq_set_state in a context of the same model and KV
        type."""
        n = int(lib.pi_kv_seq_state_size(self._ptr, seq, p0, p1))
        buf = bytearray(n)
        written = ffi.new("size_t *")
        check(lib.pi_kv_seq_state_get(self._ptr, seq, p0, p1, ffi.from_buffer(buf) if n else ffi.NULL, n, written),
              "kv_seq_state")
        return bytes(buf)

    @staticmethod
    def kv_state_positions(state: bytes) -> np.ndarray:
        """The positions a kv_seq_state holds (int32, ascending); ValueError for bytes that are not one."""
        n = ffi.new("int32_t *")
        buf = ffi.from_buffer(state)
        if lib.pi_kv_seq_state_positions(buf, len(state), ffi.NULL, 0, n) != lib.PI_OK:
            raise ValueError(ffi.string(lib.pi_last_error()).decode())
        out = np.empty(n[0], np.int32)
        check(lib.pi_kv_seq_state_positions(buf, len(state), ffi.cast("int32_t *", out.ctypes.data), n[0], n),
              "kv_state_positions")
        return out

    @_serialised
    def kv_seq_set_state(self, seq: int, state: bytes, cells=None) -> None:
        """Restores a kv_seq_state into sequence seq: into `cells` (one per token of the state, each free or held by
        seq alone) or, with None, into the lowest free cells, replacing seq's cells."""
        c = ffi.NULL if cells is None else ffi.new("int32_t[]", [int(x) for x in cells])
        n = 0 if cells is None else len(cells)
        check(lib.pi_kv_seq_state_set(self._ptr, seq, ffi.from_buffer(state), len(state), c, n), "kv_seq_set_state")

    @property
    def recurrent(self) -> bool:
        """Whether the model has recurrent layers (qwen35's gated delta nets): a sequence's state cannot drop positions
        it has absorbed (kv_seq_rm of a tail raises; re-decode the whole sequence instead)."""
        return self.model.recurrent

    @_serialised
    def recurrent_pos(self, seq: int = 0) -> int:
        """The last position sequence seq's recurrent state has absorbed (-1: none, or no recurrent layers)."""
        return int(lib.pi_recurrent_pos(self._ptr, seq))

    @property
    @_serialised
    def kv_used(self) -> int:
        return int(lib.pi_kv_used_cells(self._ptr))

    @property
    def kv_cache_bytes(self) -> tuple[int, int]:
        """Bytes of the K cache and of the V cache (n_ctx cells of every layer, in their types)."""
        cached = [g for il, g in enumerate(self.model.hparams.layers()) if g.kv_source == il]   # not the shared ones
        return tuple(sum(int(lib.pi_row_bytes(_KV_TYPE_IDS[t], g.head_dim * g.n_head_kv)) for g in cached) * self.n_ctx
                     for t in (self.type_k, self.type_v))

    # ---- sparse statistics ----
    def _layer_stats(self, fn, what: str) -> tuple[np.ndarray, int]:
        active = np.zeros(self.model.hparams.n_layer, dtype=np.int64)
        total = ffi.new("int64_t *")
        check(fn(self._ptr, ffi.from_buffer("int64_t[]", active), total), what)
        return active, int(total[0])

    @_serialised
    def sparse_stats(self) -> tuple[np.ndarray, int]:
        """(active[n_layer], total): (neuron, token) pairs computed per layer since the last reset,
        and the pairs a dense FFN would have computed per layer."""
        return self._layer_stats(lib.pi_sparse_stats, "sparse_stats")

    @_serialised
    def sparse_stats_reset(self) -> None:
        """Zeroes sparse_stats and neuron_counts."""
        lib.pi_sparse_stats_reset(self._ptr)

    @_serialised
    def neuron_counts(self) -> np.ndarray:
        """[n_layer, n_ff] int64: for each neuron (by its index in the file), the tokens for which the
        FFN computed it since the context was made or the last reset; needs count_neurons=True. These
        are activation statistics as PowerInfer's activation_N.pt hold them (tools/profile_sparse.py)."""
        hp = self.model.hparams
        out = np.zeros((hp.n_layer, hp.n_ff), dtype=np.int64)
        for il in range(hp.n_layer):
            check(lib.pi_neuron_counts(self._ptr, il, ffi.from_buffer("int64_t[]", out[il])), "neuron_counts")
        return out

    @_serialised
    def act_histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(counts [n_layer, 4, bins] int64, lower edges [bins] f32): how many values of each layer's dense pass
        fell in each bin since the context was made or the last reset, [:, 0] the channels' |act(gate x)|,
        [:, 1] the FFN input's |x_j|, [:, 2] the attention input's, [:, 3] the attention output's; needs
        act_histogram=True (the calibration of tools/sparsify.py)."""
        n_bins = lib.PI_ACT_HIST_BINS
        out = np.zeros((self.model.hparams.n_layer, lib.PI_ACT_HIST_KINDS, n_bins), dtype=np.int64)
        check(lib.pi_act_histogram(self._ptr, ffi.from_buffer("int64_t[]", out)), "act_histogram")
        edges = np.array([lib.pi_act_histogram_edge(b) for b in range(n_bins)], dtype=np.float32)
        return out, edges

    @_serialised
    def act_channel_means(self) -> np.ndarray:
        """[n_layer, n_ff] f32: per layer and channel the mean |up_i . x| over the tokens the histogram counted
        (act_histogram=True): the channel weights of tools/sparsify.py (blk.N.ffn_act_scale)."""
        hp = self.model.hparams
        out = np.zeros((hp.n_layer, hp.n_ff), dtype=np.float32)
        check(lib.pi_act_channel_means(self._ptr, ffi.from_buffer("float[]", out)), "act_channel_means")
        return out

    def _per_layer(self, fn, values, what: str):
        """fn(ctx, values [n_layer] f32 or NULL); returns the copy kept (None for None)."""
        t = None if values is None else np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        if t is not None and t.size != self.model.hparams.n_layer:
            raise ValueError(f"{what}: {t.size} values for {self.model.hparams.n_layer} layers")
        check(fn(self._ptr, ffi.NULL if t is None else ffi.from_buffer("float[]", t)), what)
        return None if t is None else t.copy()

    @_serialised
    def set_sparse_thresholds(self, thresholds) -> None:
        """One threshold per layer (None: every layer back to sparse_threshold)."""
        self.layer_thresholds = self._per_layer(lib.pi_set_sparse_thresholds, thresholds, "set_sparse_thresholds")

    @_serialised
    def set_gate_input_thresholds(self, thresholds) -> None:
        """Gate-sparse files with ffn_gate_t: one FFN-input threshold per layer (None or 0: the dense gate)."""
        self.input_thresholds = self._per_layer(lib.pi_set_gate_input_thresholds, thresholds,
                                                "set_gate_input_thresholds")

    @_serialised
    def set_attn_input_thresholds(self, thresholds) -> None:
        """Files with attention thresholds: [2, n_layer] (the attention input's, the attention output's; None or 0:
        the dense matmuls)."""
        n = self.model.hparams.n_layer
        if thresholds is None:
            check(lib.pi_set_attn_input_thresholds(self._ptr, ffi.NULL, ffi.NULL), "set_attn_input_thresholds")
            self.attn_thresholds = None
            return
        arr = np.ascontiguousarray(np.asarray(thresholds, dtype=np.float32))
        if arr.shape != (2, n):
            raise ValueError(f"set_attn_input_thresholds: expected [2, {n}] thresholds, got shape {arr.shape}")
        qkv, out = ffi.from_buffer("float[]", arr[0].copy()), ffi.from_buffer("float[]", arr[1].copy())
        check(lib.pi_set_attn_input_thresholds(self._ptr, qkv, out), "set_attn_input_thresholds")
        self.attn_thresholds = arr

    @_serialised
    def attn_input_stats(self) -> tuple[np.ndarray, int]:
        """(active[n_layer], total): attention input and output entries q/k/v and wo read per layer since the last
        reset, and the entries in that time (tokens x (n_embd + n_head x head_dim))."""
        return self._layer_stats(lib.pi_attn_input_stats, "attn_input_stats")

    @_serialised
    def gate_input_stats(self) -> tuple[np.ndarray, int]:
        """(active[n_layer], total): FFN input entries the gate read per layer since the last reset, and
        the entries in that time (tokens x n_embd)."""
        return self._layer_stats(lib.pi_gate_input_stats, "gate_input_stats")

    @_serialised
    def set_lora(self, adapters=()) -> None:
        """The LoRA adapters the next decodes apply: (powerinfer.lora.LoraAdapter, scale) pairs of this context's
        model (the context keeps them alive); () for none. Nothing is called when the list is the one set."""
        adapters = tuple((ad, float(s)) for ad, s in adapters)
        if adapters == self.lora:
            return
        set_context_adapters(self, adapters)
        self.lora = adapters

    @_serialised
    def set_control_vector(self, data=None, layer_start: int = 1, layer_end: int | None = None) -> None:
        """A control vector (powerinfer.control_vector.load_control_vectors: float32 [n_layer, n_embd]) added to the
        residual stream after each layer in [layer_start, layer_end] (llama.cpp's --control-vector-layer-range;
        default 1 .. n_layer); None: none."""
        hp = self.model.hparams
        if data is None:
            check(lib.pi_context_set_control_vector(self._ptr, ffi.NULL, 0, 0, 0), "clearing the control vector")
            return
        data = np.ascontiguousarray(data, dtype=np.float32)
        if data.shape != (hp.n_layer, hp.n_embd):
            raise ValueError(f"a control vector is [n_layer, n_embd] = [{hp.n_layer}, {hp.n_embd}], got {data.shape}")
        end = hp.n_layer if layer_end is None else layer_end
        if layer_start < 0 or end < layer_start:
            raise ValueError(f"control vector layer range [{layer_start}, {end}] is empty or negative")
        check(lib.pi_context_set_control_vector(self._ptr, ffi.from_buffer("float[]", data), hp.n_embd, layer_start,
                                                end), "setting the control vector")

    @_serialised
    def set_abort_callback(self, fn) -> None:
        """fn() -> bool, called between layers; True aborts the running decode."""
        if fn is None:
            lib.pi_set_abort_callback(self._ptr, ffi.NULL, ffi.NULL)
            self._abort_handle = None
            return
        cb = ffi.callback("int32_t(void *)", lambda _: 1 if fn() else 0)
        self._abort_handle = cb
        lib.pi_set_abort_callback(self._ptr, cb, ffi.NULL)
