"""Chapter 5's exercises: SimHash codes, the amplified collision probability, ANNA's weights from
collision counts, and the many-table limit whose inverse temperature is the number of bits."""

from __future__ import annotations

import math

import torch

from attnlib.anna import (
    anna_collision_counts,
    anna_weights_from_counts,
    lsh_codes,
    simhash_collision_probability,
    table_collision_probability,
)

from ._checker import Case, Exercise, Freedom, Wrong, matches

f64 = torch.float64



def _angle(x, y):
    """The angle between the rows of ``x`` and ``y`` in float64, from the sine and the cosine (no arccos:
    exact at 0 and pi)."""
    x, y = x.to(f64), y.to(f64)
    x = x / x.norm(dim=-1, keepdim=True)
    y = y / y.norm(dim=-1, keepdim=True)
    cos = (x * y).sum(-1, keepdim=True)
    sin = (y - cos * x).norm(dim=-1)
    return torch.atan2(sin, cos[..., 0])


# --- 1. SimHash codes -----------------------------------------------------------------------------

def simhash_codes(x, proj):
    """SimHash keys of ``x [T, D]`` (float) under ``proj [l, D, z]`` (float64;
    ``proj[t, :, b]`` is the normal ``a_{t,b}``). Bit ``b`` of table ``t``'s key
    is ``[x . a_{t,b} > 0]``, worth ``2^b``. Return int64 ``[l, T]``, integers
    in ``[0, 2^z)``."""
    proj = proj.to(x.dtype)
    # [l, T, z]: one projection per bit
    dots = torch.einsum("td,ldz->ltz", x, proj)
    bits = (dots > 0).long()         # a dot product of exactly 0 is bit 0
    # bit b is worth 2^b (least significant first)
    place = 2 ** torch.arange(proj.shape[-1])
    return (bits * place).sum(-1)


def _codes_reversed(x, proj):
    z = proj.shape[-1]
    bits = (torch.einsum("td,ldz->ltz", x, proj.to(x.dtype)) > 0).long()
    return (bits * 2 ** torch.arange(z - 1, -1, -1)).sum(-1)


def _codes_variant(x, proj, *, test="gt", tables="all", pack="int", cast=True, squeeze=False):
    """The solution with one thing changed: the test on the dot product, the tables used, how the bits
    are packed, whether the normals are cast to ``x``'s dtype, a ``squeeze`` of the dot products."""
    if tables == "first":
        proj = proj[:1].expand_as(proj)               # table 0's normals for every table
    dots = torch.einsum("td,ldz->ltz", x, proj.to(x.dtype) if cast else proj)
    if squeeze:
        dots = dots.squeeze()
    bits = {"gt": dots > 0, "ge": dots >= 0, "lt": dots < 0}[test]
    if pack == "float32":                             # a float sum: exact only up to 2^24
        return (bits.float() * 2.0 ** torch.arange(proj.shape[-1], dtype=torch.float32)).sum(-1).long()
    return (bits.long() * 2 ** torch.arange(proj.shape[-1])).sum(-1)


# self-contained (no helper): the exercises page shows it as chapter 5's verdict example
def _codes_ge(x, proj):
    bits = (torch.einsum("td,ldz->ltz", x, proj.to(x.dtype)) >= 0).long()
    return (bits * 2 ** torch.arange(proj.shape[-1])).sum(-1)


def _codes_negative_side(x, proj):
    return _codes_variant(x, proj, test="lt")


def _codes_first_table(x, proj):
    return _codes_variant(x, proj, tables="first")


def _codes_float_sum(x, proj):
    return _codes_variant(x, proj, pack="float32")


def _codes_no_cast(x, proj):
    return _codes_variant(x, proj, cast=False)


def _codes_squeezed(x, proj):
    return _codes_variant(x, proj, squeeze=True)


