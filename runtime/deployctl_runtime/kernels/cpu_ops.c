/* The CPU float32 path's own operators: paged decode attention, RMSNorm (with the residual add fused), RoPE with the
 * K/V cache store fused, and SiLU-and-multiply. Built and loaded by cpu_kernels.py with the host's C compiler
 * (-O3 -march=native, OpenMP: torch's own libgomp, whose thread pool torch's set_num_threads sizes; the caller
 * passes the thread count).
 *
 * Why: on CPU a decode step's small tensors ([16, 512] and the like) cost far more in torch's per-op dispatch and
 * in the copies between ops than in arithmetic, and the torch decode attention copies every request's context out
 * of the paged cache per layer (bench/bench_forward.py names the parts). Each function here is one pass over its
 * data; vLLM's CPU backend has the same set (csrc/cpu: layernorm, pos_encoding, activation, attention).
 *
 * All arrays are row-major float32 unless named otherwise. Work is split over rows (or (request, KV head) pairs)
 * only when there is enough of it to pay for waking a second thread. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_GROUP 64
#define MAX_DIM 512
#define TILE 32
#define PAR_MIN_ELEMS 65536 /* below this many elements, one thread: a wake-up costs more than the work */

/* e^x for float32 in a form the compiler vectorizes (glibc's expf is scalar without -ffast-math, whose
 * finite-math assumption this file cannot take): x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), e^r by
 * Cephes' expf polynomial (S. Moshier, Cephes Math Library, expf.c; relative error ~2e-7 over the range), times
 * 2^n built in the exponent bits. x below -87.3 gives 0 (and -inf gives 0); x above 88.7 is taken as 88.7 (the
 * callers exponentiate scores minus their max, <= 0, and -g for SiLU, where a finite huge value divides the same). */
static inline float exp_f32(float x) {
    x = x < -87.33654f ? -87.33654f : x; /* n = -126 at most below: 2^n stays normal */
    x = x > 88.7f ? 88.7f : x;
    const float n = rintf(x * 1.44269504088896341f);
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return x <= -87.33654f ? 0.f : p * scale.f;
}

static float row_inv_rms(const float *x, int dim, float eps) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int e = 0; e < dim; ++e) ss += x[e] * x[e];
    return 1.f / sqrtf(ss / (float)dim + eps);
}

/* y = x / sqrt(mean(x^2) + eps) * w, per row of `dim` (HF Llama's order: normalise, then scale).
 * residual == NULL: out = norm(x). Else the fused add: residual = x + residual, out = norm(residual).
 * out may be x (in place); rows of x and out are `dim` apart. */
void rms_norm_f32(const float *x, float *residual, const float *w, float *out, int64_t rows, int dim, float eps,
                  int num_threads) {
#pragma omp parallel for schedule(dynamic, 16) num_threads(num_threads) if (rows * dim >= PAR_MIN_ELEMS)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        const float *src = xr;
        if (residual) {
            float *res = residual + r * dim;
#pragma omp simd
            for (int e = 0; e < dim; ++e) res[e] = xr[e] + res[e];
            src = res;
        }
        const float inv = row_inv_rms(src, dim, eps);
#pragma omp simd
        for (int e = 0; e < dim; ++e) o[e] = (src[e] * inv) * w[e];
    }
}

/* out[r, i] = silu(gu[r, i]) * gu[r, inter + i]: the gated MLP's gate and up halves, silu(g) = g / (1 + e^-g). */
void silu_mul_f32(const float *gu, float *out, int64_t rows, int inter, int num_threads) {
#pragma omp parallel for schedule(dynamic, 16) num_threads(num_threads) if (rows * inter >= PAR_MIN_ELEMS)
    for (int64_t r = 0; r < rows; ++r) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
#pragma omp simd
        for (int i = 0; i < inter; ++i) o[i] = g[i] / (1.f + exp_f32(-g[i])) * u[i];
    }
}

/* In place on qkv [T, stride] (q heads, then k heads, then v heads, each `d` wide, from column 0):
 *   optional per-head RMSNorm of q and k (Qwen3: q_norm_w / k_norm_w [d], NULL for none),
 *   RoPE of q and k, non-interleaved (HF rotate_half): x[i] * cos[i] + x[(i + d/2) % d] * sin[i], with the rows
 *   cos/sin [T, d] already gathered for each token's position and sin signed (-sin on the first half),
 *   then, when k_cache is not NULL, the token's k and v rows stored at slots[t] (int64) of the caches
 *   [nkv, num_slots, d]. */
