/* _kscan_num.h: number tokens to values, as the reference path (orjson + float() / int) reads
 * them; implemented in _kscan_num.c. Private to ep_trace.parsers._kscan.
 */
#ifndef EP_TRACE_KSCAN_NUM_H
#define EP_TRACE_KSCAN_NUM_H

#include <stdint.h>

#include "_kscan_json.h"

/* float64 of a number token, as orjson + float() give it; -1: give up. */
static int num_double(const Tok *t, double *out);

/* int64 of an int token of at most 18 digits (the ids, bytes, pid / tid); -1: give up. */
static int num_int(const Tok *t, int64_t *out);

#endif /* EP_TRACE_KSCAN_NUM_H */