def _codes_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def ints(*shape):
        return torch.randint(-2, 3, shape, generator=gen).to(f64)

    def c(label, x, proj, hint=""):
        expected = lsh_codes(x[None, None], proj, "simhash")[0, 0]
        return Case(label, (x, proj), expected, tol=0.0, hint=hint)

    x = randn(6, 5)
    zero = randn(4, 3)
    zero[2] = 0.0
    return [
        c("T = 9, D = 5, l = 3 tables of z = 6 bits", randn(9, 5), randn(3, 5, 6)),
        c("x in float32 (the normals float64), l = 2, z = 5", randn(6, 4).float(), randn(2, 4, 5),
          hint="x is float32 and the normals float64: cast the normals to x's dtype before the product"),
        c("x and -x (rows 3..5 are rows 0..2 negated), l = 2, z = 8",
          torch.cat([x[:3], -x[:3]]), randn(2, 5, 8)),
        c("z = 1 bit, one table", randn(7, 4), randn(1, 4, 1),
          hint="one table of one bit: the key is that bit, and the output is still [l, T] = [1, T]"),
        c("D = 1, l = 4, z = 3", randn(5, 1), randn(4, 1, 3)),
        c("integer x and hyperplanes: many x . a = 0 exactly", ints(8, 3), ints(3, 3, 5),
          hint="a dot product of exactly 0 is not > 0: that bit is 0"),
        c("a zero vector among the rows (row 2)", zero, randn(2, 3, 4),
          hint="a zero vector is on no hyperplane's positive side: all its bits are 0, its key is 0"),
        c("z = 30 bits (the library's maximum), l = 2", randn(5, 6), randn(2, 6, 30),
          hint="with 30 bits the keys reach 2^30 - 1, past the 2^24 up to which a float32 holds every "
               "integer: add the bits' values up in int64"),
    ]


def _reverse_bits(codes, z):
    c = torch.as_tensor(codes).long()
    bits = (c[..., None] >> torch.arange(z)) & 1
    return (bits * 2 ** torch.arange(z - 1, -1, -1)).sum(-1)


def _is_reversed(got, expected, case):
    z = case.args[1].shape[-1]
    return z > 1 and torch.equal(torch.as_tensor(got).long(), _reverse_bits(expected, z))


def _is_complement(got, expected, case):
    z = case.args[1].shape[-1]
    return torch.equal(torch.as_tensor(got).long(), (2 ** z - 1) - torch.as_tensor(expected).long())


def _exact_zero_dots(case):
    x, proj = case.args
    return bool((torch.einsum("td,ldz->ltz", x.to(f64), proj) == 0).any())


SIMHASH_CODES = Exercise(
    name="simhash codes",
    chapter="5",
    title="SimHash codes",
    statement=(
        "A SimHash table of $z$ bits keys a vector $x$ by $\\Psi(x)=(\\psi_1(x),\\dots,\\psi_z(x))$ with "
        "$\\psi_b(x)=[a_b\\cdot x>0]$ for Gaussian normals $a_b$. Pack each table's bits into one integer, "
        "bit $b$ worth $2^b$, so that two vectors share a bucket exactly when their integers are equal, "
        "and return the keys as int64. The key must be exactly the library's: it must survive dot "
        "products of exactly $0$ (integer inputs), a zero vector, $x$ in float32 with float64 normals, "
        "$z=1$, $D=1$ and $z=30$."),
    solution=simhash_codes,
    cases=_codes_cases,
    wrong=(Wrong(_codes_reversed, "reverse order"), Wrong(_codes_ge, "exactly 0 is not > 0"),
           Wrong(_codes_negative_side, "sign"), Wrong(_codes_first_table, "table t has its own normals"),
           Wrong(_codes_float_sum, "2^24"), Wrong(_codes_no_cast, "cast the normals"),
           Wrong(_codes_squeezed, "[1, t]")),
    diagnose=((_is_reversed, "your bits are packed in reverse order: bit b (hyperplane b) is worth 2^b, "
                             "the first hyperplane is the least significant bit"),
              (_is_complement, "every bit is flipped: bit b is 1 on the positive side, x . a_b > 0 (check "
                               "the sign)"),
              (matches(_codes_first_table), "every table's keys are table 0's: table t has its own normals, "
                                            "proj[t, :, b]")),
    freedoms=(
        Freedom("several tables (l > 1), each with its own normals", lambda c: c.args[1].shape[0] > 1),
        Freedom("one table of one bit (l = z = 1)", lambda c: c.args[1].shape[0] == c.args[1].shape[-1] == 1),
        Freedom("z = 30 bits: keys past 2^24", lambda c: c.args[1].shape[-1] > 24),
        Freedom("dot products of exactly 0 (integer inputs, a zero row)", _exact_zero_dots),
        Freedom("x in float32, the normals in float64", lambda c: c.args[0].dtype == torch.float32),
    ),
    out_dtype=torch.int64,
)


