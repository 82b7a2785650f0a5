/*
 * convpool: Conv3d -> divide -> MaxPool3d -> global mean -> + bias -> sum over channels,
 * fused so the convolution output never reaches memory.
 *
 * The block (PyTorch semantics are the specification):
 *   y      = conv3d(x, weight, conv_bias)           stride 1, no padding
 *   m      = max_pool3d(y / divisor, pool)           stride = pool, floor mode, NaN propagates
 *   P[b,c] = mean over pooled positions of m[b,c]
 *   out[b] = sum_c (P[b,c] + bias[c])
 *
 * Layouts (all contiguous, row-major):
 *   x       [batch][in_channels][in_d][in_h][in_w]
 *   weight  [out_channels][in_channels][kernel_d][kernel_h][kernel_w]
 *   conv_bias, bias  [out_channels]
 *   pooled  [batch][out_channels]       (P)
 *   out     [batch]
 *
 * Every function returns a convpool_status. On failure convpool_last_error() gives a
 * message that names the offending argument or field; the message is per thread.
 * Nothing in the library aborts, and no function writes its outputs on failure.
 *
 * Outputs (pooled, out, a CUDA workspace) must not overlap any input (x, weight, conv_bias,
 * bias) or each other: a forward that finds such an overlap returns
 * CONVPOOL_ERR_INVALID_ARGUMENT naming both buffers. Inputs may share memory.
 *
 * This header is valid C11 and C++.
 */
#ifndef CONVPOOL_H
#define CONVPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CONVPOOL_VERSION_MAJOR 0
#define CONVPOOL_VERSION_MINOR 1
#define CONVPOOL_VERSION_PATCH 0

typedef enum convpool_status {
    CONVPOOL_OK = 0,
    CONVPOOL_ERR_NULL_POINTER = 1,     /* a required pointer is NULL */
    CONVPOOL_ERR_INVALID_SIZE = 2,     /* a size is zero or negative */
    CONVPOOL_ERR_INPUT_TOO_SMALL = 3,  /* an input extent is smaller than the kernel */
    CONVPOOL_ERR_EMPTY_OUTPUT = 4,     /* a pooled extent is zero (conv extent < pool) */
    CONVPOOL_ERR_OVERFLOW = 5,         /* a size product overflows int64 */
    CONVPOOL_ERR_INVALID_ARGUMENT = 6, /* any other bad argument (threads, precision, dtype, ...) */
    CONVPOOL_ERR_OUT_OF_MEMORY = 7,
    CONVPOOL_ERR_WORKSPACE = 8,        /* workspace missing or smaller than the query said */
    CONVPOOL_ERR_UNSUPPORTED = 9,      /* built without CUDA, or no usable GPU */
    CONVPOOL_ERR_CUDA = 10             /* a CUDA runtime call failed; the message quotes it */
} convpool_status;

/* One problem. The caller sets the first block; convpool_problem_validate derives the rest. */
typedef struct convpool_problem {
    int64_t batch, in_channels, out_channels;
    int64_t in_d, in_h, in_w;
    int64_t kernel_d, kernel_h, kernel_w;
    int64_t pool_d, pool_h, pool_w;
    double divisor;
    /* derived */
    int64_t conv_d, conv_h, conv_w;       /* in - kernel + 1 */
    int64_t pooled_d, pooled_h, pooled_w; /* floor(conv / pool) */
} convpool_problem;

/* Precision of the convolution's multiplies on the GPU. The CPU paths are always FP32
 * (fused) or FP64 (reference). */
typedef enum convpool_precision {
    CONVPOOL_PRECISION_TF32 = 0,   /* operands rounded to TF32 (nearest), FP32 accumulate; some
                                      kernels round them to float16 instead, the same 11
                                      significant bits, with each output channel's weights
                                      scaled by a power of two into its range, and rerun in
                                      TF32 where x or the weights leave it */
    CONVPOOL_PRECISION_STRICT = 1  /* FP32-accurate */
} convpool_precision;

/* Element type of x on the GPU. weight, biases and outputs are always float32. */
typedef enum convpool_dtype {
    CONVPOOL_DTYPE_F32 = 0,
    CONVPOOL_DTYPE_F16 = 1,
    CONVPOOL_DTYPE_BF16 = 2
} convpool_dtype;

