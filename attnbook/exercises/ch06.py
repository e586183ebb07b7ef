"""Chapter 6's exercises: Plücker coordinates, the Plücker relations, principal angles between two
planes, and the causal Grassmann layer's mixing signal averaged over its offsets."""

from __future__ import annotations

import math

import torch

from attnlib.grassmann import plucker, plucker_projection_reference, plucker_relations

from ._checker import Case, Exercise, Freedom, Wrong, agree, matches

f64 = torch.float64



def _negated(got, expected, case) -> bool:
    e = torch.as_tensor(expected)
    return bool(e.abs().max() > 0) and agree(got, -e, 1e-4)


# --- 1. Plücker coordinates -----------------------------------------------------------------------

def plucker_coordinates(u, w):
    """Plücker coordinates of span(u, w): ``u, w [..., r]`` (same shape and
    dtype, ``r >= 2``). ``p_ij = u_i w_j - u_j w_i`` for ``i < j``, columns in
    lexicographic order (0,1), (0,2), ..., (r-2, r-1). Return
    ``[..., r (r - 1) / 2]`` in u's dtype (compute 16-bit inputs in float32)."""
    r = u.shape[-1]
    # row-major above the diagonal: lexicographic (i, j)
    i, j = torch.triu_indices(r, r, offset=1)
    acc = (torch.float32 if u.dtype in (torch.float16, torch.bfloat16)
           else u.dtype)
    # float16 products overflow at |u_i w_j| > 65504
    uf, wf = u.to(acc), w.to(acc)
    return (uf[..., i] * wf[..., j] - uf[..., j] * wf[..., i]).to(u.dtype)


def _pl_variant(u, w, *, order="lex", diagonal=False, acc="float32 for 16-bit", out="input", batch="any"):
    """The solution with one thing changed: the columns ordered by j (then i), the diagonal i = j
    included, the products widened for float16 only (not bfloat16), the answer left in float32, or the
    batch read as one leading dimension."""
    r = u.shape[-1]
    pairs = [(i, j) for i in range(r) for j in range(i + (0 if diagonal else 1), r)]
    if order == "by column":
        pairs.sort(key=lambda ij: (ij[1], ij[0]))
    i, j = (torch.tensor(x) for x in zip(*pairs))
    if acc == "float32 for float16":
        uf, wf = (u.float(), w.float()) if u.dtype == torch.float16 else (u, w)
    else:
        uf, wf = (u.float(), w.float()) if u.dtype in (torch.float16, torch.bfloat16) else (u, w)
    if out == "float32":
        uf, wf = u.float(), w.float()
    if batch == "one":                                # u[:, i]: a [N, r] batch, nothing else
        p = uf[:, i] * wf[:, j] - uf[:, j] * wf[:, i]
    else:
        p = uf[..., i] * wf[..., j] - uf[..., j] * wf[..., i]
    return p if out == "float32" else p.to(u.dtype)


def _pl_by_column(u, w):
    return _pl_variant(u, w, order="by column")


def _pl_sign(u, w):
    return -plucker_coordinates(u, w)


def _pl_diagonal(u, w):
    return _pl_variant(u, w, diagonal=True)


# self-contained (no helper): the exercises page shows it as chapter 6's verdict example
def _pl_fp16(u, w):
    i, j = torch.triu_indices(u.shape[-1], u.shape[-1], offset=1)
    return u[..., i] * w[..., j] - u[..., j] * w[..., i]


def _pl_float16_only(u, w):
    return _pl_variant(u, w, acc="float32 for float16")


def _pl_float32_out(u, w):
    return _pl_variant(u, w, out="float32")


def _pl_one_batch_dim(u, w):
    return _pl_variant(u, w, batch="one")


def _plucker_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    def c(label, u, w, hint=""):
        return Case(label, (u, w), plucker(u, w), hint=hint)

    u4, u3 = randn(4), randn(6, 3)
    big = 300 * randn(2, 6)
    near = randn(4, 6)
    return [
        c("a batch of 3 pairs in r = 5", randn(3, 5), randn(3, 5)),
        c("r = 2: one coordinate, the determinant u_0 w_1 - u_1 w_0", randn(2), randn(2)),
        c("r = 3: the cross product, reordered and with a sign", u3, randn(6, 3)),
        c("w = -2u in r = 4 (parallel: p = 0)", u4, -2 * u4,
          hint="parallel vectors span no plane: every coordinate is 0"),
        c("r = 7, a batch of 2 x 2 pairs", randn(2, 2, 7), randn(2, 2, 7)),
        c("float16 entries of 300, w = u + N(0, 1): products pass 65504",
          big.to(torch.float16), (big + randn(2, 6)).to(torch.float16),
          hint="u_i w_j is about 9e4, past float16's 65504: form the products in float32, then cast back"),
        c("bfloat16, w = u + N(0, 0.003^2): p is a small difference of products",
          near.to(torch.bfloat16), (near + 0.003 * randn(4, 6)).to(torch.bfloat16),
          hint="w is nearly u: p_ij is a difference of products hundreds of times its size, and bfloat16 keeps 3 "
               "digits of each; form the products in float32 (bfloat16 too is 16-bit), then cast back"),
    ]