# --- 2. amplified collision probability -----------------------------------------------------------

def collision_probability(x, y, n_bits, n_tables):
    """Probability that rows ``x[n]``, ``y[n]`` (``[N, D]``, non-zero, float)
    share a bucket in at least one of ``n_tables`` SimHash tables of ``n_bits``
    bits each. Return float64 ``[N]``; parallel (probability 1) and antiparallel
    (0) rows included."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    # normalise: the angle, not the dot
    cos = (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1))
    # rounding can push |cos| past 1
    theta = torch.arccos(cos.clamp(-1.0, 1.0))
    # one bit: a random hyperplane separates
    p = 1.0 - theta / math.pi
    # z bits AND-ed, l tables OR-ed
    return 1.0 - (1.0 - p ** n_bits) ** n_tables


def _prob_variant(x, y, n_bits, n_tables, *, cos="normalised", clamp=(-1.0, 1.0), swap=False, dtype=f64):
    """The solution with one thing changed: how the cosine is formed (the raw dot product, or
    ``x . y / |x|^2``), its clamp, ``z`` and ``l`` swapped, or the answer's dtype."""
    x64, y64 = x.to(f64), y.to(f64)
    dot = (x64 * y64).sum(-1)
    c = {"normalised": dot / (x64.norm(dim=-1) * y64.norm(dim=-1)), "raw": dot,
         "x twice": dot / x64.square().sum(-1)}[cos]
    if clamp is not None:
        c = c.clamp(*clamp)
    p = 1.0 - torch.arccos(c) / math.pi
    z, l = (n_tables, n_bits) if swap else (n_bits, n_tables)
    return (1.0 - (1.0 - p ** z) ** l).to(dtype)


def _prob_unnormalised(x, y, n_bits, n_tables):
    return _prob_variant(x, y, n_bits, n_tables, cos="raw")


def _prob_x_norm_twice(x, y, n_bits, n_tables):
    return _prob_variant(x, y, n_bits, n_tables, cos="x twice")


def _prob_miss(x, y, n_bits, n_tables):
    return 1.0 - collision_probability(x, y, n_bits, n_tables)


def _prob_all_tables(x, y, n_bits, n_tables):
    p = 1.0 - collision_probability(x, y, 1, 1)
    return (1.0 - p) ** (n_bits * n_tables)


def _prob_swapped(x, y, n_bits, n_tables):
    return _prob_variant(x, y, n_bits, n_tables, swap=True)


def _prob_no_clamp(x, y, n_bits, n_tables):
    return _prob_variant(x, y, n_bits, n_tables, clamp=None)


def _prob_clamp_above(x, y, n_bits, n_tables):
    return _prob_variant(x, y, n_bits, n_tables, clamp=(None, 1.0))


def _prob_in_input_dtype(x, y, n_bits, n_tables):
    return _prob_variant(x, y, n_bits, n_tables, dtype=x.dtype)