/* Fills the caller-set fields (derived fields zero). Does not validate. */
convpool_problem convpool_problem_make(int64_t batch, int64_t in_channels, int64_t out_channels,
                                       int64_t in_d, int64_t in_h, int64_t in_w,
                                       int64_t kernel_d, int64_t kernel_h, int64_t kernel_w,
                                       int64_t pool_d, int64_t pool_h, int64_t pool_w,
                                       double divisor);

/* KernelBench level 2 #8: x (128, 8, 16, 64, 64), 16 out channels, kernel 3, pool 2, divisor 2. */
convpool_problem convpool_problem_headline(void);

/* Checks the caller-set fields and fills the derived ones. Checks, in order: NULL, sizes
 * not positive, input smaller than kernel, pooled extent zero, int64 overflow of
 * x/weight/conv-output element counts. The divisor may be any double (0, inf, NaN give
 * what PyTorch gives). */
convpool_status convpool_problem_validate(convpool_problem *p);

/* Element counts of a problem: exact for a validated one; -1 when p is NULL, a factor is not
 * positive or the product overflows int64 (possible only for a problem that failed, or never
 * had, validation). */
int64_t convpool_x_numel(const convpool_problem *p);
int64_t convpool_weight_numel(const convpool_problem *p);
/* Multiply-adds x 2 of the direct convolution. */
double convpool_problem_flops(const convpool_problem *p);

const char *convpool_status_name(convpool_status s);
/* Message for the last failure on this thread ("" if none). */
const char *convpool_last_error(void);

/*
 * THE REFERENCE. The literal, unfused computation: materialises the whole conv output,
 * divides, max-pools, averages, adds bias, sums. Each conv value is accumulated in double and
 * then rounded to float, and divided in float, as PyTorch's float32 conv output and division
 * are (so a conv value beyond FLT_MAX is inf, as in PyTorch); pooling, the mean and the sums
 * are double.
 * Written for clarity, not speed; it is the oracle every other path is tested against.
 * conv_bias may be NULL (no conv bias). out may be NULL, and then bias may be NULL.
 * Allocates the conv output for one (batch, channel) plane at a time.
 */
convpool_status convpool_forward_reference(const convpool_problem *p, const float *x,
                                           const float *weight, const float *conv_bias,
                                           const float *bias, float *pooled, float *out);

/*
 * THE REFERENCE BACKWARD: the gradients PyTorch's autograd gives for the Model, literally and in
 * double, the oracle for the fused backwards. Incoming gradients: grad_pooled [batch][out_channels]
 * for P and grad_out [batch] for out (out = sum_c P + bias), either may be NULL (zero); with
 * G[b][c] = grad_pooled[b][c] + grad_out[b]:
 *   the mean hands G / N to each pooled window (N pooled positions), max_pool3d to its arg-max
 *   (PyTorch's rule on the float32 values conv/divisor: scan d, h, w; a value replaces the
 *   running max when it is greater or NaN; -inf start), the division gives dy = dq / divisor at
 *   EVERY conv position (0 / 0 is NaN: divisor 0 makes the gradients NaN as in PyTorch), and
 *   the convolution's backward is dense: grad_weight = sum_p dy[p] x[p + tap],
 *   grad_x[q] = sum dy[q - tap] w[tap], grad_conv_bias = sum_p dy[p] (so an inf or NaN in x or
 *   the weight reaches the gradients through 0 * inf, as it does in PyTorch);
 *   grad_bias[c] = sum_b grad_out[b].
 * Any output may be NULL (not computed); outputs must not overlap inputs or each other.
 * Allocates one conv plane and one sample of grad_x in double.
 */
convpool_status convpool_backward_reference(const convpool_problem *p, const float *x,
                                            const float *weight, const float *conv_bias,
                                            const float *grad_pooled, const float *grad_out,
                                            float *grad_x, float *grad_weight,
                                            float *grad_conv_bias, float *grad_bias);