def _with_diagonal(got, expected, case) -> bool:
    r = case.args[0].shape[-1]
    return torch.as_tensor(got).shape[-1] == r * (r + 1) // 2


def _reordered(got, expected, case) -> bool:
    g, e = torch.as_tensor(got, dtype=f64), torch.as_tensor(expected, dtype=f64)
    return g.shape == e.shape and agree(g.sort(-1).values, e.sort(-1).values) and not agree(g, e)


PLUCKER = Exercise(
    name="plucker coordinates",
    chapter="6",
    title="Plücker coordinates of a pair",
    statement=(
        "Two vectors $u, w\\in\\mathbb R^{D_y}$ span a plane; its Plücker coordinates are the entries "
        "above the diagonal of $uw^\\top-wu^\\top$, $\\omega_{ij}=u_iw_j-u_jw_i$ for $i<j$, in lexicographic "
        "order $(0,1),(0,2),\\dots,(D_y-2,D_y-1)$ (the code's `p` and `r` are $\\omega$ and $D_y$). Compute "
        "them in the inputs' dtype for any batch shape (none, one or two dimensions), for $D_y=2$ and "
        "$D_y=3$ (the cross product, up to order and sign), for parallel vectors, in float16 where the "
        "products $u_iw_j$ exceed its range although $\\omega$ does not, and in bfloat16 for nearly "
        "parallel vectors, where $\\omega$ is a small difference of large products."),
    solution=plucker_coordinates,
    cases=_plucker_cases,
    wrong=(Wrong(_pl_by_column, "lexicographic"), Wrong(_pl_sign, "sign"), Wrong(_pl_diagonal, "diagonal"),
           Wrong(_pl_fp16, "float32"), Wrong(_pl_float16_only, "bfloat16 too"),
           Wrong(_pl_float32_out, "expected dtype float64"), Wrong(_pl_one_batch_dim, "raised indexerror")),
    diagnose=((_with_diagonal, "you included the diagonal i = j (where p_ii = 0): take i < j only, "
                               "r (r - 1) / 2 coordinates"),
              (_negated, "every coordinate has the wrong sign: p_ij = u_i w_j - u_j w_i, i < j (you computed "
                         "p(w, u) = -p(u, w))"),
              (_reordered, "right values, wrong places: the columns go in lexicographic order of (i, j), "
                           "(0,1), (0,2), ..., (0,r-1), (1,2), ... (row by row above the diagonal)")),
    freedoms=(
        Freedom("no batch dimension, and two", lambda c: c.args[0].dim() != 2),
        Freedom("r ≥ 4, where ordering by j is not lexicographic", lambda c: c.args[0].shape[-1] >= 4),
        Freedom("r = 2 and r = 3", lambda c: c.args[0].shape[-1] <= 3),
        Freedom("float16, where the products pass 65504", lambda c: c.args[0].dtype == torch.float16
                and bool((c.args[0].float().abs().amax(-1) * c.args[1].float().abs().amax(-1) > 65504).any())),
        Freedom("bfloat16, nearly parallel vectors", lambda c: c.args[0].dtype == torch.bfloat16),
        Freedom("float64 (the answer in u's dtype)", lambda c: c.args[0].dtype == f64),
    ),
    out_dtype="input",
)


# --- 2. the Plücker relations ---------------------------------------------------------------------

def plucker_residuals(p, r):
    """Plücker residuals ``p_ij p_kl - p_ik p_jl + p_il p_jk``, one per
    ``i < j < k < l`` (quadruples in lexicographic order):
    ``p [..., r (r - 1) / 2]``, columns in lexicographic (i, j) order,
    ``r >= 2``. Return ``[..., C(r, 4)]`` in p's dtype (an empty last dim for
    r < 4)."""
    col = {}
    # the column of p_ij, i < j, in lexicographic order
    for i in range(r):
        for j in range(i + 1, r):
            col[i, j] = len(col)
    out = []
    for i in range(r):
        for j in range(i + 1, r):
            for k in range(j + 1, r):
                for l in range(k + 1, r):
                    out.append(p[..., col[i, j]] * p[..., col[k, l]]
                               - p[..., col[i, k]] * p[..., col[j, l]]
                               + p[..., col[i, l]] * p[..., col[j, k]])
    if not out:        # r < 4: no relation, every 2-vector is a plane
        return p.new_zeros(*p.shape[:-1], 0)
    return torch.stack(out, dim=-1)


