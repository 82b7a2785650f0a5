/*
 * The interface every CUDA kernel family of convpool answers, CUTLASS style:
 *
 *   <family>_can_implement(problem, dtype, device, why)   can it run this problem here?
 *   <family>_workspace(problem, precision, &ws)            partial sums and scratch it needs
 *   <family>_run(plan, call)                                 launch it on the call's stream
 *
 * plan.cu asks the families in a fixed order of preference and is the only place that
 * decides which one runs; the families never re-derive that choice. Every family writes one
 * float partial window sum per (b, c, part) into the workspace; finish.cu adds the parts in
 * a fixed order (double) and writes P and out.
 */
#ifndef CONVPOOL_CUDA_KERNELS_H
#define CONVPOOL_CUDA_KERNELS_H

#include "common.cuh"

namespace convpool_cuda {

/* The forward's finish where a family's last kernel takes it on instead of finish_run's launch
 * (k3p2's gated TF32 rerun, k3p2_tf32_f32): float32 bias and out (NULL: pooled only), the
 * partials' count a (b, c). */
struct FinishFold {
    const float *bias;
    float *pooled, *out;
    int64_t parts;
};

/* One forward call, as the families see it. */
struct Call {
    Shape s;
    bool strict;
    convpool_dtype dtype;
    const void *x;
    const float *w, *conv_bias;
    float *partials;        /* workspace: [batch][cout][parts] */
    unsigned char *scratch; /* workspace after the partials, 16-byte aligned */
    uint8_t *codes;         /* training forward: [batch][cout][windows] arg-max codes, or NULL
                               (k3p2 with windows of 8, and general; f32 x) */
    int code_bytes;         /* their width: convpool_code_bytes (k3p2: 1) */
    bool defer_settle = false; /* training forward: leave near-tied codes flagged (settle_codes) */
    /* Where not NULL, a family may run the finish itself and then sets *fold_done; forward()
     * launches finish_run otherwise. */
    const FinishFold *fold = nullptr;
    bool *fold_done = nullptr;
    DeviceInfo dev;
    cudaStream_t stream;
};

/* The general kernel's tiling of one problem (general.cu, general_tile). A work item is
 * (16 output channels, b, wh x ww pooled windows in (h, w), pd_chunk pooled d-rows); each conv
 * d-row of its region is computed in n_sh x n_sw sub-tiles of 4 x 32 conv positions. */
struct GeneralTile {
    int64_t wh, ww;          /* pooled windows per item along h and w */
    int64_t n_sh, n_sw;      /* sub-tiles per conv d-row of the item's region */
    int64_t n_th, n_tw;      /* items along pooled h and w */
    int64_t pd_chunk, n_pdc; /* pooled d-rows per item, items along pooled d */
    int64_t row;             /* shared-memory row pitch of a staged input plane, elements */
    int64_t smem;            /* dynamic shared memory, bytes */
};

/* Workspace of one family for one problem. */
struct Workspace {
    int64_t parts;         /* partial sums per (b, c) */
    int64_t scratch_bytes; /* after the partials (packed weights) */
    GeneralTile tile;      /* general only */
    int64_t d_chunk;       /* k3p2: steps (2 conv d-rows each) per item; fewer than all when the
                              batch alone has too few items to fill the GPU */
    int sm90;              /* k3p2: 1 = its wgmma kernel (k3p2_sm90.cu) runs it */
    int64_t h_chunk;       /* k3p2_sm90: pooled h rows per item */
};

/* What plan.cu decided. */
struct Plan {
    convpool_cuda_kernel kernel;
    Workspace ws;
    int64_t partial_bytes, total_bytes; /* total = partials + 16 bytes of alignment + scratch
                                           [+ 16 + pad_bytes] */
    /* Rows of x that are not 16-byte multiples are copied to rows of pad_w elements (pad.cu),
     * pad_batch samples at a time, into pad_bytes of workspace at pad_offset; pad_w == 0: x
     * is read in place. */
    int64_t pad_w, pad_batch, pad_offset, pad_bytes;
    /* 16-bit x: float32 copies of a 16-bit model's weights and conv bias (convpool_forward_cuda_lowp)
     * at param_offset, 16-byte aligned from the workspace's start; 0 for f32 x. */
    int64_t param_offset;
};

/* Bytes of the packed A fragments (pack.cu): per (16-channel output group, 8-channel input
 * group, [big, small], tap, lane) one uint4. */
int64_t packed_weight_bytes(const convpool_problem &p, bool strict);
convpool_status pack_weights(const Shape &s, bool strict, const float *w, void *packed, const DeviceInfo &dev,
                             cudaStream_t st);

bool k3p2_can_implement(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why, size_t n);
Workspace k3p2_workspace(const convpool_problem &p, bool strict, convpool_dtype dt, const DeviceInfo &dev);
convpool_status k3p2_run(const Plan &plan, const Call &c);
/* Whether k3p2's mma.sync kernel runs a problem on its float16-operand instance: TF32 on f32
 * x with pool 2^3, from 2^21 x positions (CONVPOOL_K3P2_F16 = 0 / 1 overrides the size). The
 * dispatch (k3p2_tf32_f32) and the plan's description both ask it. */
bool k3p2_f16_picks(const Shape &s, bool strict, convpool_dtype dt);

/* k3p2_sm90.cu: k3p2's TF32 pool-2^3 problems on sm_90a wgmma, inside the k3p2 family (the
 * plan's ws.sm90). fits: whether it takes this problem here (a build with sm_90a code, a cc 9.0
 * GPU, TF32, f32 x, tiles that use their rows; CONVPOOL_K3P2_SM90 = 0 / 1 overrides). */
bool k3p2_sm90_fits(const convpool_problem &p, convpool_dtype dt, bool strict, const DeviceInfo &dev);
void k3p2_sm90_workspace(const convpool_problem &p, const DeviceInfo &dev, Workspace *ws);
convpool_status k3p2_sm90_run(const Plan &plan, const Call &c);

bool group_can_implement(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why, size_t n);
Workspace group_workspace(const convpool_problem &p, bool strict);
convpool_status group_run(const Plan &plan, const Call &c);

bool general_can_implement(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why,
                           size_t n);
/* Whether the general kernel's CODES instance fits shared memory on this tile. */
bool general_codes_fit(const GeneralTile &t, const DeviceInfo &dev);
Workspace general_workspace(const convpool_problem &p, bool strict, convpool_dtype dt, const DeviceInfo &dev);
convpool_status general_run(const Plan &plan, const Call &c);
/* general.cu: the training forward's near-ties (f32 x). near_tie_xmax writes max|x| of c's x as
 * float bits to xmax (device memory; NaN under CONVPOOL_TEST_RECHECK_ALL=1, which makes every
 * window a near-tie); recheck_codes recomputes the conv values of each window whose code is
 * flag and writes its pick: in FP32 for TF32 codes, in double (rounded to FP32) for strict.
 * flat_first: settle the flagged windows of flat fields first, once a window for all channels
 * (flat_codes_kernel; the general kernel's codes, where nothing else catches them). */
convpool_status near_tie_xmax(const Call &c, unsigned *xmax);
convpool_status recheck_codes(const Call &c, uint32_t flag, bool flat_first);

bool generic_can_implement(const convpool_problem &p, convpool_dtype dt, const DeviceInfo &dev, char *why,
                           size_t n);
Workspace generic_workspace(const convpool_problem &p, bool strict);
convpool_status generic_run(const Plan &plan, const Call &c);

/* pad.cu: W rounded up to a whole 16-byte chunk of dt; rows rows of w elements copied to
 * rows of pitch elements (tail zeroed). */
int64_t padded_width(int64_t w, convpool_dtype dt);
convpool_status pad_rows(const void *x, int64_t rows, int64_t w, int64_t pitch, convpool_dtype dt, void *out,
                         const DeviceInfo &dev, cudaStream_t st);

/* pack.cu: a 16-bit model's weights (nw) and conv bias (ncb, may be 0) widened to float32 into
 * dst (weights, then the conv bias). */
convpool_status widen_params(convpool_dtype dt, const void *w, int64_t nw, const void *cb, int64_t ncb, float *dst,
                             const DeviceInfo &dev, cudaStream_t st);

/* finish.cu: P and out from the partial sums. bias and out are of type out_dt (F32, or the
 * 16-bit dtype of convpool_forward_cuda_lowp, whose rounding steps the kernel follows).
 * dependent: the kernel ahead of it in the stream is the forward family's own (a programmatic
 * dependent launch on cc 9.x, launch_dependent in common.cuh). */
convpool_status finish_run(const Shape &s, const float *partials, int64_t parts, const void *bias, float *pooled,
                           void *out, convpool_dtype out_dt, const DeviceInfo &dev, cudaStream_t st,
                           bool dependent = false);

/* finish.cu: the unfused second half. Partial window sums of a materialised conv output y
 * (conv bias included, float32), parts per (b, c) as pool_parts says. */
int64_t pool_parts(const convpool_problem &p);
convpool_status pool_run(const Shape &s, const float *y, float *partials, int64_t parts, const DeviceInfo &dev,
                         cudaStream_t st);

/* finish.cu: pool_run for y in channels-last layout [b][d][h][w][c]; parts per (b, c) as
 * pool_cl_parts says. */
int64_t pool_cl_parts(const convpool_problem &p);
convpool_status pool_cl_run(const Shape &s, const float *y, float *partials, int64_t parts, const DeviceInfo &dev,
                            cudaStream_t st);
/* finish.cu: pool_run, also writing the arg-max code of every window (code_bytes 1, 2 or 4). */
convpool_status pool_train_run(const Shape &s, const float *y, float *partials, int64_t parts, void *codes,
                               int code_bytes, const DeviceInfo &dev, cudaStream_t st);

/* finish.cu: the divide and the max pool on a conv output y of dtype dt, writing the pooled m
 * and the codes (convpool_tail_train_cuda); and their backward, the dense gradient of y from
 * the codes and m's gradient (convpool_tail_backward_cuda). */
convpool_status tail_train_run(const Shape &s, convpool_dtype dt, const void *y, float inv_d, void *m, void *codes,
                               int code_bytes, const DeviceInfo &dev, cudaStream_t st);
convpool_status tail_backward_run(const Shape &s, convpool_dtype dt, const void *codes, int code_bytes,
                                  const void *grad_m, float inv_d, void *grad_y, const DeviceInfo &dev,
                                  cudaStream_t st);

/* backward.cu: the fused backward from the codes. */
struct BackwardCall {
    Shape s;
    const float *x, *w, *grad_pooled, *grad_out;
    int64_t go_stride; /* grad_out[b * go_stride]: 1 dense, 0 one value for every sample */
    const void *codes;
    int code_bytes;
    float *grad_x, *grad_w, *grad_cb;
    float *grad_bias; /* [cout]: sum_b grad_out[b] (weight_reduce_kernel), or NULL */
    unsigned *flags;  /* workspace head: inf or NaN in x / the weights (backward.cu's NF_X, NF_W) */
    uint8_t *nf_mask; /* grad_weight: after the flags, [cout][cin * taps] NaN marks (NF_X) */
    float *partial_w; /* after backward_weight_head_bytes(): [parts][cout][cin * taps] */
    bool strict;      /* grad_weight's products: x in two TF32 halves (STRICT) or one (TF32) */
    DeviceInfo dev;
    cudaStream_t stream;
};
int64_t backward_workspace_bytes(const convpool_problem &p, bool strict);
/* The workspace's head, all that a call without grad_weight needs. */
int64_t backward_flags_bytes();
/* The flags and grad_weight's NaN marks: where its partials start. */
int64_t backward_weight_head_bytes(const Shape &s);
/* Coordinates inside one sample and channel, taps and window positions below 2^31. */
bool backward_fits(const convpool_problem &p);
convpool_status backward_run(const BackwardCall &c);

} // namespace convpool_cuda

#endif /* CONVPOOL_CUDA_KERNELS_H */
