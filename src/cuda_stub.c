/* The CUDA entry points of a build without nvcc: each reports CONVPOOL_ERR_UNSUPPORTED. */
#include "internal.h"

int convpool_cuda_available(void) { return 0; }

convpool_status convpool_cuda_workspace_size(const convpool_problem *p, convpool_precision precision,
                                             convpool_dtype dtype, size_t *bytes)
{
    (void)p;
    (void)precision;
    (void)dtype;
    (void)bytes;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_forward_cuda(const convpool_problem *p, convpool_precision precision,
                                      convpool_dtype dtype, const void *x, const float *weight,
                                      const float *conv_bias, const float *bias, float *pooled,
                                      float *out, void *workspace, size_t workspace_bytes,
                                      void *stream)
{
    (void)p, (void)precision, (void)dtype, (void)x, (void)weight, (void)conv_bias, (void)bias;
    (void)pooled, (void)out, (void)workspace, (void)workspace_bytes, (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_forward_cuda_lowp(const convpool_problem *p, convpool_precision precision,
                                           convpool_dtype dtype, const void *x, const void *weight,
                                           const void *conv_bias, const void *bias, float *pooled,
                                           void *out, void *workspace, size_t workspace_bytes,
                                           void *stream)
{
    (void)p, (void)precision, (void)dtype, (void)x, (void)weight, (void)conv_bias, (void)bias;
    (void)pooled, (void)out, (void)workspace, (void)workspace_bytes, (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_cuda_plan_make(const convpool_problem *p, convpool_precision precision,
                                        convpool_dtype dtype, convpool_cuda_plan *plan)
{
    (void)p, (void)precision, (void)dtype, (void)plan;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_cuda_pool_workspace_size(const convpool_problem *p, size_t *bytes)
{
    (void)p, (void)bytes;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_pool_forward_cuda(const convpool_problem *p, const float *y, const float *bias,
                                           float *pooled, float *out, void *workspace,
                                           size_t workspace_bytes, void *stream)
{
    (void)p, (void)y, (void)bias, (void)pooled, (void)out, (void)workspace, (void)workspace_bytes;
    (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_cuda_pool_cl_workspace_size(const convpool_problem *p, size_t *bytes)
{
    (void)p, (void)bytes;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_pool_forward_cl_cuda(const convpool_problem *p, const float *y, const float *bias,
                                              float *pooled, float *out, void *workspace,
                                              size_t workspace_bytes, void *stream)
{
    (void)p, (void)y, (void)bias, (void)pooled, (void)out, (void)workspace, (void)workspace_bytes;
    (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_pool_forward_train_cuda(const convpool_problem *p, const float *y, const float *bias,
                                                 float *pooled, float *out, void *codes, void *workspace,
                                                 size_t workspace_bytes, void *stream)
{
    (void)p, (void)y, (void)bias, (void)pooled, (void)out, (void)codes, (void)workspace, (void)workspace_bytes;
    (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_forward_train_cuda(const convpool_problem *p, convpool_precision precision,
                                            const float *x, const float *weight, const float *conv_bias,
                                            const float *bias, float *pooled, float *out, void *codes,
                                            void *workspace, size_t workspace_bytes, void *stream)
{
    (void)p, (void)precision, (void)x, (void)weight, (void)conv_bias, (void)bias, (void)pooled, (void)out;
    (void)codes, (void)workspace, (void)workspace_bytes, (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_forward_train_cuda_deferred(const convpool_problem *p, convpool_precision precision,
                                                     const float *x, const float *weight, const float *conv_bias,
                                                     const float *bias, float *pooled, float *out, void *codes,
                                                     void *workspace, size_t workspace_bytes, void *stream)
{
    (void)p, (void)precision, (void)x, (void)weight, (void)conv_bias, (void)bias, (void)pooled, (void)out;
    (void)codes, (void)workspace, (void)workspace_bytes, (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_settle_codes_cuda(const convpool_problem *p, convpool_precision precision, const float *x,
                                           const float *weight, const float *conv_bias, void *codes, void *stream)
{
    (void)p, (void)precision, (void)x, (void)weight, (void)conv_bias, (void)codes, (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_backward_cuda_workspace_size(const convpool_problem *p, convpool_precision precision,
                                                      size_t *bytes)
{
    (void)p, (void)precision, (void)bytes;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_backward_cuda(const convpool_problem *p, convpool_precision precision, const float *x,
                                       const float *weight, const void *codes, const float *grad_pooled,
                                       const float *grad_out, float *grad_x, float *grad_weight,
                                       float *grad_conv_bias, void *workspace, size_t workspace_bytes, void *stream)
{
    (void)p, (void)precision, (void)x, (void)weight, (void)codes, (void)grad_pooled, (void)grad_out, (void)grad_x;
    (void)grad_weight, (void)grad_conv_bias, (void)workspace, (void)workspace_bytes, (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_backward_cuda_strided(const convpool_problem *p, convpool_precision precision,
                                               const float *x, const float *weight, const void *codes,
                                               const float *grad_pooled, const float *grad_out,
                                               int64_t grad_out_stride, float *grad_x, float *grad_weight,
                                               float *grad_conv_bias, void *workspace, size_t workspace_bytes,
                                               void *stream)
{
    if (grad_out_stride < 0) /* refused first, as the CUDA build refuses it */
        return convpool_fail(CONVPOOL_ERR_INVALID_ARGUMENT, "grad_out_stride must be 0 or more, got %lld",
                             (long long)grad_out_stride);
    return convpool_backward_cuda(p, precision, x, weight, codes, grad_pooled, grad_out, grad_x, grad_weight,
                                  grad_conv_bias, workspace, workspace_bytes, stream);
}

convpool_status convpool_backward_cuda_all(const convpool_problem *p, convpool_precision precision, const float *x,
                                           const float *weight, const void *codes, const float *grad_pooled,
                                           const float *grad_out, int64_t grad_out_stride, float *grad_x,
                                           float *grad_weight, float *grad_conv_bias, float *grad_bias,
                                           void *workspace, size_t workspace_bytes, void *stream)
{
    (void)grad_bias;
    return convpool_backward_cuda_strided(p, precision, x, weight, codes, grad_pooled, grad_out, grad_out_stride,
                                          grad_x, grad_weight, grad_conv_bias, workspace, workspace_bytes, stream);
}

convpool_status convpool_tail_train_cuda(const convpool_problem *p, convpool_dtype dtype, const void *y, void *m,
                                         void *codes, void *stream)
{
    (void)p, (void)dtype, (void)y, (void)m, (void)codes, (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}

convpool_status convpool_tail_backward_cuda(const convpool_problem *p, convpool_dtype dtype, const void *codes,
                                            const void *grad_m, void *grad_y, void *stream)
{
    (void)p, (void)dtype, (void)codes, (void)grad_m, (void)grad_y, (void)stream;
    return convpool_fail(CONVPOOL_ERR_UNSUPPORTED, "convpool was built without CUDA");
}