def _prob_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    # every output is exactly 0 (antiparallel rows) or far above 1e-10 (random pairs in D >= 3 at
    # z <= 4, orthogonal ones at p^z = 2^-10): 1 - (1 - p^z)^l loses no digits that the tolerance sees
    def c(label, x, y, z, l, hint="", tol=1e-6):
        p = simhash_collision_probability(_angle(x, y))
        return Case(label, (x, y, z, l), table_collision_probability(p, z, l), tol=tol, hint=hint)

    # rows whose computed cosine with 3x lands above 1 (and so with -3x below -1): arccos of it is NaN
    x = randn(64, 5)
    naive = (x * 3 * x).sum(-1) / (x.norm(dim=-1) * (3 * x).norm(dim=-1))
    par = torch.cat([x[naive > 1][:4], x[naive <= 1][:2]])
    big = randn(5, 8)
    o1, o2 = torch.eye(4, dtype=f64)[:2]
    return [
        c("N = 8 random pairs in D = 6, z = 4 bits, l = 8 tables", randn(8, 6), randn(8, 6), 4, 8),
        c("z = 1, l = 1: one bit, 1 - theta / pi", randn(6, 3), randn(6, 3), 1, 1,
          hint="a random hyperplane separates two vectors at angle theta with probability theta / pi"),
        c("rows scaled by 100 and 0.01, z = 3, l = 5", 100 * big, 0.01 * randn(5, 8), 3, 5,
          hint="the angle comes from the normalised dot product: cos theta = x . y / (|x| |y|)"),
        c("x, y in float32, z = 2, l = 3 (the answer float64)", randn(5, 4).float(), randn(5, 4).float(), 2, 3),
        c("parallel rows, y = 3x: theta = 0, probability 1", par, 3 * par, 6, 4, tol=1e-5,
          hint="rounding puts x . y / (|x| |y|) just above 1 and arccos gives NaN: clamp it to [-1, 1]"),
        c("antiparallel rows, y = -3x: theta = pi, probability 0", par, -3 * par, 2, 16, tol=1e-5,
          hint="rounding puts the cosine just below -1: clamp it from below too; at theta = pi no table "
               "collides"),
        c("orthogonal rows: p = 1/2, z = 10, l = 64", torch.stack([o1, 2 * o2]), torch.stack([3 * o2, o1]), 10, 64,
          hint="p = 1/2 per bit: 1 - (1 - 2^-10)^64"),
    ]


def _not_unit(t):
    return bool((t.to(f64).norm(dim=-1) - 1).abs().max() > 1e-3)


COLLISION_PROBABILITY = Exercise(
    name="simhash collision probability",
    chapter="5",
    title="Amplification: AND within a table, OR across tables",
    statement=(
        "One SimHash bit puts two vectors at angle $\\theta$ in the same bucket with probability "
        "$p=1-\\theta/\\pi$ (the chapter's exercise 1). A table concatenates $z$ bits, so a pair collides "
        "in it with probability $p^z$; $l$ independent tables catch it at least once with probability "
        "$1-(1-p^z)^l$. Compute that probability for each pair of rows, in float64 whatever the inputs' "
        "dtype, for vectors of any length, parallel and antiparallel rows included. (No input makes "
        "$p^z$ so small that $1-(1-p^z)^l$ cancels: the plain formula is accurate on every one.)"),
    solution=collision_probability,
    imports="import math\n\nimport torch",
    cases=_prob_cases,
    wrong=(Wrong(_prob_unnormalised, "normalised dot product"), Wrong(_prob_miss, "miss"),
           Wrong(_prob_all_tables, "at least one"), Wrong(_prob_no_clamp, "clamp"),
           Wrong(_prob_x_norm_twice, "|x| |y|"), Wrong(_prob_swapped, "swapped"),
           Wrong(_prob_clamp_above, "from below"), Wrong(_prob_in_input_dtype, "expected dtype float64")),
    diagnose=((matches(_prob_unnormalised), "you took arccos of the raw dot product x . y: the angle needs the "
                                            "normalised dot product, cos theta = x . y / (|x| |y|)"),
              (matches(_prob_x_norm_twice), "you divided x . y by |x|^2: x and y have different lengths, "
                                            "cos theta = x . y / (|x| |y|)"),
              (matches(_prob_swapped), "that is 1 - (1 - p^l)^z: z and l are swapped (z bits AND-ed within "
                                       "a table, l tables OR-ed)"),
              (matches(_prob_miss), "that is the probability that every table misses, (1 - p^z)^l: "
                                    "the pair is caught with 1 minus it"),
              (matches(_prob_all_tables), "that is the probability of colliding in every table, p^(z l): "
                                          "the tables are OR-ed, so the pair needs at least one")),
    freedoms=(
        Freedom("rows of any length (not unit vectors)", lambda c: _not_unit(c.args[0]) or _not_unit(c.args[1])),
        Freedom("x and y of different lengths",
                lambda c: bool((c.args[0].norm(dim=-1) - c.args[1].norm(dim=-1)).abs().max() > 1e-3)),
        Freedom("z ≠ l", lambda c: c.args[2] != c.args[3]),
        Freedom("parallel rows (theta = 0)", lambda c: bool((_angle(c.args[0], c.args[1]) < 1e-6).any())),
        Freedom("antiparallel rows (theta = pi)",
                lambda c: bool((_angle(c.args[0], c.args[1]) > math.pi - 1e-6).any())),
        Freedom("x, y in float32 (the answer float64)", lambda c: c.args[0].dtype == torch.float32),
    ),
    out_dtype=f64,
)


