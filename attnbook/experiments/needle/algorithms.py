"""Small, readable models of the published subquadratic families, each with the adversary that defeats
it (chapter 2's table), and :data:`ALGORITHMS` to build them by name."""

from __future__ import annotations

import math

import torch

from attnlib import _validate
from attnlib.linear import FavorPlus
from attnlib.sparse import block_sparse_attention, expand_block_mask, n_blocks
from attnlib.window import band

from .argument import _ACC, Case, plant

# ---------------------------------------------------------------------------------------------
# The algorithms
# ---------------------------------------------------------------------------------------------

def _masked_attention(q, k, v, mask, scale):
    """Exact softmax attention restricted to ``mask [..., T, T]`` (empty rows -> 0), float64."""
    s = scale * (q.to(_ACC) @ k.to(_ACC).transpose(-1, -2))
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1, keepdim=True)
    lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    return torch.exp(s - lse) @ v.to(_ACC)


def _offsets(T: int) -> torch.Tensor:
    """``[T, T]`` matrix of ``i - j`` (query minus key position): the patterns are read off it."""
    idx = torch.arange(T)
    return idx[:, None] - idx[None, :]


def _sqrt_T(T: int) -> int:
    """``ceil(sqrt(T))``: the default band, stride and screen width, which keep the work ``O(T^1.5)``."""
    return math.ceil(math.sqrt(T))


