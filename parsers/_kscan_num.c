/* _kscan_num.c: the numbers of the native scanner (parsers/_kscan.c), converted exactly.
 *
 * Floats: Clinger's fast path (an integer mantissa <= 2^53 scaled by an exact power of ten
 * <= 10^22: one correctly rounded multiply or divide), else strtod on a NUL-terminated copy
 * (glibc's strtod is correctly rounded, as orjson's reader is). Ints: at most 18 digits, so
 * they never overflow int64. The tokens were validated by scan_number (_kscan_json.c).
 *
 * Compiled inside _kscan.c's translation unit (see there why), after Python.h.
 */
#ifndef KSCAN_ONE_UNIT
#error "_kscan_num.c is compiled as part of _kscan.c (one translation unit; see there), not on its own"
#endif
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "_kscan_num.h"

static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* float64 of a number token, as orjson + float() give it; -1: give up. */
static int num_double(const Tok *t, double *out) {
    const uint8_t *p = t->s, *end = t->s + t->n;
    uint64_t m = 0;
    int neg = 0, sig = 0, frac = 0;
    long ex = 0, e10;
    int exneg = 0;
    if (*p == '-') neg = 1, p++;
    while (p < end && *p >= '0' && *p <= '9') {
        if (m || *p != '0') {
            if (sig < 19) m = m * 10 + (uint64_t)(*p - '0');
            sig++;
        }
        p++;
    }
    if (p < end && *p == '.') {
        p++;
        while (p < end && *p >= '0' && *p <= '9') {
            if (m || *p != '0') {
                if (sig < 19) m = m * 10 + (uint64_t)(*p - '0');
                sig++;
            }
            if (sig <= 19) frac++; /* a digit not taken into m is not counted as a fraction digit */
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '+' || *p == '-') exneg = *p++ == '-';
        while (p < end) ex = ex * 10 + (*p++ - '0'); /* bounded by scan_number */
    }
    if (m == 0 && sig == 0) {
        /* an int token is a Python int first: -0 -> 0 -> +0.0; a float keeps its sign */
        *out = (neg && !t->is_int) ? -0.0 : 0.0;
        return 0;
    }
    e10 = (exneg ? -ex : ex) - frac;
    if (sig <= 19 && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)m;
        d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
        *out = neg ? -d : d;
        return 0;
    }
    {
        char tmp[400];
        char *stop;
        double d;
        if (t->n >= sizeof tmp) return -1;
        memcpy(tmp, t->s, t->n);
        tmp[t->n] = 0;
        d = strtod(tmp, &stop);
        if (stop != tmp + t->n || !isfinite(d)) return -1;
        *out = d;
        return 0;
    }
}

/* int64 of an int token of at most 18 digits (the ids, bytes, pid / tid); -1: give up. */
static int num_int(const Tok *t, int64_t *out) {
    const uint8_t *p = t->s, *end = t->s + t->n;
    int neg = 0;
    int64_t v = 0;
    if (t->type != T_NUM || !t->is_int || t->digits > 18) return -1;
    if (*p == '-') neg = 1, p++;
    while (p < end) v = v * 10 + (*p++ - '0');
    *out = neg ? -v : v;
    return 0;
}