void rope_store_f32(float *qkv, int64_t T, int64_t stride, int nq, int nkv, int d, const float *cos,
                    const float *sin, const float *q_norm_w, const float *k_norm_w, float eps, float *k_cache,
                    float *v_cache, int64_t num_slots, const int64_t *slots, int num_threads) {
    const int half = d / 2;
#pragma omp parallel for schedule(dynamic, 16) num_threads(num_threads) if (T * stride >= PAR_MIN_ELEMS)
    for (int64_t t = 0; t < T; ++t) {
        float *row = qkv + t * stride;
        const float *c = cos + t * d, *s = sin + t * d;
        float tmp[MAX_DIM];
        for (int h = 0; h < nq + nkv; ++h) {
            float *x = row + (int64_t)h * d;
            const float *nw = h < nq ? q_norm_w : k_norm_w;
            if (nw) {
                const float inv = row_inv_rms(x, d, eps);
#pragma omp simd
                for (int e = 0; e < d; ++e) x[e] = (x[e] * inv) * nw[e];
            }
            memcpy(tmp, x, sizeof(float) * d);
#pragma omp simd
            for (int e = 0; e < half; ++e) x[e] = tmp[e] * c[e] + tmp[e + half] * s[e];
#pragma omp simd
            for (int e = half; e < d; ++e) x[e] = tmp[e] * c[e] + tmp[e - half] * s[e];
        }
        if (k_cache) {
            const int64_t slot = slots[t];
            for (int j = 0; j < nkv; ++j) {
                memcpy(k_cache + ((int64_t)j * num_slots + slot) * d, row + (int64_t)(nq + j) * d, sizeof(float) * d);
                memcpy(v_cache + ((int64_t)j * num_slots + slot) * d, row + (int64_t)(nq + nkv + j) * d,
                       sizeof(float) * d);
            }
        }
    }
}

/* Paged decode attention: one query token per request, K/V read in place from one layer's block-paged cache
 * through the block table (no gather copy); the CPU twin of paged_attention.py's Triton kernel.
 * One (request, KV head) pair per work item, its `group` query heads together so each K and V row is read once for
 * all of them. Online softmax over tiles of TILE tokens (Milakov & Gimelshein 2018, "Online normalizer calculation
 * for softmax"; the flash-decoding form of Dao et al.), accumulated in float32 straight into the output rows.
 *   q       [n, kvh * group, d], rows q_stride apart (a view into qkv)
 *   k, v    [kvh, num_slots, d] (slot = block * block_size + offset)
 *   tables  [n, width] int32 (rows padded with any valid block); lens [n] int32, 1 <= lens[r] <= width * block_size
 *   out     [n, kvh * group, d], contiguous
 * Returns 0, or -1 when group > MAX_GROUP or d > MAX_DIM (the caller checks first). */
/* The pieces both decode bodies share. The K and V rows of tokens [start, start + t_end) of one KV head. */
static inline void tile_rows(const int32_t *table, int start, int t_end, int block_size, int d, const float *kh,
                             const float *vh, const float **krow, const float **vrow) {
    for (int t = 0; t < t_end; ++t) {
        const int p = start + t;
        const int64_t off = ((int64_t)table[p / block_size] * block_size + p % block_size) * d;
        krow[t] = kh + off;
        vrow[t] = vh + off;
    }
}

/* Before a pair's first tile: no maximum yet, nothing summed or accumulated. */
static inline void start_pair(float *m, float *l, float *oh, int group, int d) {
    for (int g = 0; g < group; ++g) { m[g] = -INFINITY; l[g] = 0.f; }
    for (int e = 0; e < group * d; ++e) oh[e] = 0.f;
}

/* Online softmax over one tile of scores s[0, t_end) of one query head: s becomes e^(s - max), the running max m and
 * sum l move on; returns the factor what was accumulated before must be scaled by. */
static inline float softmax_tile(float *s, int t_end, float *m, float *l) {
    float mx = *m;
#pragma omp simd reduction(max : mx)
    for (int t = 0; t < t_end; ++t) mx = s[t] > mx ? s[t] : mx;
    const float corr = exp_f32(*m - mx);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int t = 0; t < t_end; ++t) {
        s[t] = exp_f32(s[t] - mx);
        sum += s[t];
    }
    *l = *l * corr + sum;
    *m = mx;
    return corr;
}

