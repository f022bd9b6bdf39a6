"""The continual family's subspace algebra: GPM bases (subspace.py), Janus-LoRA's gradient rectification
(janus_lora.py, arXiv 2605.28495), LoDA's energy objectives and recalibration (loda.py, arXiv 2603.00191), and
the adapter core's fold_in."""

import pytest
import torch

from litlab.lit_modules.continual.janus_lora import rectify_update
from litlab.lit_modules.continual.loda import general_basis, isolated_basis, recalibration_coeff, ridged
from litlab.lit_modules.continual.subspace import SubspaceMemory, top_eigvecs, violation_ratio
from litlab.lit_modules.core.adapters import AdapterLinear


def _orthonormal(d, k, seed):
    return torch.linalg.qr(
        torch.randn(d, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    )[0]


def _known_spectrum(d=20, seed=0):
    U = _orthonormal(d, d, seed)
    lam = torch.tensor([2.0**-i for i in range(d)], dtype=torch.float64)
    return U, lam, U @ torch.diag(lam) @ U.T


# ---- SubspaceMemory: GPM energy rule, projection ----------------------------------------------------
@pytest.mark.parametrize("eps", [0.5, 0.9, 0.99])
def test_expand_picks_minimal_k_and_orthonormal_basis(eps):
    U, lam, C = _known_spectrum()
    mem = SubspaceMemory(20, min_free=0)
    added = mem.expand(C, eps)
    cum = torch.cumsum(lam, 0) / lam.sum()
    k_min = int((cum >= eps).nonzero()[0]) + 1
    assert added == mem.k == k_min
    assert torch.linalg.matrix_norm(mem.V.T @ mem.V - torch.eye(mem.k, dtype=torch.float64)) < 1e-6
    assert mem.captured_energy(C) >= eps
    # the span is the top-k eigenvectors
    top = U[:, :k_min]
    assert torch.linalg.matrix_norm(top - mem.V @ (mem.V.T @ top)) < 1e-6


def test_expand_keeps_existing_columns_and_respects_min_free():
    _, _, C1 = _known_spectrum(seed=1)
    _, _, C2 = _known_spectrum(seed=2)
    mem = SubspaceMemory(20, min_free=8)
    mem.expand(C1, 0.9)
    V_old = mem.V.clone()
    mem.expand(C2, 0.9)
    assert torch.equal(mem.V[:, : V_old.shape[1]], V_old)  # old columns untouched
    assert torch.linalg.matrix_norm(mem.V.T @ mem.V - torch.eye(mem.k, dtype=torch.float64)) < 1e-6
    assert mem.captured_energy(C2) >= 0.9 - 1e-9
    mem.expand(torch.eye(20, dtype=torch.float64), 1.0)
    assert mem.k == 12  # never beyond d_in - min_free
    with pytest.raises(ValueError, match="threshold"):
        mem.expand(C1, 1.5)


def test_project_out_is_orthogonal_to_basis():
    mem = SubspaceMemory(32)
    mem.V = _orthonormal(32, 10, 3)
    G = torch.randn(7, 32)
    Gp = mem.project_out(G)
    assert torch.linalg.matrix_norm(Gp.double() @ mem.V) < 1e-6 * torch.linalg.matrix_norm(G)


# ---- Janus-LoRA gradient rectification ----------------------------------------------------------------
def _gr_tensors(seed=0, d_in=32, d_out=24, r=4, k=10, protected_A=False):
    g = torch.Generator().manual_seed(seed)
    V = _orthonormal(d_in, k, seed + 100).float()
    A0 = torch.randn(r, d_in, generator=g)
    if protected_A:
        A0 = A0 - (A0 @ V) @ V.T
    B0, dA, dB = (
        torch.randn(d_out, r, generator=g),
        torch.randn(r, d_in, generator=g),
        torch.randn(d_out, r, generator=g),
    )
    return A0, B0, A0 + 0.1 * dA, B0 + 0.1 * dB, V


@pytest.mark.parametrize("mode", ["project", "tangent"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gr_composite_update_annihilates_protected_subspace(mode, seed):
    A0, B0, A1, B1, V = _gr_tensors(seed)
    assert torch.linalg.matrix_norm(A0 @ V) > 1  # the adapter already reads the protected subspace
    A, B = rectify_update(A0, B0, A1, B1, V, mode=mode, delta=0.1)
    dW = B.double() @ A.double() - B0.double() @ A0.double()
    assert torch.linalg.matrix_norm(dW) > 1e-3
    assert violation_ratio(dW, V) <= 1e-5
    assert torch.linalg.matrix_norm((A - A0).double() @ V.double()) <= 1e-6


def test_naive_a_projection_violates():
    A0, B0, A1, B1, V = _gr_tensors(0)
    dA = A1 - A0
    A = A0 + dA - (dA @ V) @ V.T  # LoRA-GPM: G_A <- G_A P, B free
    dW = B1.double() @ A.double() - B0.double() @ A0.double()
    assert violation_ratio(dW, V) > 1e-2


def test_gr_tangent_identity_with_relative_rank_tolerance():
    """With A0 V = 0, the tangent mode realises P_B Z + (I − P_B) Z P_A (a max(S)-relative tolerance fails
    this)."""
    A0, B0, A1, B1, V = _gr_tensors(4, protected_A=True)
    A, B = rectify_update(A0, B0, A1, B1, V, mode="tangent", delta=1e-10)
    A0d, B0d, V64 = A0.double(), B0.double(), V.double()
    dA, dB = (A1 - A0).double(), (B1 - B0).double()
    P = torch.eye(32, dtype=torch.float64) - V64 @ V64.T
    Z = (B0d @ dA + dB @ A0d) @ P
    P_B = B0d @ torch.linalg.solve(B0d.T @ B0d, B0d.T)
    P_A = A0d.T @ torch.linalg.solve(A0d @ A0d.T, A0d)
    expected = P_B @ Z + (torch.eye(24, dtype=torch.float64) - P_B) @ Z @ P_A
    got = B0d @ (A.double() - A0d) + (B.double() - B0d) @ A0d
    assert torch.linalg.matrix_norm(got - expected) <= 1e-5 * torch.linalg.matrix_norm(expected)


def test_gr_is_identity_without_protected_directions():
    A0, B0, A1, B1, _ = _gr_tensors(5)
    for mode in ("project", "tangent"):
        A, B = rectify_update(A0, B0, A1, B1, torch.zeros(32, 0), mode=mode)
        assert torch.equal(A, A1) and torch.equal(B, B1)
    with pytest.raises(ValueError, match="gr mode"):
        rectify_update(A0, B0, A1, B1, _orthonormal(32, 3, 0).float(), mode="bogus")


# ---- LoDA objectives and recalibration ----------------------------------------------------------------
def _spd(d, seed, scale=1.0):
    X = torch.randn(3 * d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return scale * X.T @ X / (3 * d)


def test_general_basis_rows_and_energy():
    M_prev, M_cur, r = _spd(16, 0), _spd(16, 1), 4
    A_S = general_basis(M_cur, M_prev, r).T / 3**0.5
    assert torch.allclose(A_S @ A_S.T, torch.eye(r, dtype=torch.float64) / 3, atol=1e-6)
    top = torch.linalg.eigvalsh(M_prev + M_cur).flip(0)[:r].sum()
    assert torch.trace(A_S @ (M_prev + M_cur) @ A_S.T) == pytest.approx(float(top) / 3, abs=1e-5)


def test_isolated_basis_is_the_generalized_eigenproblem():
    M_prev, M_cur, r, ridge = _spd(16, 2), _spd(16, 3), 4, 1e-3
    Q, U, vals = isolated_basis(M_cur, M_prev, r, ridge, return_unorthogonalised=True)
    Mp = ridged(M_prev, ridge)
    assert torch.allclose(U.T @ Mp @ U, torch.eye(r, dtype=torch.float64), atol=1e-5)
    L = torch.linalg.cholesky(Mp)
    Linv = torch.linalg.inv(L)
    ref = torch.linalg.eigvalsh(Linv @ M_cur @ Linv.T).flip(0)[:r]
    quotients = torch.diag(U.T @ M_cur @ U) / torch.diag(U.T @ Mp @ U)
    assert torch.allclose(quotients, ref, atol=1e-5) and torch.allclose(vals, ref, atol=1e-8)
    # QR keeps the span: principal angles ~ 0
    cosines = torch.linalg.svdvals(Q.T @ torch.linalg.qr(U)[0])
    assert torch.allclose(cosines, torch.ones(r, dtype=torch.float64), atol=1e-5)

    # the subspace's quotient (trace ratio in the M_prev metric) beats 100 random orthonormal r-frames
    def score(W):
        return float(torch.trace(torch.linalg.solve(W.T @ Mp @ W, W.T @ M_cur @ W)))

    g = torch.Generator().manual_seed(7)
    assert all(
        score(Q) >= score(torch.linalg.qr(torch.randn(16, r, generator=g, dtype=torch.float64))[0])
        for _ in range(100)
    )


def test_recalibration_closed_form():
    M_prev, M_cur, gamma = _spd(12, 4), _spd(12, 5), 3.0
    A = torch.randn(4, 12, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    c = recalibration_coeff(A, M_prev, M_cur, gamma)

    def objective(x, a):
        return x**2 * (a @ M_prev @ a) + gamma * (x - 1) ** 2 * (a @ M_cur @ a)

    for i in range(4):
        a, h = A[i], 1e-6
        slope = (objective(c[i] + h, a) - objective(c[i] - h, a)) / (2 * h)
        assert abs(float(slope)) < 1e-6 * float(a @ M_cur @ a + a @ M_prev @ a)
    assert torch.allclose(
        recalibration_coeff(A, 1e-12 * M_prev, M_cur, gamma), torch.ones(4, dtype=torch.float64), atol=1e-9
    )
    assert torch.equal(
        recalibration_coeff(A, torch.zeros(12, 12, dtype=torch.float64), M_cur, gamma),
        torch.ones(4, dtype=torch.float64),
    )  # t = 0: M_prev = 0 gives c = 1 exactly


def test_top_eigvecs_bad_rank():
    with pytest.raises(ValueError, match="eigenvectors"):
        top_eigvecs(torch.eye(3), 4)


def test_fold_in_keeps_function_and_zeroes_b():
    torch.manual_seed(0)
    layer = AdapterLinear(torch.nn.Linear(10, 6))
    b = layer.add_branch("task", rank=3, alpha=3.0)
    torch.nn.init.normal_(b.B)
    x = torch.randn(5, 10)
    before = layer(x)
    layer.fold_in("task")
    assert torch.count_nonzero(b.B) == 0
    assert torch.allclose(layer(x), before, atol=1e-5)
    coeff = torch.tensor([1.0, 0.5, 0.0])
    torch.nn.init.normal_(b.B)
    W_expected = layer.base.weight + b.scale * (b.B * coeff) @ b.A
    layer.fold_in("task", coeff)
    assert torch.allclose(layer.base.weight, W_expected, atol=1e-6)
