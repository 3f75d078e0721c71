"""An independent float64 NumPy reference of the S5 forward pass, written from the spec.

It follows reference-semantics §3 literally and naively, as the authors' code does: a full
B̄ matrix per step, Python loops over time, complex matrix products. Tests compare the
package against it; it shares no code with `s5jax`.
"""

import numpy as np


def discretize(Lambda, B_tilde, Delta, method):
    if method == "zoh":
        Lambda_bar = np.exp(Lambda * Delta)
        B_bar = ((Lambda_bar - 1) / Lambda)[:, None] * B_tilde
    elif method == "bilinear":
        denom = 1 - Delta * Lambda / 2
        Lambda_bar = (1 + Delta * Lambda / 2) / denom
        B_bar = (Delta / denom)[:, None] * B_tilde
    else:
        raise ValueError(method)
    return Lambda_bar, B_bar


def s5_forward(
    params,
    u,
    *,
    conj_sym,
    bidirectional,
    discretization="zoh",
    clip_eigs=False,
    step_rescale=1.0,
    dt=None,
    resets=None,
):
    """y (L, H) of one S5 SSM for parameters given as a dict of real float64 arrays."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    u = np.asarray(u, np.float64)
    L, _ = u.shape
    re = np.minimum(p["Lambda_re"], -1e-4) if clip_eigs else p["Lambda_re"]
    Lambda = re + 1j * p["Lambda_im"]
    P = Lambda.shape[0]
    B_tilde = p["B_re"] + 1j * p["B_im"]
    C = p["C_re"] + 1j * p["C_im"]
    Delta = np.broadcast_to(step_rescale * np.exp(p["log_step"]), (P,))
    fwd_mult = np.ones(L) if dt is None else np.asarray(dt, np.float64)
    bwd_mult = np.concatenate([fwd_mult[1:], [1.0]])
    starts = np.zeros(L, bool) if resets is None else np.asarray(resets, bool)

    xs = np.zeros((L, P), complex)
    x = np.zeros(P, complex)
    for k in range(L):
        Lambda_bar, B_bar = discretize(Lambda, B_tilde, Delta * fwd_mult[k], discretization)
        if starts[k]:
            x = np.zeros(P, complex)
        x = Lambda_bar * x + B_bar @ u[k]
        xs[k] = x
    y = (C[:, :P] @ xs.T).T
    if bidirectional:
        xs_b = np.zeros((L, P), complex)
        x = np.zeros(P, complex)
        for k in reversed(range(L)):
            Lambda_bar, B_bar = discretize(Lambda, B_tilde, Delta * bwd_mult[k], discretization)
            if k + 1 < L and starts[k + 1]:
                x = np.zeros(P, complex)
            x = Lambda_bar * x + B_bar @ u[k]
            xs_b[k] = x
        y = y + (C[:, P:] @ xs_b.T).T
    f = 2.0 if conj_sym else 1.0
    return f * y.real + p["D"][None, :] * u


def layer_params(layer):
    """The real parameter arrays of an `S5SSM` as a dict of NumPy arrays."""
    names = ("Lambda_re", "Lambda_im", "B_re", "B_im", "C_re", "C_im", "D", "log_step")
    return {n: np.asarray(getattr(layer, n)) for n in names}