/*
 * The fast CPU path: fused, never materialises the conv output. OpenMP over fixed work
 * items (batch item x block of pooled d/h/w, all channels inside an item), AVX-512/AVX2
 * microkernels picked at run time, Winograd F(2x2, 3x3) over (h, w) for 3x3 kernels with
 * even pools. threads = 0 uses omp_get_max_threads(); any count is capped at the processors
 * OpenMP may use (omp_get_num_procs(), within omp_get_thread_limit(), at most 1024), so a huge
 * request or OMP_NUM_THREADS cannot exhaust the OpenMP runtime. Deterministic: bit-identical across
 * runs, thread counts and ISA variants, and a sample's result does not depend on the rest
 * of the batch. Scratch is per-thread buffers plus partial sums capped at 32 MiB. Same
 * pointer rules as the reference.
 */
convpool_status convpool_forward_cpu(const convpool_problem *p, const float *x,
                                     const float *weight, const float *conv_bias,
                                     const float *bias, float *pooled, float *out, int threads);

/* 1 if convpool_forward_cpu takes its Winograd path for p's shape (kernel 3 in h and w, even
 * pool_h and pool_w, and its per-thread scratch within bounds; weights that are not finite or
 * huge still turn it off at the call), else 0, also for a NULL or invalid problem. The direct
 * path it falls back to is slower than a vendor convolution on wide channels: the PyTorch
 * binding routes such problems to PyTorch's conv. Never fails. */
int convpool_cpu_winograd(const convpool_problem *p);

/* The threads convpool_forward_cpu and the other CPU calls start at most for `threads` (0:
 * omp_get_max_threads()), after the cap above; at least 1, and 1 in a build without OpenMP.
 * A call starts fewer when it has fewer work items. Never fails (a negative count, which the
 * calls refuse, gives 1). */
int convpool_cpu_thread_count(int threads);

/* 1 if this build has CUDA and a device it can run on is present, else 0. Never fails. */
int convpool_cuda_available(void);

/* Bytes of device workspace convpool_forward_cuda needs for this problem on the current
 * device. */
convpool_status convpool_cuda_workspace_size(const convpool_problem *p, convpool_precision precision,
                                             convpool_dtype dtype, size_t *bytes);

/*
 * The fused GPU forward on the current device. All pointers are device pointers; x is of
 * type dtype, the rest float32. stream is a cudaStream_t (NULL = legacy default stream).
 * Never synchronises the host, never allocates; workspace must hold at least
 * convpool_cuda_workspace_size bytes (may be NULL if that is 0). Safe to capture in a CUDA
 * graph. Deterministic. conv_bias may be NULL; out may be NULL, and then bias may be NULL.
 */
convpool_status convpool_forward_cuda(const convpool_problem *p, convpool_precision precision,
                                      convpool_dtype dtype, const void *x, const float *weight,
                                      const float *conv_bias, const float *bias, float *pooled,
                                      float *out, void *workspace, size_t workspace_bytes,
                                      void *stream);

/*
 * The forward of a float16 or bfloat16 model, as such a PyTorch module holds it: x, weight,
 * conv_bias (may be NULL) and bias in dtype (CONVPOOL_DTYPE_F16 or CONVPOOL_DTYPE_BF16),
 * pooled in float32 (the exact means, as convpool_forward_cuda writes them) and out in dtype.
 * The parameters are widened to float32 inside the workspace (convpool_cuda_workspace_size
 * for a 16-bit dtype leaves room for them) and the convolution runs as convpool_forward_cuda's.
 * The block's tail rounds as PyTorch's ops on tensors of that dtype round it:
 * out[b] = dtype(sum over c, accumulated in float, of dtype(float(dtype(P[b][c])) + bias[c])).
 * out may be NULL, and then bias may be NULL. Same rules as convpool_forward_cuda; it spares
 * a caller the float32 copies of the parameters and the tail's separate launches.
 */
convpool_status convpool_forward_cuda_lowp(const convpool_problem *p, convpool_precision precision,
                                           convpool_dtype dtype, const void *x, const void *weight,
                                           const void *conv_bias, const void *bias, float *pooled,
                                           void *out, void *workspace, size_t workspace_bytes,
                                           void *stream);

/*
 * The plan: which CUDA kernel family runs a problem, with what tile, and why. It is the one
 * place the GPU dispatch is decided; convpool_forward_cuda follows it, and the CLI
 * (--explain) and Python (convpool.explain) print it. Families, fastest first:
 */
