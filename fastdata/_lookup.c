/* fastdata._lookup: per-channel table lookups of one uint8 image into planes, written past
 * the cache.
 *
 * The CPU gpu.Normalize turns each uint8 value into its channel's precomputed float (a
 * table of 256 entries per channel: fastdata/gpu/_normalize_tables.py). The output is four
 * (or two) bytes a value, tens of MB a batch, written once and read later by another step:
 * with ordinary stores every output line is first read into the cache, then evicted, so the
 * writes cost twice their bytes in memory traffic. Streaming (non-temporal) stores write
 * whole lines without that read. NumPy and OpenCV use them only for copies far larger than
 * a batch, and neither offers a lookup that does, hence this module. The values are the
 * table's entries copied: the same bytes as OpenCV's LUT. Interleaved pixels are read once
 * for all their planes where the planes start equally far from a 16-byte boundary. Where
 * SSE2 is absent the same loops use ordinary stores.
 *
 * Built by setup.py when a C compiler is present (optional: the install goes on without
 * it, and the OpenCV path runs instead).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define STREAMING 1
#else
#define STREAMING 0
#endif

/* one channel: out[i] = table[source[i * step]] for i < count, 4-byte values */
static void plane32(const uint8_t *source, Py_ssize_t step, Py_ssize_t count,
                    const uint32_t *table, uint32_t *out)
{
    Py_ssize_t i = 0;
#if STREAMING
    /* ordinary stores up to the first 16-byte boundary, then four values a store */
    for (; i < count && ((uintptr_t)(out + i) & 15) != 0; i++)
        out[i] = table[source[i * step]];
    for (; i + 4 <= count; i += 4) {
        const uint8_t *p = source + i * step;
        __m128i values = _mm_setr_epi32((int)table[p[0]], (int)table[p[step]],
                                        (int)table[p[2 * step]], (int)table[p[3 * step]]);
        _mm_stream_si128((__m128i *)(out + i), values);
    }
#endif
    for (; i < count; i++)
        out[i] = table[source[i * step]];
}

/* the same for 2-byte values (float16, bfloat16 bit patterns), eight a store */
static void plane16(const uint8_t *source, Py_ssize_t step, Py_ssize_t count,
                    const uint16_t *table, uint16_t *out)
{
    Py_ssize_t i = 0;
#if STREAMING
    for (; i < count && ((uintptr_t)(out + i) & 15) != 0; i++)
        out[i] = table[source[i * step]];
    for (; i + 8 <= count; i += 8) {
        const uint8_t *p = source + i * step;
        __m128i values = _mm_setr_epi16(
            (short)table[p[0]], (short)table[p[step]], (short)table[p[2 * step]],
            (short)table[p[3 * step]], (short)table[p[4 * step]], (short)table[p[5 * step]],
            (short)table[p[6 * step]], (short)table[p[7 * step]]);
        _mm_stream_si128((__m128i *)(out + i), values);
    }
#endif
    for (; i < count; i++)
        out[i] = table[source[i * step]];
}

#if STREAMING
/* Interleaved pixels into all their planes in one pass (the source read once), four values
 * of each plane a store; the planes start equally far from a 16-byte boundary. */
static void pixels32(const uint8_t *source, Py_ssize_t channels, Py_ssize_t count,
                     const uint32_t *tables, uint32_t *out)
{
    Py_ssize_t i = 0;
    for (; i < count && ((uintptr_t)(out + i) & 15) != 0; i++)
        for (Py_ssize_t c = 0; c < channels; c++)
            out[c * count + i] = tables[c * 256 + source[i * channels + c]];
    for (; i + 4 <= count; i += 4) {
        const uint8_t *p = source + i * channels;
        for (Py_ssize_t c = 0; c < channels; c++) {
            const uint32_t *table = tables + c * 256;
            __m128i values = _mm_setr_epi32(
                (int)table[p[c]], (int)table[p[channels + c]], (int)table[p[2 * channels + c]],
                (int)table[p[3 * channels + c]]);
            _mm_stream_si128((__m128i *)(out + c * count + i), values);
        }
    }
    for (; i < count; i++)
        for (Py_ssize_t c = 0; c < channels; c++)
            out[c * count + i] = tables[c * 256 + source[i * channels + c]];
}