def _edge_margin(T: int) -> int:
    """How far from the ends of the row the needle's key stays (``T // 8``, at least 1): a spike on
    the first or last key sits on a figure's axis, where it cannot be seen."""
    return max(1, T // 8)


def _pick_unseen(probes: torch.Tensor | None, i: int, what: str, T: int) -> int:
    """The needle's key for row ``i``: among the keys row ``i`` does not inspect (every key but ``i``
    when ``probes`` is None), the one farthest from ``i`` that keeps :func:`_edge_margin` from both
    ends of the row (so that a figure shows the needle clearly); any unseen key if none does."""
    unseen = torch.ones(T, dtype=torch.bool) if probes is None else ~probes[i]
    unseen[i] = False
    keys = unseen.nonzero().flatten()
    if keys.numel() == 0:
        raise ValueError(f"T={T} is too small to attack {what}: it inspects every key of row {i}; "
                         "use a larger T")
    margin = _edge_margin(T)
    inner = keys[(keys >= margin) & (keys <= T - 1 - margin)]
    keys = inner if inner.numel() else keys
    return int(keys[(keys - i).abs().argmax()])


class Algorithm:
    """Common interface. ``attend(q, k, v) -> o`` for ``[B, H, T, d]`` inputs (output in q's dtype);
    ``probes(q, k) -> [T, T] bool`` (the exact scores computed for the first batch/head), or ``None``
    when the algorithm computes no exact score; ``work()`` in score equivalents; ``adversary(M)``."""

    name = "algorithm"
    kind = "pattern"          # pattern | random | reads vectors | features | low rank
    summary = ""              # one line: what it inspects

    def __init__(self, *, T: int, d: int, seed: int = 0):
        self.T = _validate.check_int("T", T, lo=8)
        self.d = _validate.check_int("d", d, lo=2)
        self.seed = _validate.check_int("seed", seed, lo=0)
        self.scale = 1.0 / math.sqrt(d)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(T={self.T}, d={self.d}, seed={self.seed})"

    def _check_inputs(self, q, k, v):
        _validate.check_qkv(q, k, v)
        if q.shape[2] != self.T or k.shape[2] != self.T:
            raise ValueError(f"q has T={q.shape[2]}, k has T={k.shape[2]}; this {self.name} was built "
                             f"for T={self.T}")
        if q.shape[3] != self.d:
            raise ValueError(f"q has d={q.shape[3]}; this {self.name} was built for d={self.d}")

    # --- mask-based algorithms ------------------------------------------------------------
    def _mask(self, q2: torch.Tensor, k2: torch.Tensor) -> torch.Tensor:      # [T, d] -> [T, T]
        raise NotImplementedError

    def attend(self, q, k, v):
        self._check_inputs(q, k, v)
        B, H = q.shape[:2]
        mask = torch.stack([torch.stack([self._mask(q[b, h], k[b, h]) for h in range(H)])
                            for b in range(B)]) if B * H else torch.zeros(B, H, self.T, self.T,
                                                                          dtype=torch.bool)
        return _masked_attention(q, k, v, mask, self.scale).to(q.dtype)

    def probes(self, q=None, k=None):
        if q is None:
            q = k = torch.zeros(self.T, self.d)
        elif q.dim() == 4:
            q, k = q[0, 0], k[0, 0]
        return self._mask(q, k)

    def work(self) -> float:
        g = torch.Generator().manual_seed(self.seed + 1)
        q, k = torch.randn(2, self.T, self.d, generator=g)
        return float(self.probes(q, k).sum())

    def adversary(self, M: float) -> Case:
        """Oracle-model adversary: the pattern ignores the data, so read it off the all-zero input
        and plant the needle at an unseen pair."""
        i = self.T // 2
        probes = self.probes()
        j = _pick_unseen(probes, i, self.name, self.T)
        return plant(self.T, self.d, i, j, M, scale=self.scale)


class SlidingWindow(Algorithm):
    """Query ``i`` sees the keys of :func:`attnlib.window.band` (not causal): ``|i - j| < window``, by
    default ``window = ceil(sqrt(T)) + 1``, about ``T (2 window - 1)`` scores -- the probe map of
    :func:`attnlib.sliding_window_attention`."""
    name, kind = "sliding_window", "pattern"
    summary = "a band |i - j| < w around the diagonal"

    def __init__(self, *, T, d, seed=0, window: int | None = None):
        super().__init__(T=T, d=d, seed=seed)
        self.window = _validate.check_int("window", _sqrt_T(T) + 1 if window is None else window, lo=1)

    def _mask(self, q2, k2):
        return band(self.T, self.T, self.window, causal=False)


class Strided(Algorithm):
    """Sparse-Transformer strided pattern: keys with ``|i - j| < l`` or ``(i - j) % l == 0``,
    ``l = ceil(sqrt(T))``: about ``T (2l + T/l)`` scores."""
    name, kind = "strided", "pattern"
    summary = "a local band plus every l-th key (Sparse Transformer)"

    def __init__(self, *, T, d, seed=0, stride: int | None = None):
        super().__init__(T=T, d=d, seed=seed)
        self.stride = _validate.check_int("stride", _sqrt_T(T) if stride is None else stride, lo=1)

    def _mask(self, q2, k2):
        diff = _offsets(self.T)
        return (diff.abs() < self.stride) | (diff % self.stride == 0)


class RandomKeys(Algorithm):
    """Each query samples ``n_samples`` keys (default ``2 ceil(sqrt(T))``) without replacement, with
    coins fixed by ``seed``, and takes the softmax over its sample (uniform sampling: the
    self-normalised estimate of the row). ``P[(i, j) unsampled] = 1 - n_samples / T``."""
    name, kind = "random_keys", "random"
    summary = "s keys per query, sampled with fixed coins"

    def __init__(self, *, T, d, seed=0, n_samples: int | None = None):
        super().__init__(T=T, d=d, seed=seed)
        s = n_samples if n_samples is not None else 2 * _sqrt_T(T)
        self.n_samples = min(_validate.check_int("n_samples", s, lo=1), T)
        g = torch.Generator().manual_seed(seed)
        idx = torch.rand(T, T, generator=g).argsort(-1)[:, :self.n_samples]
        self._coins = torch.zeros(T, T, dtype=torch.bool).scatter_(1, idx, True)

    def _mask(self, q2, k2):
        return self._coins

    def miss_probability(self) -> float:
        """The chance that a pair chosen *before* the coins are tossed is not sampled."""
        return 1.0 - self.n_samples / self.T

    def work(self) -> float:
        return float(self.T * self.n_samples)


class IndexerTopK(Algorithm):
    """Block-sparse attention whose blocks are chosen by a cheap indexer (DeepSeek sparse attention's
    idea, at block granularity).

    Indexer: a fixed projection ``P [d, r]`` (``r = d // 4``); block means ``qbar_I, kbar_J``; index
    scores ``relu((qbar_I P) . (kbar_J P))`` (one head of DSA's indexer, which also applies a ReLU).
    Each query block visits its diagonal block and the ``top_k`` best other key blocks (ties broken
    by position), then runs exact attention there with :func:`attnlib.block_sparse_attention` -- the
    kernel on a GPU. The indexer *reads the vectors*, but only through ``P`` and the ReLU: it cannot
    tell ``u . w`` from ``(u P) . (w P)``.
    """
    name, kind = "indexer_topk", "reads vectors"
    summary = "top-k key blocks chosen by a rank-r indexer (DSA's idea)"

    def __init__(self, *, T, d, seed=0, block_size: int = 16, top_k: int | None = None,
                 rank: int | None = None, backend: str = "auto"):
        super().__init__(T=T, d=d, seed=seed)
        self.block_size = _validate.check_power_of_two("block_size", block_size, lo=1, hi=1024)
        self.nb = n_blocks(T, block_size)
        k_default = max(1, math.ceil(math.sqrt(self.nb)))
        self.top_k = _validate.check_int("top_k", top_k if top_k is not None else k_default, lo=1)
        self.rank = _validate.check_int("rank", rank if rank is not None else max(1, d // 4), lo=1)
        if self.rank >= d:
            raise ValueError(f"rank must be < d={d} (a cheap indexer); got {self.rank}")
        self.backend = backend
        g = torch.Generator().manual_seed(seed)
        self.P = torch.randn(d, self.rank, generator=g, dtype=_ACC)

    def block_mask(self, q2, k2) -> torch.Tensor:
        """``[nb, nb]`` bool: the key blocks each query block visits."""
        bs, nb = self.block_size, self.nb
        pad = nb * bs - self.T

        def pooled(x):   # block means of [T, d] (the short tail block averaged over its own rows)
            x = torch.nn.functional.pad(x.to(_ACC), (0, 0, 0, pad)).view(nb, bs, self.d).sum(1)
            counts = torch.full((nb, 1), float(bs), dtype=_ACC)
            counts[-1] = bs - pad
            return x / counts

        score = torch.relu((pooled(q2) @ self.P) @ (pooled(k2) @ self.P).T)      # [nb, nb]
        score.fill_diagonal_(float("inf"))                                       # always the diagonal
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices
        keep = torch.zeros(nb, nb, dtype=torch.bool)
        keep.scatter_(1, order[:, :min(nb, 1 + self.top_k)], True)
        return keep

    def _mask(self, q2, k2):
        return expand_block_mask(self.block_mask(q2, k2)[None], self.block_size, self.T, self.T)[0]

    def attend(self, q, k, v):
        self._check_inputs(q, k, v)
        out = []
        for b in range(q.shape[0]):
            bm = torch.stack([self.block_mask(q[b, h], k[b, h]) for h in range(q.shape[1])]).to(q.device)
            out.append(block_sparse_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], bm,
                                              block_size=self.block_size, scale=self.scale,
                                              causal=False, backend=self.backend))
        return torch.cat(out) if out else torch.zeros_like(v)

    def work(self) -> float:
        indexer = 2 * self.T * self.rank / self.d + self.nb ** 2 * self.rank / self.d
        return super().work() + indexer

    def blind_pair(self, alpha: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
        """Unit ``u, w`` with ``u . w = (1 - alpha^2) / (1 + alpha^2) > 0`` but
        ``(u P) . (w P) < 0``: ``u = n + alpha t``, ``w = n - alpha t`` with ``n`` in ``null(P^T)``
        and ``t`` in the column space of ``P`` (both unit). The ReLU turns the needle's index score
        into an exact zero -- a margin, not a rounding accident."""
        U, _, Vh = torch.linalg.svd(self.P, full_matrices=True)       # P = U S Vh, U [d, d]
        n, t = U[:, -1], U[:, 0]                                       # null(P^T), top of col(P)
        u, w = n + alpha * t, n - alpha * t
        return u / u.norm(), w / w.norm()

    def adversary(self, M: float, *, hide: bool = True) -> Case:
        """With ``hide=True`` the needle is a :meth:`blind_pair`: every index score is zero, as on the
        all-zero input, so the selection is the one read off that input and the needle's block is
        not in it. With ``hide=False`` the needle points along ``e_1`` (``u = w``): the indexer sees
        a positive score and fetches the block -- the needle is found."""
        i = self.T // 2
        j = _pick_unseen(self.probes(), i, self.name, self.T)
        u, w = self.blind_pair() if hide else (None, None)
        case = plant(self.T, self.d, i, j, M, scale=self.scale, u=u, w=w)
        case.info["hidden"] = hide
        if hide and self.probes(case.q, case.k)[i, j]:
            raise RuntimeError("the indexer saw the hidden needle; this should not happen")
        return case


class LSHBuckets(Algorithm):
    """Reformer-style angular LSH. ``n_rounds`` random rotations ``R [d, nb/2]``; a vector's bucket is
    ``argmax([x R, -x R])``. Query ``i`` sees the keys sharing its bucket in some round, and itself
    (so that no row is empty). ``n_buckets`` defaults to the even number nearest ``sqrt(T)``."""
    name, kind = "lsh", "reads vectors"
    summary = "keys that share an angular-LSH bucket (Reformer)"

    def __init__(self, *, T, d, seed=0, n_buckets: int | None = None, n_rounds: int = 2):
        super().__init__(T=T, d=d, seed=seed)
        nb = n_buckets if n_buckets is not None else max(2, 2 * round(math.sqrt(T) / 2))
        self.n_buckets = _validate.check_int("n_buckets", nb, lo=2)
        if self.n_buckets % 2:
            raise ValueError(f"n_buckets must be even (buckets come in +/- pairs); got {nb}")
        self.n_rounds = _validate.check_int("n_rounds", n_rounds, lo=1)
        g = torch.Generator().manual_seed(seed)
        self.R = torch.randn(self.n_rounds, d, self.n_buckets // 2, generator=g, dtype=_ACC)
        self._pairs: dict = {}

    def buckets(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, d] -> [n_rounds, T]`` bucket ids (the zero vector goes to bucket 0: first argmax)."""
        xr = x.to(_ACC) @ self.R                                                  # [rounds, T, nb/2]
        return torch.cat([xr, -xr], -1).argmax(-1)

    def _mask(self, q2, k2):
        hq, hk = self.buckets(q2), self.buckets(k2)
        same = (hq[:, :, None] == hk[:, None, :]).any(0)
        return same | torch.eye(self.T, dtype=torch.bool)

    def work(self) -> float:
        hashing = 2 * self.T * self.n_rounds * self.n_buckets / 2
        return super().work() + hashing

    def straddling_pair(self, min_cos: float = 0.0, tries: int = 4000):
        """Unit ``u, w`` in different buckets in *every* round, with ``u . w`` as large as found
        (a random search, deterministic given ``seed``; cached)."""
        key = (min_cos, tries)
        if key not in self._pairs:
            self._pairs[key] = self._search_pair(min_cos, tries)
        return self._pairs[key]

    def _search_pair(self, min_cos: float, tries: int):
        g = torch.Generator().manual_seed(self.seed + 7)
        best = None
        for _ in range(tries // 200):
            u = torch.randn(self.d, generator=g, dtype=_ACC)
            u = u / u.norm()
            sig = torch.logspace(-2, 0.5, 200, dtype=_ACC)[:, None]
            w = u + sig * torch.randn(200, self.d, generator=g, dtype=_ACC)
            w = w / w.norm(dim=-1, keepdim=True)
            hu, hw = self.buckets(u[None])[:, 0], self.buckets(w)                 # [r], [r, 200]
            ok = (hw != hu[:, None]).all(0)
            cos = w @ u
            cos = torch.where(ok, cos, torch.full_like(cos, -2.0))
            c = int(cos.argmax())
            if best is None or cos[c] > best[2]:
                best = (u, w[c], float(cos[c]))
        if best is None or best[2] <= min_cos:
            raise RuntimeError("found no straddling pair; raise tries")
        return best

    def adversary(self, M: float) -> Case:
        """The needle straddles a hyperplane: ``u . w`` large but ``h(u) != h(w)`` in every round, so
        query ``i`` and key ``j`` never share a bucket. The haystack is random (keys projected
        orthogonal to ``u``), so that the buckets stay balanced: with an all-zero haystack every zero
        vector would hash to one bucket and the algorithm would do quadratic work."""
        u, w, cos = self.straddling_pair()
        i = self.T // 2
        j = _pick_unseen(None, i, self.name, self.T)
        g = torch.Generator().manual_seed(self.seed + 11)
        hq, hk = torch.randn(2, self.T, self.d, generator=g, dtype=_ACC)
        hk = hk - (hk @ u)[:, None] * u[None, :]
        case = plant(self.T, self.d, i, j, M, scale=self.scale, u=u, w=w, haystack_k=hk, haystack_q=hq)
        if self.probes(case.q, case.k)[i, j]:
            raise RuntimeError("the straddling pair collided; this should not happen")
        return case


class Performer(Algorithm):
    """FAVOR+ positive random features (Choromanski et al.): with ``x = sqrt(scale) q``,
    ``y = sqrt(scale) k`` and ``w_r ~ N(0, I)``,

        exp(x . y) = E_w[ exp(w . x - |x|^2/2) exp(w . y - |y|^2/2) ]  ~  phi(x) . phi(y),

    ``m`` features (default 64). Attention ``~ phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1)``: no exact
    score is ever computed. Evaluated in log space with per-query and global key stabilisers (they
    cancel in the ratio); a row whose denominator underflows returns zeros, not NaN."""
    name, kind = "performer", "features"
    summary = "every pair, through m positive random features (FAVOR+)"

    def __init__(self, *, T, d, seed=0, n_features: int = 64):
        super().__init__(T=T, d=d, seed=seed)
        self.m = _validate.check_int("n_features", n_features, lo=1)
        # The library's FAVOR+ draws the features: i.i.d. rows, the plain estimator whose variance the
        # needle exploits. Its __call__ exponentiates directly, which overflows at the needle's scores
        # (M up to 1e4), so attend evaluates the same features in log space from its weights.
        self.features = FavorPlus(d, num_features=self.m, seed=seed, orthogonal=False)

    def attend(self, q, k, v):
        self._check_inputs(q, k, v)
        x = q.to(_ACC) * math.sqrt(self.scale)
        y = k.to(_ACC) * math.sqrt(self.scale)
        W = self.features.weight                                                 # [m, d], float64
        lq = x @ W.T - 0.5 * (x * x).sum(-1, keepdim=True)                       # [B, H, T, m]
        lk = y @ W.T - 0.5 * (y * y).sum(-1, keepdim=True)
        lq = lq - lq.amax(-1, keepdim=True)
        lk = lk - lk.amax(dim=(-2, -1), keepdim=True)
        fq, fk = lq.exp(), lk.exp()
        num = fq @ (fk.transpose(-1, -2) @ v.to(_ACC))
        den = fq @ fk.sum(-2).unsqueeze(-1)
        o = torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))
        return o.to(q.dtype)

    def probes(self, q=None, k=None):
        return None

    def work(self) -> float:
        # features of q and k (2 T m dot products of length d) + phi(K)^T V and phi(Q) times it
        # (2 T m d multiply-adds with Dv = d)
        return 4.0 * self.T * self.m

    @staticmethod
    def relative_variance(x: torch.Tensor, y: torch.Tensor, m: int) -> float:
        """Var / mean^2 of the m-feature estimate of ``exp(x . y)``: ``(exp(|x + y|^2) - 1) / m``."""
        return math.expm1(float(((x + y) ** 2).sum())) / m


class Linformer(Algorithm):
    """Low rank along time (Linformer): ``K' = E K``, ``V' = E V`` with ``E [r, T]``, ``r = rank``
    (default 8, independent of T), and ``o = softmax(scale Q K'^T + log n) V'``.

    ``projection="pool"`` (default) averages ``r`` contiguous segments; the ``+ log n`` (segment sizes)
    makes it exact when all scores are equal. ``projection="gaussian"`` uses ``E ~ N(0, 1/r)`` as in
    the paper's Johnson-Lindenstrauss argument (no ``log n`` term); its rows are not distributions."""
    name, kind = "linformer", "low rank"
    summary = "r pooled keys and values (low rank along time)"

    def __init__(self, *, T, d, seed=0, rank: int = 8, projection: str = "pool"):
        super().__init__(T=T, d=d, seed=seed)
        self.rank = _validate.check_int("rank", rank, lo=1)
        if self.rank > T // 2:
            raise ValueError(f"rank must be <= T/2 = {T // 2} (low rank); got {rank}")
        if projection not in ("pool", "gaussian"):
            raise ValueError(f"projection must be 'pool' or 'gaussian'; got {projection!r}")
        self.projection = projection
        if projection == "pool":
            E = torch.zeros(self.rank, T, dtype=_ACC)
            for s, seg in enumerate(torch.arange(T).tensor_split(self.rank)):
                E[s, seg] = 1.0 / len(seg)
            self.log_n = torch.tensor([math.log(len(seg)) for seg in torch.arange(T).tensor_split(self.rank)],
                                      dtype=_ACC)
        else:
            g = torch.Generator().manual_seed(seed)
            E = torch.randn(self.rank, T, generator=g, dtype=_ACC) / math.sqrt(self.rank)
            self.log_n = torch.zeros(self.rank, dtype=_ACC)
        self.E = E

    def attend(self, q, k, v):
        self._check_inputs(q, k, v)
        kp, vp = self.E @ k.to(_ACC), self.E @ v.to(_ACC)                         # [B, H, r, .]
        s = self.scale * (q.to(_ACC) @ kp.transpose(-1, -2)) + self.log_n
        return (torch.softmax(s, -1) @ vp).to(q.dtype)

    def probes(self, q=None, k=None):
        return None

    def work(self) -> float:
        return float(self.T * self.rank + 2 * self.rank * self.T)

    def adversary(self, M: float) -> Case:
        """The needle's key is averaged with its segment: the best the row can do is spread the
        segment's weight over ``T / r`` keys."""
        i = self.T // 2
        return plant(self.T, self.d, i, _pick_unseen(None, i, self.name, self.T), M, scale=self.scale)


class NormScreen(Algorithm):
    """An algorithm that reads the vectors (outside the oracle model): query ``i`` sees its band
    ``|i - j| <= w`` and the ``c`` keys of largest norm (Cauchy-Schwarz: only they can carry a large
    score); ``w = c = ceil(sqrt(T))``. It catches the zero-haystack needle at once; the adversary
    answers with a haystack of keys of the needle's norm, orthogonal to the query."""
    name, kind = "norm_screen", "reads vectors"
    summary = "a band plus the c keys of largest norm (reads the vectors)"

    def __init__(self, *, T, d, seed=0, window: int | None = None, top_c: int | None = None):
        super().__init__(T=T, d=d, seed=seed)
        r = _sqrt_T(T)
        self.window = _validate.check_int("window", window if window is not None else r, lo=0)
        self.top_c = min(_validate.check_int("top_c", top_c if top_c is not None else r, lo=1), T)

    def _mask(self, q2, k2):
        band = _offsets(self.T).abs() <= self.window
        norms = k2.to(_ACC).norm(dim=-1)
        top = torch.sort(norms, descending=True, stable=True).indices[:self.top_c]
        big = torch.zeros(self.T, dtype=torch.bool)
        big[top] = True
        return band | big[None, :]

    def work(self) -> float:
        return super().work() + self.T

    def adversary(self, M: float, *, equal_norms: bool = True) -> Case:
        """``equal_norms=True``: every key gets the needle key's norm, along coordinate axes
        orthogonal to ``u = e_1`` (exactly equal norms, exactly zero scores), so the norm screen
        learns nothing. ``equal_norms=False``: the plain zero-haystack needle (which it finds)."""
        i = self.T // 2
        zero = plant(self.T, self.d, i, 0, M, scale=self.scale)
        b = float(zero.k[0, 0, 0].double().norm())
        hay = torch.zeros(self.T, self.d, dtype=_ACC)
        if equal_norms:
            axes = 1 + torch.arange(self.T) % (self.d - 1)
            hay[torch.arange(self.T), axes] = b
        probes = self._mask(zero.q[0, 0], hay.to(zero.q.dtype))
        j = _pick_unseen(probes, i, self.name, self.T)
        case = plant(self.T, self.d, i, j, M, scale=self.scale, haystack_k=hay if equal_norms else None)
        case.info["equal_norms"] = equal_norms
        return case


ALGORITHMS: dict[str, type[Algorithm]] = {
    "sliding_window": SlidingWindow,
    "strided": Strided,
    "random_keys": RandomKeys,
    "indexer_topk": IndexerTopK,
    "lsh": LSHBuckets,
    "performer": Performer,
    "linformer": Linformer,
    "norm_screen": NormScreen,
}


def make(name: str, *, T: int, d: int = 16, seed: int = 0, **kwargs) -> Algorithm:
    """``ALGORITHMS[name](T=T, d=d, seed=seed, **kwargs)`` with a clear error for unknown names."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name](T=T, d=d, seed=seed, **kwargs)