typedef enum convpool_cuda_kernel {
    CONVPOOL_CUDA_KERNEL_K3P2 = 0,    /* kernel 3^3, Cin <= 8, Cout <= 16, pool 2^3 (the headline)
                                         or pool_h in {1,2,4}, pool_w in {1,2,4,8}, any pool_d
                                         (on H100/H200 some TF32 pool-2^3 rows run its wgmma
                                         kernel; the description says "sm_90a wgmma"; large
                                         TF32 pool-2^3 problems on f32 x run float16-operand
                                         MMAs, which the description names) */
    CONVPOOL_CUDA_KERNEL_GROUP = 1,   /* kernel 1^3, 2^3 or 3^3, any channel counts, the same pools */
    CONVPOOL_CUDA_KERNEL_GENERAL = 2, /* any kernel whose staged input plane fits in shared memory
                                         (kernel_h up to ~40 for f32 x, ~80 for 16-bit x;
                                         any kernel_w), any pool */
    CONVPOOL_CUDA_KERNEL_GENERIC = 3  /* scalar fallback for kernels taller than that */
} convpool_cuda_kernel;

typedef struct convpool_cuda_plan {
    convpool_cuda_kernel kernel;
    size_t workspace_bytes;  /* what convpool_cuda_workspace_size returns */
    int64_t parts;           /* partial window sums per (b, c) in the workspace */
    char description[512];   /* one line: kernel, tile, and why it was chosen */
} convpool_cuda_plan;

/* The plan for this problem on the current device. Without a usable GPU it plans for an
 * sm_90 device (132 SMs, 227 KB of shared memory per block) and says so in the description. */
convpool_status convpool_cuda_plan_make(const convpool_problem *p, convpool_precision precision,
                                        convpool_dtype dtype, convpool_cuda_plan *plan);

/* "k3p2", "group", "general", "generic" (or "unknown"). */
const char *convpool_cuda_kernel_name(convpool_cuda_kernel kernel);

/*
 * The unfused second half on the GPU, for callers that run the convolution themselves (the
 * PyTorch binding does, with cuDNN, where that is faster than the fused kernels): y is the
 * conv output with the conv bias added, float32 [batch][out_channels][conv_d][conv_h][conv_w],
 * contiguous. Divides, max-pools, averages, adds bias and sums exactly as the fused forward.
 * Same rules as convpool_forward_cuda: no sync, no allocation, workspace from the query.
 */
convpool_status convpool_cuda_pool_workspace_size(const convpool_problem *p, size_t *bytes);
convpool_status convpool_pool_forward_cuda(const convpool_problem *p, const float *y, const float *bias,
                                           float *pooled, float *out, void *workspace,
                                           size_t workspace_bytes, void *stream);

/* The same for y in channels-last layout, float32 [batch][conv_d][conv_h][conv_w][out_channels]
 * contiguous (what cuDNN writes for channels-last tensors), with its own workspace query. */
convpool_status convpool_cuda_pool_cl_workspace_size(const convpool_problem *p, size_t *bytes);
convpool_status convpool_pool_forward_cl_cuda(const convpool_problem *p, const float *y, const float *bias,
                                              float *pooled, float *out, void *workspace,
                                              size_t workspace_bytes, void *stream);