/* the same for 2-byte values, eight of each plane a store */
static void pixels16(const uint8_t *source, Py_ssize_t channels, Py_ssize_t count,
                     const uint16_t *tables, uint16_t *out)
{
    Py_ssize_t i = 0;
    for (; i < count && ((uintptr_t)(out + i) & 15) != 0; i++)
        for (Py_ssize_t c = 0; c < channels; c++)
            out[c * count + i] = tables[c * 256 + source[i * channels + c]];
    for (; i + 8 <= count; i += 8) {
        const uint8_t *p = source + i * channels;
        for (Py_ssize_t c = 0; c < channels; c++) {
            const uint16_t *table = tables + c * 256;
            const uint8_t *q = p + c;
            __m128i values = _mm_setr_epi16(
                (short)table[q[0]], (short)table[q[channels]], (short)table[q[2 * channels]],
                (short)table[q[3 * channels]], (short)table[q[4 * channels]],
                (short)table[q[5 * channels]], (short)table[q[6 * channels]],
                (short)table[q[7 * channels]]);
            _mm_stream_si128((__m128i *)(out + c * count + i), values);
        }
    }
    for (; i < count; i++)
        for (Py_ssize_t c = 0; c < channels; c++)
            out[c * count + i] = tables[c * 256 + source[i * channels + c]];
}
#endif

PyDoc_STRVAR(planes_doc,
"planes(source, tables, out, channels, interleaved)\n--\n\n"
"Write ``tables[c][source value]`` for every value of channel ``c`` of one uint8 image\n"
"into plane ``c`` of ``out``.\n\n"
"source: C-contiguous uint8, ``channels * N`` bytes: ``(H, W, C)`` pixels when\n"
"``interleaved``, else ``(C, H, W)`` planes. tables: C-contiguous, ``channels * 256``\n"
"entries of 2 or 4 bytes. out: writable C-contiguous ``(C, H, W)``, ``channels * N``\n"
"entries of the tables' size.");

static PyObject *planes(PyObject *module, PyObject *args)
{
    PyObject *source_object, *tables_object, *out_object;
    Py_ssize_t channels;
    int interleaved;
    if (!PyArg_ParseTuple(args, "OOOnp:planes", &source_object, &tables_object, &out_object,
                          &channels, &interleaved))
        return NULL;
    Py_buffer source, tables, out;
    if (PyObject_GetBuffer(source_object, &source, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(tables_object, &tables, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&source);
        return NULL;
    }
    if (PyObject_GetBuffer(out_object, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&source);
        PyBuffer_Release(&tables);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t itemsize = tables.itemsize;
    if (channels < 1 || source.len % channels != 0) {
        PyErr_Format(PyExc_ValueError, "source of %zd bytes does not hold %zd channels",
                     source.len, channels);
    } else if (source.itemsize != 1) {
        PyErr_SetString(PyExc_TypeError, "source must be uint8");
    } else if (itemsize != 2 && itemsize != 4) {
        PyErr_Format(PyExc_TypeError, "table entries must be 2 or 4 bytes, got %zd", itemsize);
    } else if (tables.len != channels * 256 * itemsize) {
        PyErr_Format(PyExc_ValueError, "tables hold %zd bytes, %zd channels need %zd",
                     tables.len, channels, channels * 256 * itemsize);
    } else if (out.len != source.len * itemsize) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, the image needs %zd", out.len,
                     source.len * itemsize);
    } else {
        Py_ssize_t count = source.len / channels;
        Py_ssize_t step = interleaved ? channels : 1;
        const uint8_t *pixels = (const uint8_t *)source.buf;
        /* interleaved pixels whose planes start equally far from a 16-byte boundary: every
         * plane in one pass over the pixels, else a pass per plane */
        int one_pass = STREAMING && interleaved && channels > 1 && (count * itemsize) % 16 == 0;
        Py_BEGIN_ALLOW_THREADS
        if (one_pass) {
#if STREAMING
            if (itemsize == 4)
                pixels32(pixels, channels, count, tables.buf, out.buf);
            else
                pixels16(pixels, channels, count, tables.buf, out.buf);
#endif
        } else {
            for (Py_ssize_t c = 0; c < channels; c++) {
                const uint8_t *first = interleaved ? pixels + c : pixels + c * count;
                if (itemsize == 4)
                    plane32(first, step, count, (const uint32_t *)tables.buf + c * 256,
                            (uint32_t *)out.buf + c * count);
                else
                    plane16(first, step, count, (const uint16_t *)tables.buf + c * 256,
                            (uint16_t *)out.buf + c * count);
            }
        }
#if STREAMING
        _mm_sfence(); /* the streamed lines are visible before the caller reads them */
#endif
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&source);
    PyBuffer_Release(&tables);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"planes", planes, METH_VARARGS, planes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_lookup",
    "Per-channel table lookups of uint8 images into planes, with streaming stores.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__lookup(void)
{
    return PyModule_Create(&module);
}