# --- 3. ANNA's weights from collision counts ------------------------------------------------------

def anna_weights(q_codes, k_codes, causal):
    """ANNA's weights from table keys ``q_codes [l, Tq]``, ``k_codes [l, Tk]``
    (int64). ``n_ij`` = number of tables t with
    ``q_codes[t, i] == k_codes[t, j]`` (causal: ``j <= i`` only);
    ``P_ij = n_ij / sum_j' n_ij'``; a query that collides with nothing gets a
    zero row. Return float64 ``[Tq, Tk]``."""
    # count every table
    m = (q_codes[:, :, None] == k_codes[:, None, :]).sum(0).to(torch.float64)
    if causal:
        # query i sees keys j <= i, itself included
        m = m.tril()
    total = m.sum(-1, keepdim=True)
    return m / total.clamp_min(1.0)       # an empty row stays 0, not 0 / 0


def _weights_variant(q_codes, k_codes, causal, *, counts=True, mask="causal", empty="zero", tables="all"):
    """The solution with one thing changed: the set of colliding keys instead of the counts, the mask
    (strict, always on, never on), NaN rows for a query that collides with nothing, table 0 only."""
    if tables == "first":
        q_codes, k_codes = q_codes[:1], k_codes[:1]
    m = (q_codes[:, :, None] == k_codes[:, None, :]).sum(0)
    m = (m if counts else (m > 0)).to(f64)
    if mask == "always" or (causal and mask != "never"):
        m = m.tril(-1 if mask == "strict" else 0)
    total = m.sum(-1, keepdim=True)
    return m / (total if empty == "nan" else total.clamp_min(1.0))


def _weights_set(q_codes, k_codes, causal):
    return _weights_variant(q_codes, k_codes, causal, counts=False)


def _weights_nan_rows(q_codes, k_codes, causal):
    return _weights_variant(q_codes, k_codes, causal, empty="nan")


def _weights_strict(q_codes, k_codes, causal):
    return _weights_variant(q_codes, k_codes, causal, mask="strict")


def _weights_always_causal(q_codes, k_codes, causal):
    return _weights_variant(q_codes, k_codes, causal, mask="always")


def _weights_never_causal(q_codes, k_codes, causal):
    return _weights_variant(q_codes, k_codes, causal, mask="never")


def _weights_first_table(q_codes, k_codes, causal):
    return _weights_variant(q_codes, k_codes, causal, tables="first")


def _nan_where_empty(got, expected, case):
    g, e = torch.as_tensor(got, dtype=f64), torch.as_tensor(expected, dtype=f64)
    empty = e.sum(-1) == 0
    return bool(empty.any()) and bool(g[empty].isnan().all()) and not bool(g[~empty].isnan().any())


def _counts(case):
    qc, kc, causal = case.args
    return anna_collision_counts(qc[None, None], kc[None, None], causal=causal)[0, 0]


def _weights_cases(gen):
    def codes(l, T, n):
        return torch.randint(0, n, (l, T), generator=gen)

    def c(label, qc, kc, causal, hint=""):
        m = anna_collision_counts(qc[None, None], kc[None, None], causal=causal)
        return Case(label, (qc, kc, causal), anna_weights_from_counts(m)[0, 0], hint=hint)

    same = codes(3, 8, 4)
    lonely_q = codes(2, 6, 3)
    lonely_q[:, 4] = 7                                    # no key has code 7 in any table
    repeat_q = torch.tensor([[0, 1, 0], [0, 1, 1], [0, 0, 0]])
    repeat_k = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0], [0, 2, 2, 0]])
    return [
        c("l = 4 tables, Tq = 5, Tk = 7, keys in 0..3, not causal", codes(4, 5, 4), codes(4, 7, 4), False),
        c("causal, T = 8, l = 3", same, codes(3, 8, 4), True,
          hint="causal: query i sees keys j <= i, itself included: zero the counts above the diagonal"),
        c("queries and keys equal (q = k), causal, T = 8", same, same, True,
          hint="q = k: the diagonal always collides, and query i sees keys j <= i, itself included"),
        c("a key colliding in 1, 2 or 3 tables counts that many times", repeat_q, repeat_k, False,
          hint="a key counts once per table it collides in: weights are counts n_ij, not the set {n_ij > 0}"),
        c("query 4 collides with nothing (not causal)", lonely_q, codes(2, 6, 3), False,
          hint="a query that collides with nothing gets a zero row (0 / 0 is NaN: divide by max(sum, 1))"),
        c("query 0 collides with nothing, causal, l = 1", torch.tensor([[5, 1, 2, 1]]),
          torch.tensor([[1, 1, 2, 3]]), True,
          hint="a query that collides with nothing gets a zero row (0 / 0 is NaN: divide by max(sum, 1))"),
        c("T = 1, one table", torch.tensor([[3]]), torch.tensor([[3]]), True),
    ]