def _quads(r):
    return [(i, j, k, l) for i in range(r) for j in range(i + 1, r) for k in range(j + 1, r) for l in range(k + 1, r)]


def _rel_variant(p, r, *, middle=-1.0, pairs="lex", quads="lex", empty=True, batch="any", dtype=None):
    """The solution with one thing changed: the middle term's sign, the coordinates read as if ordered
    by j (then i), the quadruples ordered by l, k, j, i, no special case for r < 4 (stacking nothing
    raises), the batch read as one leading dimension, or the answer in another dtype."""
    order = [(i, j) for i in range(r) for j in range(i + 1, r)]
    if pairs == "by column":
        order.sort(key=lambda ij: (ij[1], ij[0]))
    col = {ij: n for n, ij in enumerate(order)}
    qs = _quads(r)
    if quads == "colex":
        qs.sort(key=lambda q: q[::-1])
    if not qs and empty:
        return p.new_zeros(*p.shape[:-1], 0).to(dtype or p.dtype)
    x = p.to(dtype or p.dtype)
    P = (lambda a, b: x[:, col[a, b]]) if batch == "one" else (lambda a, b: x[..., col[a, b]])
    return torch.stack([P(i, j) * P(k, l) + middle * P(i, k) * P(j, l) + P(i, l) * P(j, k)
                        for i, j, k, l in qs], dim=-1)


def _rel_plus(p, r):
    return _rel_variant(p, r, middle=1.0)


def _rel_by_column(p, r):
    """The coordinates read as if they were ordered by j, then i."""
    return _rel_variant(p, r, pairs="by column")


def _rel_stack(p, r):
    """Forgets that r < 4 has no relation: stacking an empty list raises."""
    return _rel_variant(p, r, empty=False)


def _rel_colex(p, r):
    """The quadruples ordered by l, then k, j, i: the lexicographic order up to r = 5, not beyond."""
    return _rel_variant(p, r, quads="colex")


def _rel_one_batch_dim(p, r):
    return _rel_variant(p, r, batch="one")


def _rel_float64(p, r):
    return _rel_variant(p, r, dtype=f64)


