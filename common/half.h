/*
 * half.h: conversions between float and the 16-bit float formats (bf16 and
 * IEEE binary16) and the 8-bit ones (OCP FP8 e4m3 and e5m2), and element
 * access by dtype. Header-only so that ovld's host
 * backend and the clients' checks convert bit-for-bit alike.
 *
 * Every conversion works on bit patterns with integer arithmetic: the result
 * does not depend on the FPU rounding mode, flush-to-zero or -ffast-math, and
 * memcpy does the punning so that no aliasing rule is broken.
 *
 * float -> 16-bit rounds to nearest, ties to even; overflow gives infinity
 * (as the hardware conversions of CUDA and x86 do); NaN stays NaN, made quiet,
 * with the sign and the top bits of the payload kept. 16-bit -> float is
 * exact.
 */
#ifndef OVL_HALF_H
#define OVL_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ovl.h"

static inline uint32_t ovl_float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ovl_bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 is the top half of a float, so widening is a shift. */
static inline float ovl_bf16_to_float(uint16_t h)
{
    return ovl_bits_float((uint32_t)h << 16);
}

static inline uint16_t ovl_bf16_from_float(float f)
{
    uint32_t u = ovl_float_bits(f);

    /* Rounding a NaN could carry it into infinity, or truncate its payload to
     * zero and make it one: keep the top bits and force the quiet bit. */
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Round to nearest even: add just under half an ulp, plus one when the
     * kept part is odd, so that an exact tie goes to the even neighbour. A
     * carry out of the mantissa bumps the exponent, which is the right answer
     * (up to infinity past the largest finite bf16). */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ovl_fp16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;

    if (exp == 0) {
        /* Zero or subnormal: mant * 2^-24 is exact in float, and so is the
         * product, so plain float arithmetic gives the exact value. */
        float mag = (float)mant * 0x1p-24f;
        return ovl_bits_float(ovl_float_bits(mag) | sign);
    }
    if (exp == 31) {
        /* Inf keeps mant == 0; a NaN keeps its payload and becomes quiet. */
        uint32_t quiet = mant ? 0x00400000u : 0;
        return ovl_bits_float(sign | 0x7f800000u | quiet | (mant << 13));
    }
    /* Normal: rebias the exponent from 15 to 127. */
    return ovl_bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline uint16_t ovl_fp16_from_float(float f)
{
    uint32_t u = ovl_float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t mag = u & 0x7fffffffu;

    if (mag > 0x7f800000u) /* NaN: keep the payload's top bits, make it quiet */
        return (uint16_t)(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));
    /* 65520 (0x477ff000) is halfway between the largest finite fp16, 65504,
     * and 2^16; the tie goes to the even side, which is infinity. This also
     * catches float infinity. */
    if (mag >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (mag >= 0x38800000u) {
        /* Normal in fp16 (>= 2^-14): rebias, then round away 13 bits to
         * nearest even. A carry into the exponent is correct, and cannot
         * reach infinity since mag < 65520 here. */
        uint32_t r = mag - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    /* 2^-25 is half the smallest subnormal: ties to even give 0, and anything
     * not larger is 0 too. */
    if (mag <= 0x33000000u)
        return sign;
    /* Subnormal in fp16: the result is |f| / 2^-24 rounded to an integer. With
     * the implicit bit restored, |f| = m * 2^(e-150), so that integer is
     * m >> (126 - e), where 126 - e lies in [14, 24] here. Rounding up to
     * 0x400 yields the smallest normal, which is the right encoding. */
    uint32_t e = mag >> 23;
    uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

/*
 * The two 8-bit float formats of the OCP FP8 specification (PyTorch's
 * float8_e4m3fn and float8_e5m2, CUDA's __nv_fp8_e4m3 and __nv_fp8_e5m2):
 *   e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities,
 *         S.1111.111 is NaN, the largest finite is 448 (S.1111.110), the
 *         smallest subnormal 2^-9;
 *   e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like:
 *         S.11111.00 is infinity, S.11111.{01,10,11} NaN, the largest finite
 *         57344, the smallest subnormal 2^-16.
 * fp8 -> float is exact. float -> fp8 rounds to nearest, ties to even; a
 * magnitude past the largest finite after rounding saturates to it with
 * `saturate` (CUDA's __NV_SATFINITE), else gives NaN in e4m3 and infinity
 * in e5m2 (an infinity: likewise); NaN gives S.1111.111 / S.11111.11.
 */
typedef struct ovl_fp8_fmt {
    uint32_t ebits, mbits, bias;
    int has_inf; /* e5m2: the top exponent is infinity and NaN; e4m3: finite but S.1111.111 */
} ovl_fp8_fmt_t;

#define OVL_FP8_E4M3 ((ovl_fp8_fmt_t){4, 3, 7, 0})
#define OVL_FP8_E5M2 ((ovl_fp8_fmt_t){5, 2, 15, 1})

static inline float ovl_fp8_to_float(ovl_fp8_fmt_t f, uint8_t x)
{
    uint32_t sign = (uint32_t)(x >> 7) << 31;
    uint32_t e = (x >> f.mbits) & ((1u << f.ebits) - 1u), m = x & ((1u << f.mbits) - 1u);
    uint32_t emax = (1u << f.ebits) - 1u;

    if (f.has_inf && e == emax)
        return ovl_bits_float(sign | 0x7f800000u | (m ? 0x400000u : 0u));
    if (!f.has_inf && e == emax && m == (1u << f.mbits) - 1u)
        return ovl_bits_float(sign | 0x7fc00000u);
    if (e == 0) {
        if (m == 0)
            return ovl_bits_float(sign);
        /* subnormal m * 2^(1 - bias - mbits) = 2^p * (m / 2^p) * 2^(1 - bias -
         * mbits), p m's top bit: a normal float */
        uint32_t p = 31u - (uint32_t)__builtin_clz(m);
        uint32_t fe = p + 1u + 127u - f.bias - f.mbits;
        return ovl_bits_float(sign | (fe << 23) | ((m - (1u << p)) << (23u - p)));
    }
    return ovl_bits_float(sign | ((e + 127u - f.bias) << 23) | (m << (23u - f.mbits)));
}

static inline uint8_t ovl_fp8_from_float(ovl_fp8_fmt_t f, float v, int saturate)
{
    uint32_t u = ovl_float_bits(v);
    uint8_t sign = (uint8_t)((u >> 31) << 7);
    uint32_t mag = u & 0x7fffffffu;
    uint32_t emax = (1u << f.ebits) - 1u, mmax = (1u << f.mbits) - 1u;
    /* the largest finite: e4m3 S.1111.110, e5m2 S.11110.11 */
    uint8_t maxfin = f.has_inf ? (uint8_t)(((emax - 1u) << f.mbits) | mmax)
                               : (uint8_t)((emax << f.mbits) | (mmax - 1u));
    uint8_t over = saturate    ? maxfin
                   : f.has_inf ? (uint8_t)(emax << f.mbits)
                               : (uint8_t)((emax << f.mbits) | mmax);

    if (mag > 0x7f800000u) /* NaN */
        return (uint8_t)(sign | (emax << f.mbits) | mmax);
    if (mag == 0x7f800000u)
        return (uint8_t)(sign | over);
    if (mag == 0)
        return sign;
    /* |v| = full * 2^ee, full < 2^24 */
    uint32_t fe = mag >> 23;
    uint32_t full = fe ? (mag & 0x7fffffu) | 0x800000u : mag;
    int32_t ee = (int32_t)(fe ? fe : 1u) - 127 - 23;
    int32_t t0 = (31 - __builtin_clz(full)) + ee; /* floor(log2 |v|) */
    int32_t tmin = 1 - (int32_t)f.bias;           /* the subnormals' exponent */
    int32_t t = t0 > tmin ? t0 : tmin;
    /* q = |v| / 2^(t - mbits), rounded to nearest even */
    int32_t sh = t - (int32_t)f.mbits - ee;
    uint32_t q;
    if (sh <= 0) {
        q = full << -sh; /* exact (only where |v| has few bits) */
    } else if (sh > 25) {
        q = 0; /* under half the smallest subnormal */
    } else {
        uint32_t rem = full & ((1u << sh) - 1u), half = 1u << (sh - 1);
        q = full >> sh;
        if (rem > half || (rem == half && (q & 1u)))
            q++;
    }
    if (q == (2u << f.mbits)) { /* rounded up to the next binade */
        q >>= 1;
        t++;
    }
    uint32_t ef = q > mmax ? (uint32_t)(t + (int32_t)f.bias) : 0u;
    uint32_t mf = q & mmax;
    if (q > mmax && ef == 0) /* a subnormal rounded up to the smallest normal */
        ef = 1;
    uint32_t code = (ef << f.mbits) | mf;
    if (ef > emax || code > maxfin)
        return (uint8_t)(sign | over);
    return (uint8_t)(sign | code);
}

/*
 * Element `index` of an array of `dtype`, as a float (exact for every dtype).
 * An unknown dtype reads as 0: callers validate dtypes before they get here.
 */
static inline float ovl_load_elem(ovl_dtype_t dtype, const void *base, size_t index)
{
    const unsigned char *p = (const unsigned char *)base;
    switch (dtype) {
    case OVL_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, p + index * sizeof h, sizeof h);
        return ovl_bf16_to_float(h);
    }
    case OVL_DTYPE_FP16: {
        uint16_t h;
        memcpy(&h, p + index * sizeof h, sizeof h);
        return ovl_fp16_to_float(h);
    }
    case OVL_DTYPE_FP32: {
        float f;
        memcpy(&f, p + index * sizeof f, sizeof f);
        return f;
    }
    case OVL_DTYPE_FP8_E4M3:
        return ovl_fp8_to_float(OVL_FP8_E4M3, p[index]);
    case OVL_DTYPE_FP8_E5M2:
        return ovl_fp8_to_float(OVL_FP8_E5M2, p[index]);
    }
    return 0.0f;
}

/* Stores v, rounded to `dtype`, as element `index`; an unknown dtype stores
 * nothing. */
static inline void ovl_store_elem(ovl_dtype_t dtype, void *base, size_t index, float v)
{
    unsigned char *p = (unsigned char *)base;
    switch (dtype) {
    case OVL_DTYPE_BF16: {
        uint16_t h = ovl_bf16_from_float(v);
        memcpy(p + index * sizeof h, &h, sizeof h);
        return;
    }
    case OVL_DTYPE_FP16: {
        uint16_t h = ovl_fp16_from_float(v);
        memcpy(p + index * sizeof h, &h, sizeof h);
        return;
    }
    case OVL_DTYPE_FP32:
        memcpy(p + index * sizeof v, &v, sizeof v);
        return;
    case OVL_DTYPE_FP8_E4M3: /* not saturating, as PyTorch's casts */
        p[index] = ovl_fp8_from_float(OVL_FP8_E4M3, v, 0);
        return;
    case OVL_DTYPE_FP8_E5M2:
        p[index] = ovl_fp8_from_float(OVL_FP8_E5M2, v, 0);
        return;
    }
}

#endif /* OVL_HALF_H */
