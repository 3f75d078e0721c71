"""The `"native"` scan: a C++ kernel for the diagonal recurrence on CPU (XLA FFI custom call).

XLA:CPU runs a `lax.scan`/`fori_loop` step as several small kernels with a fixed cost per
iteration, which holds a scan to roughly 0.4 of the memory bandwidth of an elementwise pass
(benchmarks/README.md). `_native.cc` is one loop in C++: each element of b is read once and
each state written once, the state kept in a per-sequence buffer. The backward pass is one
more loop of the same kind (the adjoint recurrence and ā fused; custom VJP).
`native_planar_states` runs the same recurrence on the layout the SSM's products give and take
(complex numbers as real rows [Re | Im], both directions of a bidirectional layer in one call),
which saves the passes that pack them into complex arrays and back; under bfloat16 products
its kernels also write the states' bfloat16 copy and b̄ in bfloat16 (`planar_states_mixed`,
`planar_adjoint`, for `s5jax.core._mixed`). `native_weight_gradient`
is a float32 weight gradient Σ_r a[r]ᵀ g[r] (packed panels, AVX2 tiles), which XLA's CPU
backend runs well below its forward products (`s5jax.core._products`).

The kernel is compiled on first use with the system C++ compiler (`$CXX`, else `c++`, `g++`
or `clang++`) against the XLA FFI headers shipped with jaxlib, and cached in
`$S5JAX_CACHE_DIR` (default `$XDG_CACHE_HOME/s5jax`, i.e. `~/.cache/s5jax`) under a name that
hashes the source, the compiler, the flags, jaxlib's version and the host CPU, written to a
temporary name and renamed. Nothing is downloaded. `S5JAX_NATIVE=0` turns it off.
Each new source, compiler, jaxlib or CPU type adds a build (about 0.5 MB), so a build marks
itself used (its modification time) whenever a process loads it, and a process that compiles
a new one removes the builds no process has loaded for `_PRUNE_AFTER_DAYS` days and the
temporary files a killed compiler left behind more than a day ago (`_prune`). The folder
may be shared by hosts of several CPU types: each one's build stays while it is used.

`native_available()` says whether it can be used; `method="native"` raises a `RuntimeError`
that says why not (no compiler, a failed build, not a CPU backend, `S5JAX_NATIVE=0`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .._atomic import atomic_path
from .._cache import cache_dir as _cache_dir
from .._cache import cpu_identity as _cpu_identity

__all__ = [
    "native_available",
    "native_build_error",
    "native_column_dot",
    "native_host_has_amx",
    "native_materialise",
    "native_planar_states",
    "native_recurrence",
    "native_transpose",
    "native_weight_gradient",
    "native_weight_gradient_bfloat16",
    "native_weight_gradient_tile",
    "native_weight_gradient_vectorised",
]

_SOURCE = Path(__file__).with_name("_native.cc")
_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-march=native", "-pthread")
_TARGET = "s5jax_recurrence"
_TARGET_ADJOINT = "s5jax_recurrence_adjoint"
_TARGET_PLANAR = "s5jax_planar"
_TARGET_PLANAR_ADJOINT = "s5jax_planar_adjoint"
_TARGET_PLANAR_MIXED = "s5jax_planar_mixed"
_TARGET_MATERIALISE = "s5jax_materialise"
_TARGET_TRANSPOSE = "s5jax_transpose"
_TARGET_WEIGHT_GRADIENT = "s5jax_weight_gradient"
_TARGET_COLUMN_DOT = "s5jax_column_dot"
_WEIGHT_GRADIENT_TILES = {2: "avx512", 1: "avx2", 0: "portable"}  # S5jaxWeightGradientVector()
_BUILD_PREFIX = "s5jax_native-"
_PRUNE_AFTER_DAYS = 30  # builds not loaded for this long are removed when a new one is built
_DAY = 86_400.0
_DTYPES = (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128)

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_state: dict = {}  # "ok": bool, "error": str, "library": Path


def _compiler() -> str | None:
    explicit = os.environ.get("CXX")
    if explicit:
        return shutil.which(explicit) or explicit
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _jaxlib_version() -> str:
    # Read from the installed distribution so that core imports only jax and numpy.
    try:
        return importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return "unknown-jaxlib/jax-" + jax.__version__


def _build(cxx: str) -> Path:
    include = jax.ffi.include_dir()
    version = subprocess.run(
        [cxx, "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()[:1]
    key = hashlib.sha256()
    for part in (
        _SOURCE.read_bytes(),
        repr(_FLAGS).encode(),
        repr(version).encode(),
        _jaxlib_version().encode(),
        _cpu_identity().encode(),
    ):
        key.update(part)
        key.update(b"\0")
    out_dir = _cache_dir()
    target = out_dir / f"{_BUILD_PREFIX}{key.hexdigest()[:16]}.so"
    if target.exists():
        _mark_used(target)
        return target
    with contextlib.ExitStack() as stack:
        try:  # the shared object is built under a temporary name and renamed when complete
            tmp = stack.enter_context(atomic_path(target, mode=0o777))  # 0755 by the umask
        except OSError as err:
            raise RuntimeError(
                f"cannot write the kernel cache in {out_dir} ({err}); "
                "set S5JAX_CACHE_DIR to a writable folder"
            ) from err
        cmd = [cxx, *_FLAGS, "-isystem", include, str(_SOURCE), "-o", str(tmp)]
        _log.info("compiling the native scan kernel (once per host; cached as %s)", target)
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"compiling {_SOURCE.name} failed ({' '.join(cmd)}):\n{result.stderr.strip()}"
            )
    _prune(out_dir, keep=target)
    return target


def _mark_used(build: Path) -> None:
    """Set a cached build's modification time to now: `_prune` keeps what is still loaded.
    A cache that is read-only to this user is used as it is."""
    with contextlib.suppress(OSError):
        os.utime(build)


def _prune(folder: Path, *, keep: Path, now: float | None = None) -> list[Path]:
    """Remove from the kernel cache the builds not loaded for `_PRUNE_AFTER_DAYS` days and the
    temporary files of builds that never finished (a compiler killed mid-build) older than a
    day; never `keep` nor any other file. Returns what it removed. Called after a new build
    only, so that loading a cached build costs no directory scan. A file another process
    removes first, or one this user may not remove, is left to that process or user.
    """
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for path in entries:
        name = path.name
        if name.startswith(_BUILD_PREFIX) and name.endswith(".so"):
            limit = _PRUNE_AFTER_DAYS * _DAY
        elif name.startswith("." + _BUILD_PREFIX) and name.endswith(".tmp"):
            limit = _DAY
        else:
            continue
        try:
            if path == keep or not path.is_file() or now - path.stat().st_mtime <= limit:
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    if removed:
        _log.info("removed %d unused native kernel build(s) from %s", len(removed), folder)
    return removed


def _load() -> bool:
    """Build (once per process) and register the kernels; remember why not, if not."""
    with _lock:
        if "ok" in _state:
            return _state["ok"]
        _state["ok"], _state["error"] = False, ""
        if os.environ.get("S5JAX_NATIVE", "1") == "0":
            _state["error"] = "S5JAX_NATIVE=0 is set"
            return False
        cxx = _compiler()
        if cxx is None:
            _state["error"] = (
                "no C++ compiler found (set $CXX or install one, e.g. `apt-get install g++`)"
            )
            return False
        try:
            path = _build(cxx)
            try:
                lib = ctypes.cdll.LoadLibrary(str(path))
            except OSError:
                if path.exists():
                    raise
                # Removed between `_build`'s check and the load by another process's `_prune`
                # (a build unused for 30 days, loaded again just then): build it anew.
                path = _build(cxx)
                lib = ctypes.cdll.LoadLibrary(str(path))
            for target, symbol in (
                (_TARGET, lib.S5jaxRecurrence),
                (_TARGET_ADJOINT, lib.S5jaxRecurrenceAdjoint),
                (_TARGET_PLANAR, lib.S5jaxPlanar),
                (_TARGET_PLANAR_ADJOINT, lib.S5jaxPlanarAdjoint),
                (_TARGET_PLANAR_MIXED, lib.S5jaxPlanarMixed),
                (_TARGET_MATERIALISE, lib.S5jaxMaterialise),
                (_TARGET_TRANSPOSE, lib.S5jaxTranspose),
                (_TARGET_WEIGHT_GRADIENT, lib.S5jaxWeightGradient),
                (_TARGET_COLUMN_DOT, lib.S5jaxColumnDot),
            ):
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform="cpu")
            _state["weight_gradient_tile"] = _WEIGHT_GRADIENT_TILES.get(
                lib.S5jaxWeightGradientVector(), "portable"
            )
            _state["weight_gradient_bf16"] = bool(lib.S5jaxWeightGradientBfloat16())
            _state["amx"] = bool(lib.S5jaxBuildHasAmx())
        except (OSError, RuntimeError, AttributeError) as err:
            _state["error"] = f"building or loading the native kernel failed: {err}"
            return False
        _state["ok"], _state["library"] = True, path
        return True


def native_available() -> bool:
    """Whether `method="native"` can run here: a CPU backend and a kernel that built."""
    return jax.default_backend() == "cpu" and _load()


def native_build_error() -> str:
    """Why `native_available()` is false ("" when it is true)."""
    if jax.default_backend() != "cpu":
        return f"the native kernel runs on CPU only; the default backend is {jax.default_backend()}"
    _load()
    return _state.get("error", "")


def _require(dtype) -> None:
    if not native_available():
        raise RuntimeError(
            f"scan method 'native' is unavailable: {native_build_error()}. "
            "Use method='auto' (or 'chunked'/'sequential') instead."
        )
    if not any(dtype == d for d in _DTYPES):
        raise ValueError(
            f"scan method 'native' supports float32, float64, complex64 and complex128, got {dtype}"
        )


def _forward(a, b, reverse):
    call = jax.ffi.ffi_call(
        _TARGET, jax.ShapeDtypeStruct(b.shape, b.dtype), vmap_method="broadcast_all"
    )
    return call(a, b, per_step=np.bool_(a.ndim == b.ndim), reverse=np.bool_(reverse))


def _adjoint(a, g, xs, reverse):
    call = jax.ffi.ffi_call(
        _TARGET_ADJOINT,
        (jax.ShapeDtypeStruct(g.shape, g.dtype), jax.ShapeDtypeStruct(a.shape, a.dtype)),
        vmap_method="broadcast_all",
    )
    return call(a, g, xs, per_step=np.bool_(a.ndim == g.ndim), reverse=np.bool_(reverse))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _recurrence(a, b, reverse):
    return _forward(a, b, reverse)


def _recurrence_fwd(a, b, reverse):
    xs = _forward(a, b, reverse)
    return xs, (a, xs)


def _recurrence_bwd(reverse, residuals, g):
    a, xs = residuals
    b_bar, a_bar = _adjoint(a, g, xs, reverse)
    return a_bar, b_bar


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def native_recurrence(a, b, reverse: bool = False):
    """x for x_k = a_k ⊙ x_{k∓1} + b_k from a zero state, by the native kernel.

    `a`: (P,) or (L, P); `b`: (L, P); same dtype (float32/64, complex64/128). Works under
    `jax.jit`, `jax.vmap` and `jax.grad` (custom VJP); not under forward-mode `jax.jvp`.
    """
    _require(b.dtype)
    return _recurrence(a, b, bool(reverse))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _planar(a, b, bidirectional):
    return _planar_forward(a, b, bidirectional)


def _planar_forward(a, b, bidirectional):
    L, width = b.shape[-2], b.shape[-1] * (2 if bidirectional else 1)
    call = jax.ffi.ffi_call(
        _TARGET_PLANAR,
        jax.ShapeDtypeStruct((*b.shape[:-2], L, width), b.dtype),
        vmap_method="broadcast_all",
    )
    return call(a, b, bidirectional=np.bool_(bidirectional))


def _planar_fwd(a, b, bidirectional):
    xs = _planar_forward(a, b, bidirectional)
    return xs, (a, xs)


def _planar_bwd(bidirectional, residuals, g):
    a, xs = residuals
    b_bar, a_bar = planar_adjoint(a, g, xs, bidirectional)
    return a_bar, b_bar


_planar.defvjp(_planar_fwd, _planar_bwd)


def planar_adjoint(a, g, xs, bidirectional, b_dtype=None):
    """(b̄, ā) of the planar recurrence for the states' cotangent `g` (the kernel's backward
    pass): `a` (..., 2P) as [Re a | Im a] per sequence, `g` and the states `xs` (..., L, 2DP);
    b̄ (..., L, 2P) in `b_dtype` (default g's; bfloat16 for float32 g: rounded as
    `astype(jnp.bfloat16)` would, written once), ā (..., 2P) per sequence. No custom VJP."""
    P2 = a.shape[-1]
    call = jax.ffi.ffi_call(
        _TARGET_PLANAR_ADJOINT,
        (
            jax.ShapeDtypeStruct((*g.shape[:-1], P2), b_dtype or g.dtype),
            jax.ShapeDtypeStruct(a.shape, a.dtype),
        ),
        vmap_method="broadcast_all",
    )
    return call(a, g, xs, bidirectional=np.bool_(bidirectional))


def planar_states_mixed(a, b, bidirectional):
    """The planar forward pass on float32 `b` (..., L, 2P) with `a` (..., 2P) per sequence:
    (the states, float32; the same states rounded to bfloat16 as `astype(jnp.bfloat16)` would),
    from one pass. No custom VJP (`s5jax.core._mixed` has the one around it)."""
    L, width = b.shape[-2], b.shape[-1] * (2 if bidirectional else 1)
    shape = (*b.shape[:-2], L, width)
    call = jax.ffi.ffi_call(
        _TARGET_PLANAR_MIXED,
        (jax.ShapeDtypeStruct(shape, b.dtype), jax.ShapeDtypeStruct(shape, jnp.bfloat16)),
        vmap_method="broadcast_all",
    )
    return call(a, b, bidirectional=np.bool_(bidirectional))


def planar_lanes(a, dtype):
    """Complex `a` (P,) as the kernels' real row [Re a | Im a] (2P,) in `dtype`."""
    return jnp.concatenate([jnp.real(a), jnp.imag(a)]).astype(dtype)