ANNA_WEIGHTS = Exercise(
    name="anna weights",
    chapter="5",
    title="ANNA's weights from collision counts",
    statement=(
        "With $l$ tables, ANNA's LSH implementation gives query $i$ the weights "
        "$P_{ij}=n_{ij}/\\sum_{j'}n_{ij'}$, where $n_{ij}$ is the number of tables in which $q_i$ and "
        "$k_j$ share a bucket: a key that collides in several tables counts that many times. Build $P$ "
        "(float64) from the tables' keys, causally or not (not causal: $T_q$ and $T_k$ may differ). A "
        "query that collides with nothing gets a zero row, not NaN: ANNA's plan is partial."),
    solution=anna_weights,
    cases=_weights_cases,
    wrong=(Wrong(_weights_set, "counts"), Wrong(_weights_nan_rows, "zero row"),
           Wrong(_weights_strict, "itself included"), Wrong(_weights_always_causal, "only when causal"),
           Wrong(_weights_never_causal, "zero the counts above the diagonal"),
           Wrong(_weights_first_table, "every table")),
    diagnose=((matches(_weights_set), "that is uniform over the set of keys that collide somewhere (the "
                                      "chapter's exercise 4): ANNA counts a key once per table it collides in"),
              (matches(_weights_strict), "your mask hides the diagonal: query i sees keys j <= i, itself "
                                         "included"),
              (matches(_weights_always_causal), "you applied the causal mask to a call with causal=False: "
                                                "mask only when causal, every key is visible otherwise"),
              (matches(_weights_first_table), "you counted table 0 only: n_ij counts every table in which "
                                              "q_i and k_j share a bucket"),
              (_nan_where_empty, "your NaN rows are queries that collide with nothing: such a query gets "
                                 "a zero row, not 0 / 0 (divide by max(sum, 1))")),
    freedoms=(
        Freedom("not causal, with Tq ≠ Tk", lambda c: not c.args[2] and c.args[0].shape[1] != c.args[1].shape[1]),
        Freedom("causal", lambda c: bool(c.args[2])),
        Freedom("l > 1 tables", lambda c: c.args[0].shape[0] > 1),
        Freedom("a key colliding in several tables", lambda c: bool((_counts(c) > 1).any())),
        Freedom("a query that collides with nothing", lambda c: bool((_counts(c).sum(-1) == 0).any())),
    ),
    out_dtype=f64,
)


# --- 4. the many-table limit: bits are an inverse temperature --------------------------------------

def anna_limit_weights(q, k, n_bits):
    """ANNA's weights as the number of tables grows: ``q [Tq, D]``,
    ``k [Tk, D]`` (non-zero, float), ``n_bits = z``. ``P_ij`` is proportional to
    ``p_ij^z``, ``p_ij = 1 - theta_ij / pi``; a query no key can collide with
    (every ``p_ij = 0``) gets a zero row. Return float64 ``[Tq, Tk]``."""
    q = q.to(torch.float64)
    k = k.to(torch.float64)
    q = q / q.norm(dim=-1, keepdim=True)
    k = k / k.norm(dim=-1, keepdim=True)
    theta = torch.arccos((q @ k.T).clamp(-1.0, 1.0))
    p = (1.0 - theta / math.pi).clamp_min(0.0)
    # softmax of z log p: z is the inverse temperature; p^z itself underflows
    # for large z
    # -inf where p = 0 (an antiparallel key)
    logits = n_bits * torch.log(p)
    top = logits.amax(-1, keepdim=True)
    empty = top == float("-inf")      # no key can collide with this query
    e = torch.exp(logits - torch.where(empty, 0.0, top))
    return e / torch.where(empty, 1.0, e.sum(-1, keepdim=True))