/*
 * TRAINING ON THE GPU. The forward saves, per (b, c, pooled window), a code: the position of
 * the element PyTorch's max_pool3d picks on the float32 values conv / divisor (raster d, h, w
 * inside the window, 0 .. pool_d*pool_h*pool_w - 1). convpool_code_bytes: 1 when a window
 * has at most 256 positions, 2 up to 65536, else 4 (0 for a NULL problem); codes are
 * [batch][out_channels][pooled_d][pooled_h][pooled_w] unsigned integers of that width
 * (convpool_codes_size bytes). A window of more than 2^32 positions has no code: every entry
 * below that writes or reads codes, and convpool_codes_size, returns
 * CONVPOOL_ERR_INVALID_ARGUMENT naming pool_d, pool_h and pool_w for it, touching nothing
 * (the inference forwards take such problems).
 *
 * convpool_pool_forward_train_cuda is convpool_pool_forward_cuda (same workspace) that also
 * writes the codes. convpool_forward_train_cuda is convpool_forward_cuda on float32 x (same
 * workspace, convpool_cuda_workspace_size) that also writes the codes of its own conv values,
 * so no conv output is ever materialised; pooled and out are convpool_forward_cuda's, bit for
 * bit. The codes are the picks on its own conv values in TF32 (the general kernel rechecks
 * near-ties in FP32); in STRICT those of the correctly rounded FP32 conv (near-ties, within a
 * bound on its 3xTF32 error, recomputed in double), deterministic in both. It serves the problems the plan gives the k3p2 kernel with pool 2^3 (kernel 3^3,
 * Cin <= 8, Cout <= 16) or the general kernel (any pool; 12 more bytes of shared memory per
 * (channel, window) of its tile) and returns CONVPOOL_ERR_UNSUPPORTED, touching nothing, for
 * any other (then: a conv, then convpool_pool_forward_train_cuda).
 * convpool_forward_train_cuda_deferred is convpool_forward_train_cuda without its last step,
 * the recomputation of near-tied windows: their codes may hold the flag value (every bit of
 * the code width set) until convpool_settle_codes_cuda, called with the same problem,
 * precision, x, weight and conv_bias on the same device, settles them in place. pooled and out
 * are final either way, and forward_train_cuda is the two calls in a row. The PyTorch binding
 * defers the settling to the backward, so a forward with gradients enabled whose output is
 * never differentiated pays only for the codes kernel (the recheck is the general kernel's
 * FP32 recompute in TF32 and every strict problem's double recompute). Settling is a no-op,
 * launching nothing, where the plan's codes are always final (k3p2 in TF32, the pooling
 * kernel's codes of a conv output), and settling settled codes changes nothing. It needs no
 * workspace, neither synchronises nor allocates, and reads x, weight and conv_bias (may be
 * NULL) as the forward did: they must not change in between.
 * convpool_backward_cuda computes, from x, the weights and the codes, the
 * gradients convpool_backward_reference defines, for incoming grad_pooled [batch][out_channels]
 * and grad_out [batch] (either may be NULL: zero): grad_x (x's layout), grad_weight
 * (the weight's), grad_conv_bias [out_channels]; any output may be NULL (not computed). It is
 * exact in that definition's terms for a finite nonzero divisor, inf and NaN in x and the
 * weights included: the sparse form alone would leave out the dense backward's 0 * inf terms,
 * so it finds such values on the device (a pass over x when grad_weight is asked, over the
 * weights when grad_x is) and adds those terms itself, with no host synchronisation.
 * Incoming gradients may hold NaN (as dense: it reaches what its windows reach); an inf in
 * them differs in one respect: grad_weight forms S * (sum of x) per (sample, channel), which
 * is +-inf where the dense sum of S * x terms of both signs is NaN.
 * precision is the forward's: grad_weight's sums of x run on the tensor cores with x rounded
 * to TF32 (TF32, as cuDNN's weight gradient rounds it) or split in two TF32 halves (STRICT,
 * FP32-accurate); the workspace depends on it. grad_x is FP32-accurate in STRICT; in TF32 its
 * terms S * w may be rounded once to 11 significant bits, as cuDNN's TF32 dgrad rounds its
 * operands (they are on cc 9.0 GPUs, H100/H200, for kernel 3, pool 2, Cin <= 8, 8 <= Cout <= 16
 * and batch x D x H x W at least 2^18; elsewhere FP32-accurate too). grad_conv_bias is
 * FP32-accurate in both. Float32 x; deterministic (no atomics on outputs): the same bits on
 * every call on one GPU model (grad_weight's split into partial sums follows the GPU's SM
 * count and occupancy, so its last bits may differ between GPU models); no sync, no
 * allocation; the workspace from the query, needed when grad_weight or grad_x is asked. A
 * call that asks grad_x without grad_weight needs only CONVPOOL_BACKWARD_X_WORKSPACE_BYTES of
 * it, so a caller may run grad_x and grad_weight as two calls on two streams (they read the
 * same inputs and write disjoint outputs), each with a workspace of its own.
 */
