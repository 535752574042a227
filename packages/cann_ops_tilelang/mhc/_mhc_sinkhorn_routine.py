"""The per-token Sinkhorn routines of mhc_sinkhorn_fwd and mhc_sinkhorn_bwd, written once for both backends.

One thread owns one token: its mhc_mult x mhc_mult matrix lives in a local array of m * m fp32 values, row
major, so the row and column reductions are plain sums over registers (no cross-thread traffic, any m). The
macros take the language module T (tilelang.language on CUDA, tilelang.ascend.language in an Ascend SIMT VF)
and act on local arrays; the kernels move the values between those and their buffers.

A normalisation step divides each row (column) by its sum + eps; the reciprocal is taken once per row and the
row multiplied by it (at most one rounding more than a division per element, well inside the tolerance of
the fp32 results). The kernel supplies the reciprocal: a CUDA configuration takes one without IEEE division's
slow-path branch per row (MhcSinkhornConfig.reciprocal). The backward recomputes each step's sum from the step's
stored input in the same order as the forward, so it sees the forward's denominators bit for bit.
"""

import types


def ieee_reciprocal(T):
    """1 / x, correctly rounded: the reciprocal of a backend without a faster one."""
    return lambda x: T.float32(1.0) / x


def make_sinkhorn_routines(T, m: int, reciprocal=None):
    """The macros of m x m matrices on T, by name: softmax_eps, normalize, normalize_backward, softmax_backward,
    read / write (a buffer row [row, element] <-> a local array), keep / fetch (a local array <-> the backward's
    store [step, element, thread]); then forward and backward, the whole routines. `reciprocal(x)` is the
    expression of 1 / x for positive x (default: ieee_reciprocal)."""
    mm = m * m
    reciprocal = reciprocal or ieee_reciprocal(T)

    def at(i, j, transposed):
        """Index of element (i, j) of the row-major matrix, or of (j, i) for a column step."""
        return j * m + i if transposed else i * m + j

    @T.macro
    def softmax_eps(a, eps):
        """a <- softmax of each row of a, + eps (the first half of Sinkhorn's first step; eps 0: the softmax)."""
        for i in T.unroll(m):
            top = T.alloc_var(T.float32, init=0.0)
            top = a[i * m]
            for j in T.unroll(m):
                top = T.max(top, a[i * m + j])
            total = T.alloc_var(T.float32, init=0.0)
            for j in T.unroll(m):
                a[i * m + j] = T.exp(a[i * m + j] - top)
                total = total + a[i * m + j]
            inverse = T.alloc_var(T.float32, init=0.0)
            inverse = reciprocal(total)
            for j in T.unroll(m):
                a[i * m + j] = a[i * m + j] * inverse + eps

    @T.macro
    def normalize(a, eps, transposed):
        """a <- a with each row (transposed: each column) divided by its sum + eps."""
        for i in T.unroll(m):
            total = T.alloc_var(T.float32, init=0.0)
            for j in T.unroll(m):
                total = total + a[at(i, j, transposed)]
            inverse = T.alloc_var(T.float32, init=0.0)
            inverse = reciprocal(total + eps)
            for j in T.unroll(m):
                a[at(i, j, transposed)] = a[at(i, j, transposed)] * inverse

    @T.macro
    def normalize_backward(g, x, eps, transposed):
        """g <- the gradient at the input x of a row (transposed: column) step, g being it at the step's output:
        per row, d = sum(x) + eps, g <- (g - sum(g * x) / d) / d."""
        for i in T.unroll(m):
            total = T.alloc_var(T.float32, init=0.0)
            dot = T.alloc_var(T.float32, init=0.0)
            for j in T.unroll(m):
                total = total + x[at(i, j, transposed)]
                dot = dot + g[at(i, j, transposed)] * x[at(i, j, transposed)]
            inverse = T.alloc_var(T.float32, init=0.0)
            inverse = reciprocal(total + eps)
            dot = dot * inverse
            for j in T.unroll(m):
                g[at(i, j, transposed)] = (g[at(i, j, transposed)] - dot) * inverse

    @T.macro
    def softmax_backward(g, p):
        """g <- the gradient at the logits of a row softmax whose output is p: p * (g - sum(g * p)) per row."""
        for i in T.unroll(m):
            dot = T.alloc_var(T.float32, init=0.0)
            for j in T.unroll(m):
                dot = dot + g[i * m + j] * p[i * m + j]
            for j in T.unroll(m):
                g[i * m + j] = (g[i * m + j] - dot) * p[i * m + j]

    @T.macro
    def read(a, buffer, row):
        for e in T.unroll(mm):
            a[e] = buffer[row, e]

    @T.macro
    def write(buffer, row, a):
        for e in T.unroll(mm):
            buffer[row, e] = a[e]

    @T.macro
    def keep(store, step, thread, a):
        for e in T.unroll(mm):
            store[step, e, thread] = a[e]

    @T.macro
    def fetch(a, store, step, thread):
        for e in T.unroll(mm):
            a[e] = store[step, e, thread]

    @T.macro
    def forward(a, eps, repeat):
        """a <- Sinkhorn of the logits a: softmax + eps, a column step, then repeat - 1 (row, column) steps."""
        softmax_eps(a, eps)
        normalize(a, eps, True)
        for _ in T.serial(repeat - 1):
            normalize(a, eps, False)
            normalize(a, eps, True)

    @T.macro
    def backward(g, a, x, store, thread, eps, repeat):
        """g <- the gradient at the logits x of Sinkhorn, g being it at the output (a: a scratch array). The forward
        is recomputed first, the input of step k kept in store[k, :, thread]; then the steps in reverse."""
        for e in T.unroll(mm):
            a[e] = x[e]
        softmax_eps(a, eps)
        keep(store, 0, thread, a)
        normalize(a, eps, True)
        for r in T.serial(repeat - 1):
            keep(store, 2 * r + 1, thread, a)
            normalize(a, eps, False)
            keep(store, 2 * r + 2, thread, a)
            normalize(a, eps, True)
        for r in T.serial(repeat - 1):
            fetch(a, store, 2 * (repeat - 1 - r), thread)
            normalize_backward(g, a, eps, True)
            fetch(a, store, 2 * (repeat - 1 - r) - 1, thread)
            normalize_backward(g, a, eps, False)
        fetch(a, store, 0, thread)
        normalize_backward(g, a, eps, True)
        for e in T.unroll(mm):
            a[e] = x[e]
        softmax_eps(a, T.float32(0.0))
        softmax_backward(g, a)

    return types.SimpleNamespace(
        softmax_eps=softmax_eps,
        normalize=normalize,
        normalize_backward=normalize_backward,
        softmax_backward=softmax_backward,
        read=read,
        write=write,
        keep=keep,
        fetch=fetch,
        forward=forward,
        backward=backward,
    )
