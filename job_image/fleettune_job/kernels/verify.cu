// The job's own verification kernels (fleettune_job/verification.py). Plain CUDA with no
// headers, so a worker compiles them in a fraction of a second: cupy's elementwise and
// reduction kernels, which the array code would use instead, compile at run time with
// cupy's headers, about 6 s per trial Pod on an H200.
//
// Every reference kernel runs on a 2D grid of 16 x 16 blocks over its output (x: columns,
// y: rows; a grid of at most 65535 block rows strides over more rows) and has one
// signature: the float64 output, the problem's first and second float32 inputs (the
// second may be the first again), the output's rows and columns, and the second input's
// rows and columns. Inputs are read as float32 and summed in float64, exactly as the array
// code's references do.

#define REF_TILE 16

// The convolution of the image (rows + fh - 1) x (cols + fw - 1) with the filter fh x fw.
extern "C" __global__ void reference_convolution(double *__restrict__ out, const float *__restrict__ image,
                                                 const float *__restrict__ filter, int rows, int cols, int fh,
                                                 int fw) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= cols) return;
    const long long stride = (long long)cols + fw - 1;
    for (long long y = blockIdx.y * (long long)blockDim.y + threadIdx.y; y < rows;
         y += (long long)gridDim.y * blockDim.y) {
        double acc = 0.0;
        for (int i = 0; i < fh; ++i)
            for (int j = 0; j < fw; ++j)
                acc += (double)image[(y + i) * stride + x + j] * (double)filter[i * fw + j];
        out[y * cols + x] = acc;
    }
}

// C (rows x cols) = A (rows x k) B (k x cols), through shared-memory tiles: a reference of
// 4096^3 takes a moment this way, where one thread per output reading global memory would
// take seconds. Every thread of a block runs the same iterations (no early return): each
// reaches every __syncthreads().
extern "C" __global__ void reference_gemm(double *__restrict__ out, const float *__restrict__ a,
                                          const float *__restrict__ b, int rows, int cols, int k, int b_cols) {
    __shared__ double ta[REF_TILE][REF_TILE];
    __shared__ double tb[REF_TILE][REF_TILE];
    const int x = blockIdx.x * REF_TILE + threadIdx.x;
    for (long long y0 = blockIdx.y * (long long)REF_TILE; y0 < rows; y0 += (long long)gridDim.y * REF_TILE) {
        const long long y = y0 + threadIdx.y;
        double acc = 0.0;
        for (int k0 = 0; k0 < k; k0 += REF_TILE) {
            const int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
            ta[threadIdx.y][threadIdx.x] = (y < rows && ka < k) ? (double)a[y * k + ka] : 0.0;
            tb[threadIdx.y][threadIdx.x] = (x < cols && kb < k) ? (double)b[(long long)kb * cols + x] : 0.0;
            __syncthreads();
            for (int i = 0; i < REF_TILE; ++i) acc += ta[threadIdx.y][i] * tb[i][threadIdx.x];
            __syncthreads();
        }
        if (x < cols && y < rows) out[y * cols + x] = acc;
    }
}

// The inclusive prefix sum of each row: one thread per row (the first column's), in order.
extern "C" __global__ void reference_scan(double *__restrict__ out, const float *__restrict__ in,
                                          const float *unused, int rows, int cols, int unused_rows,
                                          int unused_cols) {
    if (blockIdx.x * blockDim.x + threadIdx.x != 0) return;
    for (long long y = blockIdx.y * (long long)blockDim.y + threadIdx.y; y < rows;
         y += (long long)gridDim.y * blockDim.y) {
        const long long row = y * cols;
        double acc = 0.0;
        for (int c = 0; c < cols; ++c) {
            acc += (double)in[row + c];
            out[row + c] = acc;
        }
    }
}

// result[0]: elements of `got` not within atol + rtol * |expected| of `expected` (in
// float64; NaN is wrong unless expected is NaN too; an infinite expected value must be
// matched exactly); result[1]: NaN elements of `got`; result[2]: the first wrong element's
// index (the caller sets it to the largest value first). The same rule as
// fleettune_job.kernels.base.compare, which diagnoses from these three numbers.
template <class G, class E>
__device__ void count_mismatches(const G *got, const E *expected, long long n, double atol, double rtol,
                                 unsigned long long *result) {
    unsigned long long bad = 0, nans = 0, first = ~0ULL;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += step) {
        const double g = (double)got[i], e = (double)expected[i];
        const bool finite = e == e && e - e == 0.0;  // neither NaN nor infinite
        const bool ok = (finite && fabs(g - e) <= atol + rtol * fabs(e)) || g == e || (g != g && e != e);
        if (!ok) {
            ++bad;
            if ((unsigned long long)i < first) first = (unsigned long long)i;
        }
        if (g != g) ++nans;
    }
    if (bad) {
        atomicAdd(&result[0], bad);
        atomicMin(&result[2], first);
    }
    if (nans) atomicAdd(&result[1], nans);
}

#define COUNT_MISMATCHES(NAME, G, E)                                                                         \
    extern "C" __global__ void count_mismatches_##NAME(const G *got, const E *expected, long long n,          \
                                                       double atol, double rtol, unsigned long long *result) { \
        count_mismatches<G, E>(got, expected, n, atol, rtol, result);                                        \
    }

// A built-in kernel's float32 output against its float64 reference; a user kernel's
// outputs against the reference configuration's, of the same type.
COUNT_MISMATCHES(float32_float64, float, double)
COUNT_MISMATCHES(float32_float32, float, float)
COUNT_MISMATCHES(float64_float64, double, double)
COUNT_MISMATCHES(int8_int8, signed char, signed char)
COUNT_MISMATCHES(int16_int16, short, short)
COUNT_MISMATCHES(int32_int32, int, int)
COUNT_MISMATCHES(int64_int64, long long, long long)
COUNT_MISMATCHES(uint8_uint8, unsigned char, unsigned char)
COUNT_MISMATCHES(uint16_uint16, unsigned short, unsigned short)
COUNT_MISMATCHES(uint32_uint32, unsigned int, unsigned int)
COUNT_MISMATCHES(uint64_uint64, unsigned long long, unsigned long long)