#define CONVPOOL_BACKWARD_X_WORKSPACE_BYTES 256
int convpool_code_bytes(const convpool_problem *p);
convpool_status convpool_codes_size(const convpool_problem *p, size_t *bytes);
convpool_status convpool_pool_forward_train_cuda(const convpool_problem *p, const float *y, const float *bias,
                                                 float *pooled, float *out, void *codes, void *workspace,
                                                 size_t workspace_bytes, void *stream);
convpool_status convpool_forward_train_cuda(const convpool_problem *p, convpool_precision precision,
                                            const float *x, const float *weight, const float *conv_bias,
                                            const float *bias, float *pooled, float *out, void *codes,
                                            void *workspace, size_t workspace_bytes, void *stream);
convpool_status convpool_forward_train_cuda_deferred(const convpool_problem *p, convpool_precision precision,
                                                     const float *x, const float *weight, const float *conv_bias,
                                                     const float *bias, float *pooled, float *out, void *codes,
                                                     void *workspace, size_t workspace_bytes, void *stream);
convpool_status convpool_settle_codes_cuda(const convpool_problem *p, convpool_precision precision, const float *x,
                                           const float *weight, const float *conv_bias, void *codes, void *stream);
convpool_status convpool_backward_cuda_workspace_size(const convpool_problem *p, convpool_precision precision,
                                                      size_t *bytes);
convpool_status convpool_backward_cuda(const convpool_problem *p, convpool_precision precision, const float *x,
                                       const float *weight, const void *codes, const float *grad_pooled,
                                       const float *grad_out, float *grad_x, float *grad_weight,
                                       float *grad_conv_bias, void *workspace, size_t workspace_bytes, void *stream);
/* convpool_backward_cuda with sample b's grad_out at grad_out[b * grad_out_stride]: 1 is the
 * dense vector above, 0 one value for every sample (what autograd passes for a scalar loss,
 * out.sum()'s gradient expanded over the batch), so such a caller need not copy it. Negative
 * strides are refused. */
convpool_status convpool_backward_cuda_strided(const convpool_problem *p, convpool_precision precision,
                                               const float *x, const float *weight, const void *codes,
                                               const float *grad_pooled, const float *grad_out,
                                               int64_t grad_out_stride, float *grad_x, float *grad_weight,
                                               float *grad_conv_bias, void *workspace, size_t workspace_bytes,
                                               void *stream);
/* convpool_backward_cuda_strided that also writes grad_bias [out_channels] (may be NULL), the
 * reference's: grad_bias[c] = sum_b grad_out[b * grad_out_stride] for every c (0 where grad_out
 * is NULL), summed in double in a fixed order for a given batch and rounded once, in the launch
 * that reduces grad_weight (so an autograd caller needs no reduction of its own). It needs no
 * workspace of its own: grad_bias alone, like grad_conv_bias alone, takes none. */
convpool_status convpool_backward_cuda_all(const convpool_problem *p, convpool_precision precision,
                                           const float *x, const float *weight, const void *codes,
                                           const float *grad_pooled, const float *grad_out,
                                           int64_t grad_out_stride, float *grad_x, float *grad_weight,
                                           float *grad_conv_bias, float *grad_bias, void *workspace,
                                           size_t workspace_bytes, void *stream);

/*
 * TRAINING ON THE CPU, the same definitions: convpool_pool_codes_cpu writes the codes of a conv
 * output y (float32 [batch][out_channels][conv_d][conv_h][conv_w], conv bias added), and
 * convpool_backward_cpu the gradients from them, with the same contract as
 * convpool_backward_cuda for a finite nonzero divisor and finite x and weights (any output
 * may be NULL); unlike it, it leaves out the dense backward's 0 * inf terms, so a caller with
 * non-finite x or weights uses a dense backward (the PyTorch binding checks and does). OpenMP over fixed work items (threads as convpool_forward_cpu): results
 * are bit-identical for any thread count. The backward uses an x-sized scratch (x or grad_x
 * channels-last) and returns CONVPOOL_ERR_OUT_OF_MEMORY when it cannot allocate it; the
 * scratch is kept for the next call (a training loop would page-fault a fresh one in every
 * step): one per process, reused while it is at most 4x x's size, freed by
 * convpool_cpu_release_scratch (safe to call at any time). It reads the
 * codes once first and refuses one past its window (CONVPOOL_ERR_INVALID_ARGUMENT, naming it)
 * before writing anything; the CUDA backward cannot read device codes on the host and trusts
 * them: pass it only codes a training forward wrote.
 */
