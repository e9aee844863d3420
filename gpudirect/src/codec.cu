// The i16 + per-chunk scale gradient codec, bit-compatible with the CPU
// codec. Every float operation is an explicit round-to-nearest intrinsic so
// that no multiply and add are ever fused (also compiled with --fmad=false).
// One block per chunk; chunk <= 65535 elements.

#define QMAX 32767.0f

__device__ __forceinline__ unsigned int fmix32(unsigned int h) {
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

template <bool RESIDUAL>
__device__ void absmax_chunks(const float *x, const float *r, unsigned int n,
                              unsigned int chunk, float *absmax) {
    __shared__ float part[256];
    unsigned int c = blockIdx.x;
    unsigned int start = c * chunk;
    unsigned int len = min(chunk, n - start);
    float m = 0.0f;
    for (unsigned int i = threadIdx.x; i < len; i += blockDim.x) {
        float v = x[start + i];
        if (RESIDUAL) v = __fadd_rn(v, r[start + i]);
        m = fmaxf(m, fabsf(v));
    }
    part[threadIdx.x] = m;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) absmax[c] = part[0];
}

template <bool RESIDUAL, bool STOCHASTIC>
__device__ void quantize_chunks(const float *x, float *r, unsigned int n, unsigned int chunk,
                                const float *absmax, unsigned int seed, short *q, float *scales) {
    unsigned int c = blockIdx.x;
    unsigned int start = c * chunk;
    unsigned int len = min(chunk, n - start);
    float am = absmax[c];
    float scale = am == 0.0f ? 0.0f : __fdiv_rn(am, QMAX);
    float inv = am == 0.0f ? 0.0f : __fdiv_rn(QMAX, am);
    if (threadIdx.x == 0) scales[c] = scale;
    for (unsigned int i = threadIdx.x; i < len; i += blockDim.x) {
        float v = x[start + i];
        if (RESIDUAL) v = __fadd_rn(v, r[start + i]);
        float t = 0.0f;
        if (am != 0.0f) {
            if (STOCHASTIC) {
                unsigned int h = fmix32(seed ^ (i * 0x9E3779B9u));
                float u = __fmul_rn(__uint2float_rn(h >> 8), 5.9604644775390625e-8f); // 2^-24
                t = floorf(__fadd_rn(__fmul_rn(v, inv), u));
            } else {
                t = rintf(__fmul_rn(v, inv)); // round half to even
            }
            t = fminf(fmaxf(t, -QMAX), QMAX);
        }
        short qi = (short)t;
        q[start + i] = qi;
        if (RESIDUAL) r[start + i] = __fsub_rn(v, __fmul_rn((float)qi, scale));
    }
}

extern "C" __global__ void absmax_plain(const float *x, unsigned int n, unsigned int chunk, float *am) {
    absmax_chunks<false>(x, 0, n, chunk, am);
}
extern "C" __global__ void absmax_residual(const float *x, const float *r, unsigned int n,
                                           unsigned int chunk, float *am) {
    absmax_chunks<true>(x, r, n, chunk, am);
}
extern "C" __global__ void quantize_nearest(const float *x, unsigned int n, unsigned int chunk,
                                            const float *am, unsigned int seed, short *q, float *s) {
    quantize_chunks<false, false>(x, 0, n, chunk, am, seed, q, s);
}
extern "C" __global__ void quantize_nearest_residual(const float *x, float *r, unsigned int n,
                                                     unsigned int chunk, const float *am,
                                                     unsigned int seed, short *q, float *s) {
    quantize_chunks<true, false>(x, r, n, chunk, am, seed, q, s);
}
extern "C" __global__ void quantize_stochastic(const float *x, unsigned int n, unsigned int chunk,
                                               const float *am, unsigned int seed, short *q, float *s) {
    quantize_chunks<false, true>(x, 0, n, chunk, am, seed, q, s);
}
extern "C" __global__ void quantize_stochastic_residual(const float *x, float *r, unsigned int n,
                                                        unsigned int chunk, const float *am,
                                                        unsigned int seed, short *q, float *s) {
    quantize_chunks<true, true>(x, r, n, chunk, am, seed, q, s);
}

extern "C" __global__ void dequantize(const short *q, const float *scales, unsigned int n,
                                      unsigned int chunk, float *y) {
    unsigned int c = blockIdx.x, start = c * chunk, len = min(chunk, n - start);
    float scale = scales[c];
    for (unsigned int i = threadIdx.x; i < len; i += blockDim.x)
        y[start + i] = __fmul_rn((float)q[start + i], scale);
}

extern "C" __global__ void dequantize_accumulate(const short *q, const float *scales, unsigned int n,
                                                 unsigned int chunk, float *acc) {
    unsigned int c = blockIdx.x, start = c * chunk, len = min(chunk, n - start);
    float scale = scales[c];
    for (unsigned int i = threadIdx.x; i < len; i += blockDim.x)
        acc[start + i] = __fadd_rn(acc[start + i], __fmul_rn((float)q[start + i], scale));
}