/* The generic body, any d: one (request, KV head) pair. */
static void decode_pair(const float *qh, const float *kh, const float *vh, const int32_t *table, int len, float *oh,
                        int group, int d, int block_size, float scale) {
    float m[MAX_GROUP], l[MAX_GROUP], s[MAX_GROUP][TILE];
    const float *krow[TILE], *vrow[TILE];
    start_pair(m, l, oh, group, d);
    for (int start = 0; start < len; start += TILE) {
        const int t_end = len - start < TILE ? len - start : TILE;
        tile_rows(table, start, t_end, block_size, d, kh, vh, krow, vrow);
        /* scores of the tile: each K row once, against every query head of the group */
        for (int t = 0; t < t_end; ++t) {
            for (int g = 0; g < group; ++g) {
                const float *qg = qh + g * d;
                float acc = 0.f;
#pragma omp simd reduction(+ : acc)
                for (int e = 0; e < d; ++e) acc += qg[e] * krow[t][e];
                s[g][t] = acc * scale;
            }
        }
        for (int g = 0; g < group; ++g) {
            const float corr = softmax_tile(s[g], t_end, &m[g], &l[g]);
            if (corr != 1.f) {
                float *og = oh + g * d;
#pragma omp simd
                for (int e = 0; e < d; ++e) og[e] *= corr;
            }
        }
        /* weighted V rows: each V row once, into every query head's accumulator */
        for (int t = 0; t < t_end; ++t) {
            for (int g = 0; g < group; ++g) {
                const float w = s[g][t];
                float *og = oh + g * d;
#pragma omp simd
                for (int e = 0; e < d; ++e) og[e] += w * vrow[t][e];
            }
        }
    }
    for (int g = 0; g < group; ++g) {
        const float inv = 1.f / l[g];
        float *og = oh + g * d;
#pragma omp simd
        for (int e = 0; e < d; ++e) og[e] *= inv;
    }
}

/* The same pair for a head size known at compile time (D = NV vectors of VL floats), with GCC/clang vector types:
 * the accumulators of one query head live in registers, and four K rows are dotted at once so that the products
 * run as independent chains instead of one chain of dependent multiply-adds per score (the generic body's cost:
 * it is latency-bound, ~40 cycles a score). */
#if defined(__AVX512F__)
#define VB 64
#elif defined(__AVX__)
#define VB 32
#else
#define VB 16
#endif
#define VL (VB / 4)
typedef float vf __attribute__((vector_size(VB)));

static inline vf vload(const float *p) { vf x; memcpy(&x, p, sizeof x); return x; }
static inline void vstore(float *p, vf x) { memcpy(p, &x, sizeof x); }
static inline float hsum(vf x) { /* a tree of adds (a loop of VL dependent adds was a quarter of the kernel) */
    float a[VL];
    memcpy(a, &x, sizeof a);
    for (int w = VL / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; ++i) a[i] += a[i + w];
    return a[0];
}

/* The sums of four vectors at once, by a transposing tree of shuffles and adds (~3 instructions a sum, where a
 * sum alone takes a chain of log2(VL) shuffles and adds): out[i] = sum of the lanes of a_i. */