def native_planar_states(a, b, bidirectional: bool = False):
    """The states of x_k = a ⊙ x_{k−1} + b_k from a zero state, complex numbers kept as real
    rows [Re | Im], by the native kernel: what the SSM's products give and take.

    `a`: complex (P,) (time-invariant); `b`: real (L, 2P) = [Re b | Im b]. Returns real
    (L, 2P) = [Re x | Im x], or with `bidirectional` (L, 4P) = [Re x→ | Re x← | Im x→ | Im x←],
    where x← is the reverse-time recurrence x←_k = a ⊙ x←_{k+1} + b_k over the same b (one
    kernel for both; in the backward pass the two directions' b̄ come out summed). float32 or
    float64. Works under `jax.jit`, `jax.vmap` and `jax.grad` (custom VJP; the gradient
    reaches complex `a` through its real and imaginary parts).
    """
    _require(b.dtype)
    if not jnp.issubdtype(b.dtype, jnp.floating) or b.ndim != 2 or b.shape[-1] % 2:
        raise ValueError(
            f"native_planar_states: b must be a real (L, 2P) array, got {b.dtype} {b.shape}"
        )
    if a.shape != (b.shape[-1] // 2,):
        raise ValueError(f"native_planar_states: a must be ({b.shape[-1] // 2},), got {a.shape}")
    return _planar(planar_lanes(a, b.dtype), b, bool(bidirectional))


def _materialise_call(x):
    call = jax.ffi.ffi_call(
        _TARGET_MATERIALISE,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        vmap_method="broadcast_all",
        input_output_aliases={0: 0},
    )
    return call(x)


def _self_adjoint(call):
    """`call` (a linear map that is its own adjoint, up to the transpose: the identity, the
    transpose of the last two axes) as a custom VJP whose backward pass applies it to the
    cotangent."""
    f = jax.custom_vjp(call)
    f.defvjp(lambda x: (call(x), None), lambda _, g: (call(g),))
    return f


_materialise = _self_adjoint(_materialise_call)


def native_materialise(x):
    """x, written to memory once: a fusion barrier for XLA's CPU backend, in both passes.

    XLA fuses cheap elementwise producers into every consumer, recomputing them instead of
    storing them. Through a deep residual stack, x_l = x_{l−1} + branch_l is never stored: each
    consumer of x_l (BatchNorm's statistics and normalisation, the gradient products that need
    the normalised input) recomputes the whole sum x_0 + branch_1 + … + branch_l from the
    branches' stored pieces, so the work grows with the square of the depth. A custom call is
    something XLA cannot fuse through: its operand is written once and its consumers read it.
    The kernel is a no-op where XLA aliases the output to the input (as here, when x has no
    other use) and a copy otherwise. The backward pass does the same to the cotangent.

    On ListOps' float32 training step (8 layers, H 128, batch 8, L 2,048; 2-core AMD EPYC,
    2026-11-28, old and new code in alternating processes, 7 steps each), every layer's output
    materialised: 177.3 / 146.1 and 182.2 / 150.2 ms before / after (`s5jax.nn.SequenceLayer`).

    `x`: any array (any dtype). Needs the native kernel (`native_available()`); works under
    `jax.jit`, `jax.vmap` and `jax.grad` (custom VJP); not under forward-mode `jax.jvp`.
    """
    if not native_available():
        raise RuntimeError(f"native_materialise is unavailable: {native_build_error()}")
    return _materialise(x)


def _transpose_call(x):
    call = jax.ffi.ffi_call(
        _TARGET_TRANSPOSE,
        jax.ShapeDtypeStruct((*x.shape[:-2], x.shape[-1], x.shape[-2]), x.dtype),
        vmap_method="expand_dims",
    )
    return call(x)


_transpose = _self_adjoint(_transpose_call)


def native_transpose(x):
    """`jnp.swapaxes(x, -1, -2)` written to memory row-major by the native library.

    XLA's CPU backend turns a transpose into a layout change of its consumer or fuses it into a
    loop over the elements; before a bfloat16 matrix product whose left operand must have its
    contracted axis innermost, either costs more than the copy itself (the weight gradient in
    `s5jax.core._products`). This custom call is a real transposed copy (32 × 32 tiles, split
    over the calling thread and XLA's CPU thread pool). `x`: (..., R, C) with 2-, 4- or 8-byte
    elements; differentiable (its VJP is the transpose back) and vmappable. Needs the native
    kernel (`native_available()`).
    """
    if x.ndim < 2:
        raise ValueError(f"native_transpose: x must be (..., R, C), got shape {x.shape}")
    if not native_available():
        raise RuntimeError(f"native_transpose is unavailable: {native_build_error()}")
    return _transpose(x)


def _weight_gradient_call(a, g):
    call = jax.ffi.ffi_call(
        _TARGET_WEIGHT_GRADIENT,
        jax.ShapeDtypeStruct((*a.shape[:-2], a.shape[-1], g.shape[-1]), jnp.float32),
        vmap_method="broadcast_all",
    )
    return call(a, g)


@jax.custom_vjp
def _weight_gradient(a, g):
    return _weight_gradient_call(a, g)


def _weight_gradient_fwd(a, g):
    return _weight_gradient_call(a, g), (a, g)


def _weight_gradient_bwd(res, c):  # c = aᵀ g: ∂a = g cᵀ, ∂g = a c, each in its input's dtype
    a, g = res
    da = jnp.matmul(g, jnp.swapaxes(c, -1, -2), preferred_element_type=jnp.float32)
    return da.astype(a.dtype), jnp.matmul(a, c, preferred_element_type=jnp.float32).astype(g.dtype)


_weight_gradient.defvjp(_weight_gradient_fwd, _weight_gradient_bwd)


def native_weight_gradient(a, g):
    """Σ_r a[..., r, :]ᵀ g[..., r, :], accumulated in float32: the gradient of W in y = x W over
    all rows.

    `a` (..., R, K) and `g` (..., R, N) with the same leading dims, both float32 or (where
    `native_weight_gradient_bfloat16()`) both bfloat16; returns (..., K, N) float32, accumulated
    in float32 like XLA's product. XLA's CPU backend runs this contraction over the outer axis
    of both operands far slower than a forward product of the same size (and for bfloat16
    operands only through a transposed copy); the kernel packs chunks of rows into panels and
    accumulates 12 × 32 tiles in AVX-512 registers or 6 × 16 tiles in AVX2 registers,
    whichever the host has, and bfloat16 pairs of rows with AVX512_BF16's dot-product
    instruction (`_native.cc`; figures in `s5jax.core._products`). Works under `jax.jit`,
    `jax.vmap` and `jax.grad` (its VJP is two plain products, each gradient in its input's
    dtype). Needs the native kernel (`native_available()`); `native_weight_gradient_tile()`
    says which float32 tile this build has (a portable loop where neither: correct, not fast).
    """
    if a.ndim < 2 or g.ndim != a.ndim or a.shape[:-1] != g.shape[:-1]:
        raise ValueError(
            "native_weight_gradient: a (..., R, K) and g (..., R, N) with the same leading "
            f"dims, got shapes {a.shape} and {g.shape}"
        )
    if not native_available():
        raise RuntimeError(f"native_weight_gradient is unavailable: {native_build_error()}")
    bf16 = a.dtype == g.dtype == jnp.bfloat16
    if not (a.dtype == g.dtype == jnp.float32 or bf16):
        raise ValueError(
            f"native_weight_gradient: float32 or bfloat16 operands, got {a.dtype} and {g.dtype}"
        )
    if bf16 and not native_weight_gradient_bfloat16():
        raise ValueError(
            "native_weight_gradient: this build has no bfloat16 tile (it needs a CPU with "
            "AVX512_BF16); pass float32 operands"
        )
    return _weight_gradient(a, g)


def _column_dot_call(x, g, m):
    call = jax.ffi.ffi_call(
        _TARGET_COLUMN_DOT,
        jax.ShapeDtypeStruct((*x.shape[:-2], x.shape[-1]), jnp.float32),
        vmap_method="broadcast_all",
    )
    return call(x, g, m)


@jax.custom_vjp
def _column_dot(x, g, m):
    return _column_dot_call(x, g, m)


def _column_dot_fwd(x, g, m):
    return _column_dot_call(x, g, m), (x, g, m)


def _column_dot_bwd(res, c):
    # d = Σ_r (x − m) ⊙ g: ∂x = c ⊙ g, ∂g = c ⊙ (x − m), ∂m = −c Σ_r g; each in its input's dtype
    x, g, m = res
    c_row, m_row = jnp.expand_dims(c, -2), jnp.expand_dims(m, -2)
    dg = c_row * (x.astype(jnp.float32) - m_row)
    return (c_row * g).astype(x.dtype), dg.astype(g.dtype), -c * jnp.sum(g, axis=-2)


_column_dot.defvjp(_column_dot_fwd, _column_dot_bwd)


def native_column_dot(x, g, m=None):
    """Σ_r (x[..., r, :] − m) ⊙ g[..., r, :], accumulated in float32: the gradient of D in
    y = x ⊙ D over all rows (`s5jax.core._products.scale_columns`, m = 0), and BatchNorm's
    Σ_t ∂y ⊙ (x − mean) (`s5jax.nn._norm`).

    `x` (..., R, N) float32 or bfloat16, `g` (..., R, N) float32, `m` (..., N) float32 or None
    (zeros); returns (..., N) float32. XLA's CPU backend runs this as a product with the
    columns as a batch dimension, on a float32 copy of a bfloat16 `x` and on x − m written to
    memory; the kernel reads `x` and `g` once (blocks of rows over XLA's threads, summed in
    block order: `_native.cc`). Works under `jax.jit`, `jax.vmap` and `jax.grad`. Needs the
    native kernel (`native_available()`).
    """
    if x.ndim < 2 or x.shape != g.shape:
        raise ValueError(
            f"native_column_dot: x and g (..., R, N) of one shape, got {x.shape} and {g.shape}"
        )
    want = (*x.shape[:-2], x.shape[-1])
    if m is None:
        m = jnp.zeros(want, jnp.float32)
    if m.shape != want:
        raise ValueError(f"native_column_dot: m must be {want}, got {m.shape}")
    if x.dtype not in (jnp.float32, jnp.bfloat16) or g.dtype != m.dtype or g.dtype != jnp.float32:
        raise ValueError(
            "native_column_dot: x float32 or bfloat16, g and m float32, got "
            f"{x.dtype}, {g.dtype} and {m.dtype}"
        )
    if not native_available():
        raise RuntimeError(f"native_column_dot is unavailable: {native_build_error()}")
    return _column_dot(x, g, m)


def native_weight_gradient_bfloat16() -> bool:
    """Whether the native library is available and was built with the bfloat16 weight-gradient
    tile (a CPU with AVX512_BF16: `native_weight_gradient` then takes bfloat16 operands)."""
    return native_available() and _state.get("weight_gradient_bf16", False)


def native_host_has_amx() -> bool:
    """Whether the native build's host has AMX tiles for bfloat16 (`-march=native` defined
    `__AMX_BF16__`); False where the library is unavailable."""
    return native_available() and _state.get("amx", False)


def native_weight_gradient_tile() -> str:
    """Which tile `native_weight_gradient` accumulates in, as this host's build
    (`-march=native`) compiled it: "avx512" (12 × 32 in AVX-512 registers), "avx2" (6 × 16 in
    AVX2 and FMA registers) or "portable" (a plain loop: correct, not fast); "" where the
    native library is unavailable."""
    return _state.get("weight_gradient_tile", "") if native_available() else ""


def native_weight_gradient_vectorised() -> bool:
    """Whether the native library is available and its weight-gradient tile runs in vector
    registers (AVX2 and FMA, or AVX-512: `native_weight_gradient_tile()`)."""
    return native_weight_gradient_tile() in ("avx2", "avx512")