def _relations_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def ints(*shape):
        return torch.randint(-3, 4, shape, generator=gen).to(f64)

    def c(label, p, r, hint=""):
        return Case(label, (p, r), plucker_relations(p, r), hint=hint)

    e = torch.eye(4, dtype=f64)
    two_planes = plucker(e[0], e[1]) + plucker(e[2], e[3])
    u, w = ints(3, 6), ints(3, 6)
    return [
        c("a random 2-vector in r = 5 (not a plane)", randn(5 * 4 // 2), 5),
        c("a batch of 2 random 2-vectors in r = 6", randn(2, 6 * 5 // 2), 6),
        c("a batch of 3 planes from integer vectors in r = 6: all residuals 0", plucker(u, w), 6,
          hint="p = u ^ w is a plane: every relation vanishes exactly on it, so a non-zero residual here "
               "is a wrong sign (+ - +) or a wrong column for p_ij"),
        c("e0 ^ e1 + e2 ^ e3 in r = 4: a sum of two planes, residual 1", two_planes, 4,
          hint="r = 4 has one relation, p_01 p_23 - p_02 p_13 + p_03 p_12"),
        c("a batch of 2 x 4 random 2-vectors in r = 4", randn(2, 4, 6), 4),
        c("a batch of 3 random 2-vectors in r = 7, float32", randn(3, 7 * 6 // 2).float(), 7),
        c("r = 3: no relation (every 2-vector in R^3 is a plane)", randn(5, 3), 3,
          hint="for r < 4 there is no quadruple: return shape [..., 0]"),
        c("r = 2: no relation (one coordinate)", randn(4, 1), 2,
          hint="for r < 4 there is no quadruple: return shape [..., 0]"),
    ]


PLUCKER_RELATIONS = Exercise(
    name="plucker relations",
    chapter="6",
    title="Which 2-vectors are planes: the Plücker relations",
    statement=(
        "Not every vector of $\\mathbb R^{\\binom{D_y}2}$ is the Plücker vector of a plane. The "
        "decomposable ones, $\\omega=u\\wedge w$, are cut out by "
        "$\\omega_{ij}\\omega_{kl}-\\omega_{ik}\\omega_{jl}+\\omega_{il}\\omega_{jk}=0$ for every $i<j<k<l$ "
        "(for $D_y=4$ a single equation: the chapter's exercise 1). Return every residual, quadruples in "
        "lexicographic order, in $\\omega$'s dtype (the code's `p` and `r` are $\\omega$ and $D_y$): "
        "exactly zero on planes made from integer vectors, non-zero on a random vector or a sum of two "
        "planes, for any batch shape, and an empty last dimension for $D_y<4$."),
    solution=plucker_residuals,
    cases=_relations_cases,
    wrong=(Wrong(_rel_plus, "middle term"), Wrong(_rel_by_column, "lexicographic"), Wrong(_rel_stack, "[..., 0]"),
           Wrong(_rel_colex, "quadruples"), Wrong(_rel_one_batch_dim, "raised indexerror"),
           Wrong(_rel_float64, "expected dtype float32")),
    diagnose=((matches(_rel_plus), "the middle term has the wrong sign: p_ij p_kl - p_ik p_jl + p_il p_jk"),
              (matches(_rel_by_column), "you read p_ij from the wrong column: the coordinates are in "
                                        "lexicographic order (0,1), (0,2), ..., (0,r-1), (1,2), ..., "
                                        "not ordered by j"),
              (matches(_rel_colex), "right residuals, wrong places: the quadruples i < j < k < l go in "
                                    "lexicographic order (0,1,2,3), (0,1,2,4), ..., not ordered by l")),
    freedoms=(
        Freedom("r ≥ 6 on 2-vectors that are not planes (the quadruples' order shows)",
                lambda c: c.args[1] >= 6 and bool(plucker_relations(*c.args).ne(0).any())),
        Freedom("r < 4: no relation", lambda c: c.args[1] < 4),
        Freedom("no batch dimension, and two", lambda c: c.args[0].dim() != 2),
        Freedom("float32 (the answer in p's dtype)", lambda c: c.args[0].dtype == torch.float32),
    ),
    out_dtype="input",
)


# --- 3. principal angles --------------------------------------------------------------------------

def principal_angles(u1, w1, u2, w2):
    """Principal angles ``0 <= theta_1 <= theta_2 <= pi/2`` between span(u1, w1)
    and span(u2, w2): four ``[..., r]`` float tensors of one shape. Return
    ``[..., 2]``, ascending, in their dtype. Raise ``ValueError`` if a pair
    spans no plane (a zero vector, or w parallel to u)."""
    def basis(u, w):
        # Gram-Schmidt, twice: the second pass removes what rounding
        # left along u
        q1 = u / u.norm(dim=-1, keepdim=True)
        v = w - (q1 * w).sum(-1, keepdim=True) * q1
        v = v - (q1 * v).sum(-1, keepdim=True) * q1
        if not bool(((v.norm(dim=-1)
                      > 1e3 * torch.finfo(u.dtype).eps * w.norm(dim=-1))
                     & (u.norm(dim=-1) > 0)).all()):
            raise ValueError("a pair does not span a plane "
                             "(a zero vector, or w parallel to u)")
        # [..., r, 2]
        return torch.stack([q1, v / v.norm(dim=-1, keepdim=True)], dim=-1)

    q1, q2 = basis(u1, w1), basis(u2, w2)
    m = q1.transpose(-1, -2) @ q2        # cosines: singular values of Q1^T Q2
    cos = torch.linalg.svdvals(m)                              # descending
    # sines: of the part of Q2 outside plane 1
    sin = torch.linalg.svdvals(q2 - q1 @ m).flip(-1)
    # atan2, not arccos: arccos of a cosine near 1 keeps only sqrt(eps)
    # of a small angle
    return torch.atan2(sin, cos)


def _pa_raw(u1, w1, u2, w2):
    a, b = torch.stack([u1, w1], -1), torch.stack([u2, w2], -1)
    cos = torch.linalg.svdvals(a.transpose(-1, -2) @ b).clamp(-1, 1)
    return torch.arccos(cos)


def _pa_arccos(u1, w1, u2, w2):
    a = torch.linalg.qr(torch.stack([u1, w1], -1)).Q
    b = torch.linalg.qr(torch.stack([u2, w2], -1)).Q
    return torch.arccos(torch.linalg.svdvals(a.transpose(-1, -2) @ b).clamp(-1, 1))


def _pa_no_check(u1, w1, u2, w2):
    a = torch.linalg.qr(torch.stack([u1, w1], -1)).Q
    b = torch.linalg.qr(torch.stack([u2, w2], -1)).Q
    m = a.transpose(-1, -2) @ b
    return torch.atan2(torch.linalg.svdvals(b - a @ m).flip(-1), torch.linalg.svdvals(m))


def _pa_descending(u1, w1, u2, w2):
    return principal_angles(u1, w1, u2, w2).flip(-1)


def _pa_in_float64(u1, w1, u2, w2):
    return principal_angles(*(x.to(f64) for x in (u1, w1, u2, w2)))


def _pa_unbatched(u1, w1, u2, w2):
    """Written for one pair of planes: the [r, 2] bases transposed by their dims 0 and 1."""
    a = torch.linalg.qr(torch.stack([u1, w1], -1)).Q
    b = torch.linalg.qr(torch.stack([u2, w2], -1)).Q
    if bool((torch.linalg.svdvals(torch.stack([u1, w1], -1)).amin(-1) == 0).any()):
        raise ValueError("a pair does not span a plane")
    m = a.transpose(0, 1) @ b
    return torch.atan2(torch.linalg.svdvals(b - a @ m).flip(-1), torch.linalg.svdvals(m))


def _flipped(got, expected, case) -> bool:
    e = torch.as_tensor(expected)
    return not torch.equal(e, e.flip(-1)) and agree(got, e.flip(-1), 1e-4)


def _catch_value_error(fn):
    """Runs the reader's function; a ValueError it raises comes back as the answer, to be judged."""
    def call(*args):
        try:
            return fn(*args)
        except ValueError as e:
            return e
    return call


def _planes_at(gen, angles, r, dtype=f64):
    """Two planes with principal angles ``angles [..., 2]``, each given by a skewed basis."""
    batch = angles.shape[:-1]
    e = torch.linalg.qr(torch.randn(*batch, r, r, generator=gen, dtype=f64)).Q.transpose(-1, -2)
    a, b = angles[..., 0:1], angles[..., 1:2]
    p1 = (e[..., 0, :], e[..., 1, :])
    if r == 3:                                  # two planes in R^3 share a line: theta_1 = a = 0
        p2 = (e[..., 0, :], b.cos() * e[..., 1, :] + b.sin() * e[..., 2, :])
    else:
        p2 = (a.cos() * e[..., 0, :] + a.sin() * e[..., 2, :], b.cos() * e[..., 1, :] + b.sin() * e[..., 3, :])
    u1, w1 = p1[0] + 0.7 * p1[1], -0.4 * p1[0] + 1.3 * p1[1]             # change of basis: skewed, unnormalised
    u2, w2 = 2.0 * p2[1] - 0.5 * p2[0], 0.3 * p2[1] + 1.1 * p2[0]
    return tuple(x.to(dtype) for x in (u1, w1, u2, w2))


def _angles_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def c(label, angles, r, dtype=f64, tol=None, hint=""):
        angles = torch.as_tensor(angles, dtype=f64)
        return Case(label, _planes_at(gen, angles, r, dtype), angles.sort(-1).values.to(dtype), tol=tol, hint=hint)

    def degenerate(label, args, hint):
        def judge(got):
            return None if isinstance(got, ValueError) else "returned a value where ValueError was expected"
        return Case(label, args, judge=judge, hint=hint)

    e = torch.eye(4, dtype=f64)
    u, w, u2, w2 = randn(5), randn(5), randn(5), randn(5)
    in_r3 = torch.stack([torch.zeros(4, dtype=f64), torch.rand(4, generator=gen, dtype=f64) * 1.5], -1)
    return [
        c("planes at angles (0.3, 1.1) in r = 6, skewed bases", [1.1, 0.3], 6),
        c("a batch of 4 pairs of planes in r = 3 (they share a line)", in_r3, 3),
        Case("a plane against itself in another basis", (e[0], e[1], e[0] + e[1], e[0] - 2 * e[1]),
             torch.zeros(2, dtype=f64), hint="the same plane: both angles 0"),
        Case("orthogonal planes span(e0, e1), span(e2, e3)", (e[0], 3 * e[1], e[2] - e[3], e[2] + e[3]),
             torch.full((2,), math.pi / 2, dtype=f64), hint="orthogonal planes: both angles pi/2"),
        c("planes at angles (0.4, 0.9) in r = 4, float32", [0.9, 0.4], 4, dtype=torch.float32),
        c("small angles (3e-4, 1e-3) in float32", [3e-4, 1e-3], 5, dtype=torch.float32, tol=1e-2,
          hint="arccos of a cosine near 1 keeps only sqrt(eps) of a small angle: take atan2(sin, cos), the "
               "sines from the part of one plane's basis outside the other"),
        c("planes at angles (0.1, 1.2) in r = 5", [1.2, 0.1], 5),
        degenerate("w1 = -2 u1: span(u1, w1) is a line", (u, -2 * u, u2, w2),
                   "w1 = -2 u1 spans a line, not a plane, and the angles are undefined: raise ValueError"),
        degenerate("u2 = 0: span(u2, w2) is a line", (u, w, torch.zeros(5, dtype=f64), w2),
                   "u2 = 0 spans a line with w2, not a plane, and the angles are undefined: raise ValueError"),
    ]


def _spans_no_plane(case) -> bool:
    u1, w1, u2, w2 = (x.to(f64) for x in case.args)
    return bool((plucker(u1, w1).norm(dim=-1) == 0).any() or (plucker(u2, w2).norm(dim=-1) == 0).any())


def _skewed(case) -> bool:
    u1, w1 = case.args[0].to(f64), case.args[1].to(f64)
    return bool(((u1 * w1).sum(-1).abs() > 1e-3).any() or (u1.norm(dim=-1) - 1).abs().max() > 1e-3)


PRINCIPAL_ANGLES = Exercise(
    name="principal angles",
    chapter="6",
    title="Principal angles between two planes",
    statement=(
        "With orthonormal bases $Z_1, Z_2$ of two planes, the cosines of the principal angles "
        "$0\\le\\theta_1\\le\\theta_2\\le\\pi/2$ are the singular values of $Z_1^\\top Z_2$; the sines are "
        "those of $Z_2-Z_1Z_1^\\top Z_2$. The planes come as skewed, unnormalised pairs, one pair of planes "
        "or a batch of them. Return both angles in the inputs' dtype, exact at $0$ and $\\pi/2$ and "
        "accurate at $10^{-3}$ in float32, and raise `ValueError` for a pair that spans no plane (a zero "
        "vector, or $w\\parallel u$), as the library does."),
    solution=principal_angles,
    cases=_angles_cases,
    wrong=(Wrong(_pa_raw, "orthonormal"), Wrong(_pa_arccos, "atan2"), Wrong(_pa_no_check, "spans a line"),
           Wrong(_pa_descending, "ascending"), Wrong(_pa_in_float64, "expected dtype float32"),
           Wrong(_pa_unbatched, "a batch of 4 pairs")),
    diagnose=((lambda got, expected, case: isinstance(got, ValueError),
               "you raised ValueError, but both pairs span planes here: only a zero vector or w parallel "
               "to u spans no plane"),
              (_flipped, "right angles, wrong order: return them ascending, theta_1 <= theta_2"),
              (matches(_pa_raw), "you took the singular values of U1^T U2 for the pairs as given: the cosines "
                                 "are those of Z1^T Z2 for ORTHONORMAL bases Z1, Z2 of the planes")),
    harness=_catch_value_error,
    freedoms=(
        Freedom("skewed, unnormalised bases", _skewed),
        Freedom("a batch of pairs of planes", lambda c: c.args[0].dim() > 1),
        Freedom("small angles in float32 (the answer float32)", lambda c: c.args[0].dtype == torch.float32),
        Freedom("a pair that spans no plane (a zero vector, or w parallel to u)", _spans_no_plane),
    ),
    out_dtype="input",
)


# --- 4. the causal mixing signal ------------------------------------------------------------------

def grassmann_mixing_signal(z, weight, offsets, norm_floor):
    """The layer's signal before its bias: ``z [B, T, r]``,
    ``weight [d, r (r - 1) / 2]``, offsets (distinct ints >= 1),
    ``norm_floor > 0``. ``g_t`` = mean over valid delta (``t - delta >= 0``) of
    ``W p / max(||p||, norm_floor)``, ``p = p(z_t, z_{t-delta})`` in
    lexicographic (i, j) order; ``g_t = 0`` where no offset is valid. Return
    ``[B, T, d]`` in z's dtype."""
    B, T, r = z.shape
    i, j = torch.triu_indices(r, r, offset=1)
    total = z.new_zeros(B, T, weight.shape[1])
    count = torch.zeros(T, dtype=z.dtype)
    for delta in offsets:
        if delta >= T:
            continue                       # pairs nothing in this sequence
        # z_t and its partner z_{t - delta}: the past
        u, w = z[:, delta:], z[:, :-delta]
        p = u[..., i] * w[..., j] - u[..., j] * w[..., i]
        # a repeated token: 0, not 0 / 0
        p = p / p.norm(dim=-1, keepdim=True).clamp_min(norm_floor)
        total[:, delta:] += p
        count[delta:] += 1
    # divide by |W_t|, the valid offsets
    mean = total / count.clamp_min(1)[None, :, None]
    return mean @ weight.T


def _mix_paper(z, weight, offsets, norm_floor):
    return plucker_projection_reference(z, weight, offsets, norm_floor=norm_floor, pairing="paper")


def _mix_variant(z, weight, offsets, norm_floor, *, mean="valid", floor="given", acc=None, flatten=False):
    """The solution with one thing changed: the mean over every offset (not the valid ones), the norm's
    floor (none, or the layer's default 1e-6 whatever ``norm_floor`` says), everything in float64 (and
    so returned), or the batch flattened into one sequence."""
    if acc is not None:
        z, weight = z.to(acc), weight.to(acc)
    B, T, r = z.shape
    zz = z.reshape(1, B * T, r) if flatten else z
    L = zz.shape[1]
    i, j = torch.triu_indices(r, r, offset=1)
    total = zz.new_zeros(1 if flatten else B, L, weight.shape[1])
    count = torch.zeros(L, dtype=z.dtype)
    for delta in offsets:
        if delta >= L:
            continue
        u, w = zz[:, delta:], zz[:, :-delta]
        p = u[..., i] * w[..., j] - u[..., j] * w[..., i]
        n = p.norm(dim=-1, keepdim=True)
        n = {"given": n.clamp_min(norm_floor), "none": n, "default": n.clamp_min(1e-6)}[floor]
        total[:, delta:] += p / n
        count[delta:] += 1
    if mean == "all":
        count = torch.full_like(count, float(len(offsets)))
    out = total / count.clamp_min(1)[None, :, None] @ weight.T
    return out.reshape(B, T, -1) if flatten else out


def _mix_all_offsets(z, weight, offsets, norm_floor):
    return _mix_variant(z, weight, offsets, norm_floor, mean="all")


def _mix_no_floor(z, weight, offsets, norm_floor):
    return _mix_variant(z, weight, offsets, norm_floor, floor="none")


def _mix_default_floor(z, weight, offsets, norm_floor):
    return _mix_variant(z, weight, offsets, norm_floor, floor="default")


def _mix_in_float64(z, weight, offsets, norm_floor):
    return _mix_variant(z, weight, offsets, norm_floor, acc=f64)


def _mix_flattened(z, weight, offsets, norm_floor):
    return _mix_variant(z, weight, offsets, norm_floor, flatten=True)


def _mix_swapped(z, weight, offsets, norm_floor):
    return -grassmann_mixing_signal(z, weight, offsets, norm_floor)


def _mixing_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def c(label, z, W, offsets, floor=1e-6, hint=""):
        g = plucker_projection_reference(z, W, offsets, norm_floor=floor, pairing="causal")
        return Case(label, (z, W, offsets, floor), g, hint=hint)

    rep = randn(2, 7, 4)
    rep[0, 3] = rep[0, 2]                                   # a repeated token
    rep[1, 5] = 2 * rep[1, 1]                               # an exact multiple, 4 steps back
    rep[1, 2] = 0.0                                         # a zero token
    return [
        c("B = 2, T = 9, r = 4, d = 3, offsets (1, 2, 4)", randn(2, 9, 4), randn(3, 6), (1, 2, 4)),
        c("the paper's offsets (1, 2, 4, 8, 12, 16), T = 20, r = 5", randn(1, 20, 5), randn(4, 10),
          (1, 2, 4, 8, 12, 16)),
        c("T = 1: no partner, g = 0", randn(2, 1, 3), randn(5, 3), (1, 2)),
        c("float32 z and weight, offsets (2, 1), B = 2, T = 6, r = 3", randn(2, 6, 3).float(),
          randn(2, 3).float(), (2, 1)),
        c("offsets longer than the sequence, (3, 50), T = 5", randn(1, 5, 3), randn(2, 3), (3, 50),
          hint="an offset with t - delta < 0 pairs nothing and is not counted in the mean"),
        c("a repeated token, a token 2x one 4 back, a zero token", rep, randn(3, 6), (1, 4),
          hint="a parallel pair or a zero token has p = 0: dividing by max(||p||, norm_floor) keeps it 0 "
               "(0 / 0 is NaN)"),
        c("tokens of size 1e-4: ||p|| below norm_floor = 1e-5", 1e-4 * randn(2, 6, 4), randn(3, 6), (1, 2),
          floor=1e-5,
          hint="divide by max(||p||, norm_floor), with the norm_floor given: a pair whose ||p|| is below it "
               "is divided by it"),
    ]


def _pair_norms(case):
    z, _, offsets, _ = case.args
    i, j = torch.triu_indices(z.shape[-1], z.shape[-1], offset=1)
    z = z.to(f64)
    norms = [(z[:, d:, i] * z[:, :-d, j] - z[:, d:, j] * z[:, :-d, i]).norm(dim=-1).flatten()
             for d in offsets if d < z.shape[1]]
    return torch.cat(norms) if norms else torch.zeros(0, dtype=f64)


def _is_paper_pairing(got, expected, case) -> bool:
    return agree(got, _mix_paper(*case.args), 1e-6)


MIXING_SIGNAL = Exercise(
    name="grassmann mixing signal",
    chapter="6",
    title="The causal Grassmann layer's mixing signal",
    statement=(
        "The causal layer pairs $y_t$ with $y_{t-\\delta}$ for each offset in "
        "$\\mathcal W_t=\\{\\delta\\in\\mathcal W:\\delta\\le t\\}$, normalises the pair's Plücker vector "
        "$\\omega_{t,\\delta}=\\omega(y_t,y_{t-\\delta})$ to "
        "$\\hat\\omega_{t,\\delta}=\\omega_{t,\\delta}/\\max(\\lVert\\omega_{t,\\delta}\\rVert,\\epsilon_0)$, and "
        "averages the projections: $\\xi_t=\\frac1{|\\mathcal W_t|}\\sum_{\\delta\\in\\mathcal W_t}"
        "W_{\\rm plu}\\hat\\omega_{t,\\delta}$, and $\\xi_t=0$ where $\\mathcal W_t$ is empty (the code's `z`, "
        "`offsets`, `weight`, `norm_floor`, `p` are $y$, $\\mathcal W$, $W_{\\rm plu}$, $\\epsilon_0$, "
        "$\\omega$). Compute it (no bias) in $y$'s dtype, each sequence of the batch on its own, "
        "for the paper's offsets, $T=1$, offsets longer than the sequence, repeated, parallel and zero "
        "tokens, and pairs whose area is below the floor $\\epsilon_0$ (the one given, not the layer's "
        "default $10^{-6}$)."),
    solution=grassmann_mixing_signal,
    cases=_mixing_cases,
    wrong=(Wrong(_mix_paper, "future"), Wrong(_mix_all_offsets, "valid"), Wrong(_mix_no_floor, "norm_floor"),
           Wrong(_mix_swapped, "p(z_t, z_{t-delta})"), Wrong(_mix_default_floor, "the norm_floor given"),
           Wrong(_mix_in_float64, "expected dtype float32"), Wrong(_mix_flattened, "another sequence")),
    diagnose=((matches(_mix_all_offsets), "you divided by |W|, the number of offsets: average over the "
                                          "|W_t| offsets valid at t (delta <= t), the others pair nothing"),
              (_is_paper_pairing, "you paired z_t with z_{t+delta}, the future (the paper's equation as "
                                  "printed): the causal layer pairs z_t with z_{t-delta}"),
              (_negated, "every output has the wrong sign: the pair is p(z_t, z_{t-delta}), the token first "
                         "and its partner second (p(w, u) = -p(u, w))"),
              (matches(_mix_flattened), "the first tokens of sequence b > 0 were paired with the last of "
                                        "sequence b - 1: each sequence of the batch is paired within itself, "
                                        "never with another sequence")),
    freedoms=(
        Freedom("B > 1 sequences", lambda c: c.args[0].shape[0] > 1),
        Freedom("offsets not valid at every t, some longer than the sequence",
                lambda c: max(c.args[2]) >= c.args[0].shape[1] > 1),
        Freedom("parallel and zero tokens (p = 0)", lambda c: bool((_pair_norms(c) == 0).any())),
        Freedom("norm_floor other than 1e-6, above some pair's ||p||",
                lambda c: c.args[3] != 1e-6 and bool(((_pair_norms(c) > 0) & (_pair_norms(c) < c.args[3])).any())),
        Freedom("float32 z (the answer in z's dtype)", lambda c: c.args[0].dtype == torch.float32),
    ),
    out_dtype="input",
)


EXERCISES = (PLUCKER, PLUCKER_RELATIONS, PRINCIPAL_ANGLES, MIXING_SIGNAL)
