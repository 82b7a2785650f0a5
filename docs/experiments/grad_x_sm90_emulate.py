"""Logical emulation of grad_x_sm90_kernel's indexing (src/cuda/backward.cu):
items, code staging, A from codes, B layout (tw' = 2 - kw, co = half*8 + ci), phases, the
shift-add and the store rule, in float64 without TF32 rounding, against a dense reference.
It checks the index arithmetic the kernel uses (every output written exactly once, to
the right value) on odd shapes and 1-3 w tiles; not the wgmma fragment layouts (the same as
k3p2_sm90's, which run) nor synchronisation. numpy only:
  python3 docs/experiments/grad_x_sm90_emulate.py     (~1 minute; prints "ok")"""
import numpy as np

TILE_X, TILE_OUT, MAX_PH, CODE_W = 64, 62, 64, 32
MAX_CHUNK = 2 * (MAX_PH - 3)


def reference(codes, S, w, in_d, in_h, in_w):
    B, C, pd_, ph_, pw_ = codes.shape
    cin = w.shape[1]
    cd, chh, cw = in_d - 2, in_h - 2, in_w - 2
    G = np.zeros((B, C, cd, chh, cw))
    for b in range(B):
        for c in range(C):
            for pd in range(pd_):
                for ph in range(ph_):
                    for pw in range(pw_):
                        k = codes[b, c, pd, ph, pw]
                        G[b, c, 2 * pd + (k >> 2), 2 * ph + ((k >> 1) & 1), 2 * pw + (k & 1)] = S[b, c]
    gx = np.zeros((B, cin, in_d, in_h, in_w))
    for kd in range(3):
        for kh in range(3):
            for kw in range(3):
                # gx[x] += w[k] G[x - k]
                gx[:, :, kd:kd + cd, kh:kh + chh, kw:kw + cw] += np.einsum("bcdhw,ci->bidhw", G, w[:, :, kd, kh, kw])
    return gx


def emulate(codes, S, w, in_d, in_h, in_w, h_chunk=None):
    B, C, pooled_d, pooled_h, pooled_w = codes.shape
    cin = w.shape[1]
    gx = np.full((B, cin, in_d, in_h, in_w), np.nan)
    n_wt = 1 if in_w <= TILE_X else 1 + -(-(in_w - TILE_X) // TILE_OUT)
    if h_chunk is None:  # else a chunk the launch's halving picks to fill the SMs (even, >= 8)
        h_chunk = min(MAX_CHUNK, (in_h + 1) // 2 * 2)
    n_hc = -(-in_h // h_chunk)
    n_pdx = (in_d + 1) // 2
    for b in range(B):
        a = np.zeros(16)
        m = np.zeros(16)
        a[:C] = S[b]  # a * m = S: take m = 1 (indexing only)
        m[:C] = 1.0
        # bsm logical: [kk][t][k (8)][n (48)]
        Bm = np.zeros((2, 9, 8, 48))
        for kk in range(2):
            for t in range(9):
                td, th = t // 3, t % 3
                for kl in range(8):
                    c = 8 * kk + kl
                    for n in range(48):
                        twp, half, ci = n // 16, (n // 8) % 2, n % 8
                        if c < C and ci < cin and half == 0:
                            Bm[kk, t, kl, n] = m[c] * w[c, ci, td, th, 2 - twp]
        for pdx in range(n_pdx):
            for wt in range(n_wt):
                for hc in range(n_hc):
                    xd0, xw0 = 2 * pdx, TILE_OUT * wt
                    xh0 = hc * h_chunk
                    xh1 = min(in_h, xh0 + h_chunk)
                    ph_lo, pw_lo = xh0 // 2 - 1, (TILE_OUT // 2) * wt - 1
                    nph = (xh1 - xh0 + 1) // 2 + 2
                    assert nph <= MAX_PH
                    cs = np.full((16, 2, MAX_PH, CODE_W), 0xFF, dtype=np.int64)
                    for c in range(16):
                        for j in range(2):
                            for phi in range(nph):
                                for pwi in range(CODE_W):
                                    pd, ph, pw = pdx - 1 + j, ph_lo + phi, pw_lo + pwi
                                    if c < C and 0 <= pd < pooled_d and 0 <= ph < pooled_h and 0 <= pw < pooled_w:
                                        cs[c, j, phi, pwi] = codes[b, c, pd, ph, pw]
                    for xh in range(xh0, xh1, 2):
                        phb = (xh - xh0) // 2
                        P = np.zeros((4, 64, 48))
                        for kk in range(2):
                            for dl in range(4):
                                for hl in range(4):
                                    A = np.zeros((64, 8))
                                    for mm in range(64):
                                        tgt = (((dl & 1) * 2 + (hl & 1)) * 2) + (mm & 1)
                                        for kl in range(8):
                                            c = 8 * kk + kl
                                            code = cs[c, dl >> 1, phb + (hl >> 1), mm >> 1]
                                            A[mm, kl] = a[c] if code == tgt else 0.0
                                    for q in range(4):
                                        td, th = (q >> 1) + 2 - dl, (q & 1) + 2 - hl
                                        if 0 <= td <= 2 and 0 <= th <= 2:
                                            P[q] += A @ Bm[kk, td * 3 + th]
                        Pp = np.concatenate([P, np.zeros((4, 2, 48))], axis=1)
                        y = Pp[:, 0:64, 0:16] + Pp[:, 1:65, 16:32] + Pp[:, 2:66, 32:48]
                        for q in range(4):
                            xd, xr = xd0 + (q >> 1), xh + (q & 1)
                            if xd >= in_d or xr >= in_h:
                                continue
                            for mm in range(64):
                                if (mm >= TILE_OUT and xw0 + TILE_X < in_w) or xw0 + mm >= in_w:
                                    continue
                                for ci in range(cin):
                                    assert np.isnan(gx[b, ci, xd, xr, xw0 + mm]), "written twice"
                                    gx[b, ci, xd, xr, xw0 + mm] = y[q, mm, ci] + y[q, mm, 8 + ci]
    return gx


rng = np.random.default_rng(0)
for (B, cin, C, d, h, wdt, hc) in [(1, 8, 16, 6, 8, 64, None), (1, 3, 5, 7, 9, 70, None), (2, 8, 16, 5, 6, 127, None),
                                   (1, 2, 3, 4, 5, 10, None), (1, 8, 16, 4, 21, 30, 8), (1, 4, 7, 5, 19, 66, 10)]:
    pd_, ph_, pw_ = (d - 2) // 2, (h - 2) // 2, (wdt - 2) // 2
    codes = rng.integers(0, 8, size=(B, C, pd_, ph_, pw_))
    S = rng.standard_normal((B, C))
    w = rng.standard_normal((C, cin, 3, 3, 3))
    ref = reference(codes, S, w, d, h, wdt)
    got = emulate(codes, S, w, d, h, wdt, hc)
    assert not np.isnan(got).any(), "unwritten outputs"
    err = np.abs(got - ref).max()
    print((B, cin, C, d, h, wdt), "h chunk", hc, "max err", err)
    assert err < 1e-9
print("ok")