convpool_status convpool_pool_codes_cpu(const convpool_problem *p, const float *y, void *codes, int threads);
/* The same codes straight from x, the weights and the conv bias (may be NULL), fused as the
 * forward is (the conv values never reach memory: convpool_forward_cpu's Winograd pieces for
 * kernel 3 in h and w with even pools, a finite nonzero divisor and finite conv biases, with
 * near-ties recomputed in double; else its direct microkernels). Bit-identical for any thread
 * count. convpool_forward_train_cpu is convpool_forward_cpu (same pooled and out, bit for bit)
 * that also writes those codes from the same pass, for a training step's forward. */
convpool_status convpool_codes_cpu(const convpool_problem *p, const float *x, const float *weight,
                                   const float *conv_bias, void *codes, int threads);
convpool_status convpool_forward_train_cpu(const convpool_problem *p, const float *x, const float *weight,
                                           const float *conv_bias, const float *bias, float *pooled, float *out,
                                           void *codes, int threads);
convpool_status convpool_backward_cpu(const convpool_problem *p, const float *x, const float *weight,
                                      const void *codes, const float *grad_pooled, const float *grad_out,
                                      float *grad_x, float *grad_weight, float *grad_conv_bias, int threads);
void convpool_cpu_release_scratch(void);

/*
 * TRAINING THROUGH A CONV OUTPUT: the divide and the max pool for a caller that runs the
 * convolution and the mean itself and differentiates them with its own backward (the PyTorch
 * binding, for the problems the fused backward does not take: wide channels, bfloat16,
 * autocast). y is the conv output, conv bias added, [batch][out_channels][conv_d][conv_h]
 * [conv_w], dense, in dtype (p gives the shapes: conv_* as derived from the input and kernel).
 *
 * convpool_tail_train_{cpu,cuda} write m [batch][out_channels][pooled_d][pooled_h][pooled_w]
 * (dtype) and the codes: PyTorch's max_pool3d of q = y / divisor, bit for bit, with q formed as
 * PyTorch's division forms it on a tensor of dtype (in float32, rounded to dtype; on CUDA as y
 * times the float32 reciprocal of the divisor, on the CPU as a division by it), a window's pick
 * in scan order, a value replacing the running one (which starts at -inf with the first
 * position) when greater or NaN. Only the codes, a byte a window for windows of up to 256
 * positions, are kept for the backward, where PyTorch keeps q's max-pool indices (8 bytes).
 *
 * convpool_tail_backward_{cpu,cuda} write grad_y (dtype, y's layout, every element) from the
 * gradient of m, grad_m (dtype, m's layout), as PyTorch's autograd sends it back through the
 * max pool and the division: grad_m at each window's code position, 0 elsewhere (positions past
 * the last whole window too), then each element divided by the divisor and rounded to dtype (as
 * the forward divides). So a zero divisor gives NaN and inf everywhere, as PyTorch's does. A
 * code outside its window gives that window no gradient (nothing is written outside grad_y).
 *
 * Any divisor. Deterministic and exact: no sums. The CUDA calls neither synchronise nor
 * allocate nor take a workspace, and return CONVPOOL_ERR_UNSUPPORTED in a build without CUDA.
 * threads as convpool_forward_cpu.
 */
convpool_status convpool_tail_train_cpu(const convpool_problem *p, convpool_dtype dtype, const void *y, void *m,
                                        void *codes, int threads);
convpool_status convpool_tail_backward_cpu(const convpool_problem *p, convpool_dtype dtype, const void *codes,
                                           const void *grad_m, void *grad_y, int threads);
convpool_status convpool_tail_train_cuda(const convpool_problem *p, convpool_dtype dtype, const void *y, void *m,
                                         void *codes, void *stream);
convpool_status convpool_tail_backward_cuda(const convpool_problem *p, convpool_dtype dtype, const void *codes,
                                            const void *grad_m, void *grad_y, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* CONVPOOL_H */