static inline void hsum4(vf a0, vf a1, vf a2, vf a3, float *out) {
#if VL == 16
    vf u0 = __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(a0, a1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    vf u1 = __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(a2, a3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    vf v = __builtin_shufflevector(u0, u1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(u0, u1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    out[0] = v[0], out[1] = v[4], out[2] = v[8], out[3] = v[12];
#elif VL == 8
    vf u0 = __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 8, 9, 10, 11) +
            __builtin_shufflevector(a0, a1, 4, 5, 6, 7, 12, 13, 14, 15);
    vf u1 = __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 8, 9, 10, 11) +
            __builtin_shufflevector(a2, a3, 4, 5, 6, 7, 12, 13, 14, 15);
    vf v = __builtin_shufflevector(u0, u1, 0, 1, 4, 5, 8, 9, 12, 13) +
           __builtin_shufflevector(u0, u1, 2, 3, 6, 7, 10, 11, 14, 15);
    v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
    out[0] = v[0], out[1] = v[2], out[2] = v[4], out[3] = v[6];
#else
    out[0] = hsum(a0), out[1] = hsum(a1), out[2] = hsum(a2), out[3] = hsum(a3);
#endif
}

/* always inlined into decode_pair_64/_128 below, where d is a constant: the loops over NV unroll, qv and acc stay in
 * registers */
static inline __attribute__((always_inline)) void decode_pair_vec(const float *qh, const float *kh, const float *vh,
                                                                  const int32_t *table, int len, float *oh, int group,
                                                                  int block_size, float scale, const int d) {
    const int nv = d / VL;
    float m[MAX_GROUP], l[MAX_GROUP], s[MAX_GROUP][TILE];
    const float *krow[TILE], *vrow[TILE];
    start_pair(m, l, oh, group, d);
    for (int start = 0; start < len; start += TILE) {
        const int t_end = len - start < TILE ? len - start : TILE;
        tile_rows(table, start, t_end, block_size, d, kh, vh, krow, vrow);
        for (int g = 0; g < group; ++g) {
            vf qv[128 / VL], acc[128 / VL], acc2[128 / VL];
            for (int j = 0; j < nv; ++j) qv[j] = vload(qh + g * d + j * VL);
            int t = 0;
            for (; t + 4 <= t_end; t += 4) { /* four scores at once: independent chains */
                vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                for (int j = 0; j < nv; ++j) {
                    a0 += qv[j] * vload(krow[t] + j * VL);
                    a1 += qv[j] * vload(krow[t + 1] + j * VL);
                    a2 += qv[j] * vload(krow[t + 2] + j * VL);
                    a3 += qv[j] * vload(krow[t + 3] + j * VL);
                }
                hsum4(a0, a1, a2, a3, &s[g][t]);
                for (int i = 0; i < 4; ++i) s[g][t + i] *= scale;
            }
            for (; t < t_end; ++t) {
                vf a = {0};
                for (int j = 0; j < nv; ++j) a += qv[j] * vload(krow[t] + j * VL);
                s[g][t] = hsum(a) * scale;
            }
            float *sg = s[g];
            const float corr = softmax_tile(sg, t_end, &m[g], &l[g]);
            /* two sets of accumulators (even and odd tokens): two chains of multiply-adds instead of one */
            for (int j = 0; j < nv; ++j) {
                acc[j] = vload(oh + g * d + j * VL) * corr;
                acc2[j] = (vf){0};
            }
            for (t = 0; t + 2 <= t_end; t += 2) {
                const float w0 = sg[t], w1 = sg[t + 1];
                for (int j = 0; j < nv; ++j) {
                    acc[j] += w0 * vload(vrow[t] + j * VL);
                    acc2[j] += w1 * vload(vrow[t + 1] + j * VL);
                }
            }
            if (t < t_end)
                for (int j = 0; j < nv; ++j) acc[j] += sg[t] * vload(vrow[t] + j * VL);
            for (int j = 0; j < nv; ++j) vstore(oh + g * d + j * VL, acc[j] + acc2[j]);
        }
    }
    for (int g = 0; g < group; ++g) {
        const float inv = 1.f / l[g];
        for (int e = 0; e < d; ++e) oh[g * d + e] *= inv;
    }
}

static void decode_pair_64(const float *qh, const float *kh, const float *vh, const int32_t *table, int len, float *oh,
                           int group, int block_size, float scale) {
    decode_pair_vec(qh, kh, vh, table, len, oh, group, block_size, scale, 64);
}

static void decode_pair_128(const float *qh, const float *kh, const float *vh, const int32_t *table, int len,
                            float *oh, int group, int block_size, float scale) {
    decode_pair_vec(qh, kh, vh, table, len, oh, group, block_size, scale, 128);
}

int paged_decode_f32(const float *q, int64_t q_stride, const float *k, const float *v, const int32_t *tables,
                     const int32_t *lens, float *out, int n, int kvh, int group, int d, int64_t num_slots, int width,
                     int block_size, float scale, int num_threads) {
    if (group > MAX_GROUP || d > MAX_DIM || group < 1 || d < 1) return -1;
    int64_t work = 0;
    for (int r = 0; r < n; ++r) work += (int64_t)lens[r] * kvh * d;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (work >= PAR_MIN_ELEMS)
    for (int pair = 0; pair < n * kvh; ++pair) {
        const int r = pair / kvh, h = pair % kvh;
        const int32_t *table = tables + (int64_t)r * width;
        const float *qh = q + (int64_t)r * q_stride + (int64_t)h * group * d;
        float *oh = out + ((int64_t)r * kvh + h) * group * d;
        const float *kh = k + (int64_t)h * num_slots * d, *vh = v + (int64_t)h * num_slots * d;
        if (d == 64) decode_pair_64(qh, kh, vh, table, lens[r], oh, group, block_size, scale);
        else if (d == 128) decode_pair_128(qh, kh, vh, table, lens[r], oh, group, block_size, scale);
        else decode_pair(qh, kh, vh, table, lens[r], oh, group, d, block_size, scale);
    }
    return 0;
}

/* Greedy sampling's two questions about logits [rows, vocab] in one read: is every element of a row finite, and
 * where is its first maximum (torch.argmax's answer for a finite row). finite[r] = 0 for a row holding NaN or inf
 * (its argmax is then left unset: the caller masks such rows and takes torch's path). */
void row_argmax_finite_f32(const float *x, int64_t rows, int64_t vocab, int64_t *argmax, uint8_t *finite) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * vocab;
        float mx = -INFINITY, poison = 0.f;
#pragma omp simd reduction(max : mx) reduction(+ : poison)
        for (int64_t i = 0; i < vocab; ++i) {
            mx = row[i] > mx ? row[i] : mx;
            poison += row[i] * 0.f; /* NaN when an element is NaN or +-inf */
        }
        finite[r] = poison == 0.f;
        if (!finite[r]) continue;
        int64_t i = 0;
        while (row[i] != mx) ++i;
        argmax[r] = i;
    }
}