def _limit_variant(q, k, n_bits, *, normalise=True, clamp=True, power=1.0, form="log", dtype=None):
    """The solution with one thing changed: no normalisation, no clamp of the cosine, the power of p
    (1 instead of z), p^z formed in the inputs' dtype, a plain softmax of z log p (NaN on an all -inf
    row), or the answer in the inputs' dtype."""
    acc = q.dtype if form == "power" else f64
    qa, ka = q.to(acc), k.to(acc)
    if normalise:
        qa = qa / qa.norm(dim=-1, keepdim=True)
        ka = ka / ka.norm(dim=-1, keepdim=True)
    cos = qa @ ka.T
    p = (1.0 - torch.arccos(cos.clamp(-1.0, 1.0) if clamp else cos) / math.pi).clamp_min(0.0)
    z = n_bits * power
    if form == "power":
        pz = p ** z
        w = (pz / pz.sum(-1, keepdim=True).clamp_min(1e-300)).to(f64)
    elif form == "softmax":
        w = torch.softmax(z * torch.log(p), dim=-1)
    else:
        logits = z * torch.log(p)
        top = logits.amax(-1, keepdim=True)
        empty = top == float("-inf")
        e = torch.exp(logits - torch.where(empty, 0.0, top))
        w = e / torch.where(empty, 1.0, e.sum(-1, keepdim=True))
    return w.to(dtype or f64)


def _limit_linear(q, k, n_bits):
    return _limit_variant(q, k, n_bits, power=1.0 / n_bits)


def _limit_power(q, k, n_bits):
    return _limit_variant(q, k, n_bits, form="power")


def _limit_softmax(q, k, n_bits):
    return _limit_variant(q, k, n_bits, form="softmax")


def _limit_unnormalised(q, k, n_bits):
    return _limit_variant(q, k, n_bits, normalise=False)


def _limit_no_clamp(q, k, n_bits):
    return _limit_variant(q, k, n_bits, clamp=False)


def _limit_in_input_dtype(q, k, n_bits):
    return _limit_variant(q, k, n_bits, dtype=q.dtype)


def _limit_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    # arccos near theta = 0 keeps only sqrt(eps) of the angle: an answer computed in float32 is 1e-4 off
    # there, and right; the wrong answers are off by far more.
    def c(label, q, k, z, hint="", tol=1e-4):
        pz = simhash_collision_probability(_angle(q[:, None, :], k[None, :, :]), z)
        w = pz / pz.sum(-1, keepdim=True).clamp_min(1e-300)
        return Case(label, (q, k, z), w, tol=tol, hint=hint)

    # queries whose normalised self-dot product rounds above 1 (by a matmul and by a sum): arccos of it
    # is NaN, so the parallel key 2q (scaled exactly) needs the clamp
    pool = randn(64, 6)
    unit = pool / pool.norm(dim=-1, keepdim=True)
    above = ((unit @ unit.T).diagonal() > 1).to(torch.int64) + ((unit * unit).sum(-1) > 1).to(torch.int64)
    q = pool[torch.sort(above, descending=True, stable=True).indices[:4]]
    # six keys between 175 and 177 degrees from q_0: p <= 5/180, so p^30 < 3e-47 underflows in float32
    q0 = q[0] / q[0].norm()
    side = randn(6, 6)
    side = side - (side @ q0)[:, None] * q0
    side = side / side.norm(dim=-1, keepdim=True)
    angle = math.radians(175.0) + math.radians(2.0) * torch.rand(6, 1, generator=gen, dtype=f64)
    far = (angle.cos() * q0 + angle.sin() * side) * (0.5 + torch.rand(6, 1, generator=gen, dtype=f64))
    opp = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], dtype=f64)
    opp_k = torch.tensor([[-3.0, 0.0, 0.0], [-1.0, 0.0, 0.0]], dtype=f64)
    return [
        c("Tq = 5, Tk = 7, D = 8, z = 4", randn(5, 8), randn(7, 8), 4),
        c("z = 1: weights proportional to 1 - theta / pi", randn(3, 4), randn(6, 4), 1),
        c("q, k in float32, z = 3 (the answer float64)", randn(3, 5, dtype=torch.float32),
          randn(4, 5, dtype=torch.float32), 3),
        c("queries scaled by 0.01, keys by 100, z = 12", 0.01 * randn(4, 5), 100 * randn(9, 5), 12,
          hint="the angle comes from the normalised dot product: cos theta = q . k / (|q| |k|)"),
        c("each query has a parallel key 2q (theta = 0), z = 8", q, torch.cat([2 * q, randn(3, 6)]), 8,
          tol=1e-3,
          hint="rounding puts the cosine just past 1 and arccos gives NaN: clamp it to [-1, 1]"),
        c("query 0's only keys are antiparallel to it (-3 q_0, -q_0)", opp, opp_k, 3,
          hint="an antiparallel key has p = 0; a query whose keys all have p = 0 gets a zero row, not NaN"),
        c("keys 175-177 degrees away, z = 30, float32: p^z underflows",
          q[0:1].float(), far.float(), 30, tol=1e-3,
          hint="p^30 is below 3e-47, under float32's smallest number: compute z log p and subtract the row's "
               "largest (softmax at inverse temperature z)"),
    ]


