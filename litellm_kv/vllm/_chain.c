/* Native block-hash chain for vLLM's default prefix-cache hash (sha256 over pickle protocol 5).
 *
 * One call hashes a run of full blocks: block i's hash is
 *     SHA-256(pickle.dumps((parent, tuple(block_i_tokens), None), protocol=5))
 * with parent = the previous block's hash (the caller passes the first parent). The pickle bytes
 * are written here exactly as CPython's C pickler writes them for that object shape:
 *
 *     PROTO 5 | FRAME <8-byte LE length of the rest> |
 *     SHORT_BINBYTES 32 <parent> MEMOIZE |
 *     MARK <ints> TUPLE MEMOIZE            (4 or more tokens; 1-3 tokens: <ints> TUPLE1/2/3 MEMOIZE) |
 *     NONE TUPLE3 MEMOIZE STOP
 *
 * with each token as BININT1 (< 256), BININT2 (< 65536) or BININT (< 2**31). Tokens come as native
 * uint32 (array("I").tobytes()). Anything outside that shape (a token >= 2**31, other algorithms,
 * extra keys) is left to the Python path: this function returns None for tokens it cannot encode.
 * tests/vllm/test_hashing.py compares it with pickle + hashlib on every integer width and block size, and
 * the differential tests compare the whole chain with vLLM's own code.
 */
#define PY_SSIZE_T_CLEAN
/* SHA256_Init/Update/Final are deprecated in OpenSSL 3 in favour of EVP, but the one-shot EVP path
 * fetches the algorithm on every call, which cost more than the hashing of these ~120-byte inputs. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <Python.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <string.h>

#define MAX_STEP 4096 /* keeps one pickle far below the pickler's 64 KiB frame target */

static size_t put_token(unsigned char *p, uint32_t v) {
    if (v <= 0xffu) {
        p[0] = 'K';
        p[1] = (unsigned char)v;
        return 2;
    }
    if (v <= 0xffffu) {
        p[0] = 'M';
        p[1] = (unsigned char)(v & 0xffu);
        p[2] = (unsigned char)(v >> 8);
        return 3;
    }
    p[0] = 'J';
    p[1] = (unsigned char)(v & 0xffu);
    p[2] = (unsigned char)((v >> 8) & 0xffu);
    p[3] = (unsigned char)((v >> 16) & 0xffu);
    p[4] = (unsigned char)(v >> 24);
    return 5;
}

static PyObject *sha256_pickle_chain(PyObject *self, PyObject *args) {
    Py_buffer parent, tokens;
    Py_ssize_t step;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*n", &parent, &tokens, &step)) {
        return NULL;
    }
    PyObject *out = NULL;
    unsigned char *buf = NULL;
    if (parent.len != SHA256_DIGEST_LENGTH || tokens.len % 4 != 0 || step < 1 || step > MAX_STEP) {
        PyErr_SetString(PyExc_ValueError, "parent must be 32 bytes, tokens whole uint32s, 1 <= step <= 4096");
        goto done;
    }
    Py_ssize_t n_tokens = tokens.len / 4;
    Py_ssize_t n_blocks = n_tokens / step;
    const unsigned char *raw = (const unsigned char *)tokens.buf;
    for (Py_ssize_t i = 0; i < n_blocks * step; i++) {
        uint32_t v;
        memcpy(&v, raw + 4 * i, 4);
        if (v > 0x7fffffffu) { /* pickle writes LONG1 there: not this shape */
            Py_INCREF(Py_None);
            out = Py_None;
            goto done;
        }
    }
    buf = PyMem_Malloc((size_t)step * 5 + 64);
    out = PyList_New(n_blocks);
    if (buf == NULL || out == NULL) {
        Py_CLEAR(out);
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    unsigned char cur[SHA256_DIGEST_LENGTH];
    memcpy(cur, parent.buf, SHA256_DIGEST_LENGTH);
    for (Py_ssize_t b = 0; b < n_blocks; b++) {
        unsigned char *p = buf + 11; /* PROTO (2) + FRAME (1 + 8) come first */
        *p++ = 'C';
        *p++ = SHA256_DIGEST_LENGTH;
        memcpy(p, cur, SHA256_DIGEST_LENGTH);
        p += SHA256_DIGEST_LENGTH;
        *p++ = 0x94; /* MEMOIZE */
        if (step >= 4) {
            *p++ = '('; /* MARK */
        }
        const unsigned char *t = raw + 4 * (size_t)(b * step);
        for (Py_ssize_t i = 0; i < step; i++) {
            uint32_t v;
            memcpy(&v, t + 4 * i, 4);
            p += put_token(p, v);
        }
        *p++ = step >= 4 ? 't' : (unsigned char)(0x84 + step); /* TUPLE, or TUPLE1/2/3 */
        *p++ = 0x94;                                             /* MEMOIZE */
        *p++ = 'N';                                              /* NONE */
        *p++ = 0x87;                                             /* TUPLE3 */
        *p++ = 0x94;                                             /* MEMOIZE */
        *p++ = '.';                                              /* STOP */
        uint64_t frame = (uint64_t)(p - (buf + 11));
        buf[0] = 0x80; /* PROTO */
        buf[1] = 5;
        buf[2] = 0x95; /* FRAME */
        for (int k = 0; k < 8; k++) {
            buf[3 + k] = (unsigned char)((frame >> (8 * k)) & 0xffu);
        }
        SHA256_CTX ctx;
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, buf, (size_t)(p - buf));
        SHA256_Final(cur, &ctx);
        PyObject *digest = PyBytes_FromStringAndSize((const char *)cur, SHA256_DIGEST_LENGTH);
        if (digest == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, b, digest);
    }
done:
    PyMem_Free(buf);
    PyBuffer_Release(&parent);
    PyBuffer_Release(&tokens);
    return out;
}

static PyMethodDef methods[] = {
    {"sha256_pickle_chain", sha256_pickle_chain, METH_VARARGS,
     "sha256_pickle_chain(parent, tokens_uint32, step) -> list of 32-byte hashes, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chain", "Native vLLM sha256 block-hash chain.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__chain(void) { return PyModule_Create(&module); }