def _angles_qk(case):
    q, k = case.args[0].to(f64), case.args[1].to(f64)
    return _angle(q[:, None, :], k[None, :, :])


LIMIT_WEIGHTS = Exercise(
    name="anna many-table limit",
    chapter="5",
    title="The many-table limit: the bits are an inverse temperature",
    statement=(
        "As $l\\to\\infty$, $n_{ij}/l\\to p(\\theta_{ij})^z$, so ANNA's weights tend to "
        "$p_{ij}^z/\\sum_{j'}p_{ij'}^z=\\mathrm{softmax}_j\\big(z\\log(1-\\theta_{ij}/\\pi)\\big)$: the "
        "one-sided entropic plan of the cost $-\\log(1-\\theta/\\pi)$ at temperature $1/z$ (for small "
        "angles $p^z\\approx e^{-z\\theta/\\pi}$). Compute it in float64, whatever the inputs' dtype, for "
        "queries and keys of any length (the chapter's are unit vectors; these are not), a key parallel "
        "to its query, a query whose only keys are antiparallel (a zero row, as ANNA's empty row) and "
        "$z=30$ on keys about $176°$ away in float32, where $p^z$ underflows. An answer computed in "
        "float32 passes: the tolerance is $10^{-4}$ ($10^{-3}$ where $\\theta$ is near $0$ or $z=30$)."),
    solution=anna_limit_weights,
    imports="import math\n\nimport torch",
    cases=_limit_cases,
    wrong=(Wrong(_limit_linear, "inverse temperature"), Wrong(_limit_power, "underflow"),
           Wrong(_limit_softmax, "zero row"), Wrong(_limit_unnormalised, "|q| |k|"),
           Wrong(_limit_no_clamp, "clamp"), Wrong(_limit_in_input_dtype, "expected dtype float64")),
    diagnose=((matches(_limit_linear), "your weights are proportional to p, not p^z: the z bits of a table "
                                       "are AND-ed, so z is the inverse temperature (softmax of z log p)"),
              (matches(_limit_unnormalised), "you took arccos of the raw dot product q . k: the angle needs the "
                                             "normalised one, cos theta = q . k / (|q| |k|)")),
    freedoms=(
        Freedom("queries and keys of any length (not unit vectors)",
                lambda c: _not_unit(c.args[0]) and _not_unit(c.args[1])),
        Freedom("z > 1", lambda c: c.args[2] > 1),
        Freedom("a key parallel to its query (theta = 0)", lambda c: bool((_angles_qk(c) < 1e-6).any())),
        Freedom("a query whose keys are all antiparallel (a zero row)",
                lambda c: bool((_angles_qk(c) > math.pi - 1e-6).all(-1).any())),
        Freedom("z = 30 in float32, where p^z underflows",
                lambda c: c.args[0].dtype == torch.float32 and c.args[2] >= 30),
        Freedom("q, k in float32 (the answer float64)", lambda c: c.args[0].dtype == torch.float32),
    ),
    out_dtype=f64,
)


EXERCISES = (SIMHASH_CODES, COLLISION_PROBABILITY, ANNA_WEIGHTS, LIMIT_WEIGHTS)
