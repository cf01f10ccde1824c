// Tunable tiled single-precision matrix multiply  C = A * B  (row-major).
//
// A is M x K, B is K x N, C is M x N. A block computes a BM x BN tile of C, with
// BM = block_size_y * tile_size_y and BN = block_size_x * tile_size_x. It walks K in
// slices of tile_k: each slice of A (BM x tile_k) and of B (tile_k x BN) is staged in
// shared memory with vector loads of vector_width floats, then every thread
// accumulates its tile_size_y x tile_size_x outputs from registers.
//
// A thread's outputs are one block apart in each direction so that the warp's loads
// from the B slice and its stores to C are contiguous.

#if !defined(block_size_x) || !defined(block_size_y) || !defined(tile_size_x) || !defined(tile_size_y)
#error "block_size_x, block_size_y, tile_size_x and tile_size_y must be defined"
#endif
#if !defined(tile_k) || !defined(vector_width) || !defined(matrix_m) || !defined(matrix_n) || !defined(matrix_k)
#error "tile_k, vector_width, matrix_m, matrix_n and matrix_k must be defined"
#endif
#ifndef use_padding
#define use_padding 0
#endif
#ifndef unroll_k
#define unroll_k 1
#endif

#define BM (block_size_y * tile_size_y)
#define BN (block_size_x * tile_size_x)
#define NTHREADS (block_size_x * block_size_y)

// The kernel has no edge handling: tiles must divide the matrices (checked by the job
// before compiling; repeated here for anyone compiling the file by hand).
static_assert(matrix_m % BM == 0, "M must be a multiple of block_size_y * tile_size_y");
static_assert(matrix_n % BN == 0, "N must be a multiple of block_size_x * tile_size_x");
static_assert(matrix_k % tile_k == 0, "K must be a multiple of tile_k");
static_assert(tile_k % vector_width == 0 && BN % vector_width == 0,
              "vector_width must divide tile_k and block_size_x * tile_size_x");
static_assert(matrix_k % vector_width == 0 && matrix_n % vector_width == 0,
              "vector_width must divide K and N (aligned vector loads)");

#if vector_width == 4
typedef float4 vec_t;
#elif vector_width == 2
typedef float2 vec_t;
#elif vector_width == 1
typedef float vec_t;
#else
#error "vector_width must be 1, 2 or 4"
#endif

// Padding shifts consecutive shared rows by one bank: the A slice is read down a column
// by threads of different threadIdx.y in the same warp.
#define A_STRIDE (tile_k + use_padding)
#define B_STRIDE (BN + use_padding)

extern "C" __global__ void gemm_kernel(float *__restrict__ C, const float *__restrict__ A,
                                       const float *__restrict__ B)
{
    __shared__ float As[BM * A_STRIDE];
    __shared__ float Bs[tile_k * B_STRIDE];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int tid = ty * block_size_x + tx;
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;

    float acc[tile_size_y][tile_size_x];
#pragma unroll
    for (int i = 0; i < tile_size_y; i++) {
#pragma unroll
        for (int j = 0; j < tile_size_x; j++) {
            acc[i][j] = 0.0f;
        }
    }

    for (int k0 = 0; k0 < matrix_k; k0 += tile_k) {
        // A slice: BM rows of tile_k floats, as BM * tile_k / vector_width vectors.
        for (int v = tid; v < BM * (tile_k / vector_width); v += NTHREADS) {
            const int r = v / (tile_k / vector_width);
            const int c = (v % (tile_k / vector_width)) * vector_width;
            const vec_t val = *reinterpret_cast<const vec_t *>(&A[(long long)(m0 + r) * matrix_k + k0 + c]);
            const float *f = reinterpret_cast<const float *>(&val);
#pragma unroll
            for (int u = 0; u < vector_width; u++) {
                As[r * A_STRIDE + c + u] = f[u];
            }
        }
        // B slice: tile_k rows of BN floats.
        for (int v = tid; v < tile_k * (BN / vector_width); v += NTHREADS) {
            const int r = v / (BN / vector_width);
            const int c = (v % (BN / vector_width)) * vector_width;
            const vec_t val = *reinterpret_cast<const vec_t *>(&B[(long long)(k0 + r) * matrix_n + n0 + c]);
            const float *f = reinterpret_cast<const float *>(&val);
#pragma unroll
            for (int u = 0; u < vector_width; u++) {
                Bs[r * B_STRIDE + c + u] = f[u];
            }
        }
        __syncthreads();

#if unroll_k
#pragma unroll
#else
#pragma unroll 1
#endif
        for (int k = 0; k < tile_k; k++) {
            float a[tile_size_y];
            float b[tile_size_x];
#pragma unroll
            for (int i = 0; i < tile_size_y; i++) {
                a[i] = As[(ty + i * block_size_y) * A_STRIDE + k];
            }
#pragma unroll
            for (int j = 0; j < tile_size_x; j++) {
                b[j] = Bs[k * B_STRIDE + tx + j * block_size_x];
            }
#pragma unroll
            for (int i = 0; i < tile_size_y; i++) {
#pragma unroll
                for (int j = 0; j < tile_size_x; j++) {
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                }
            }
        }
        // The next slice overwrites the shared tiles.
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < tile_size_y; i++) {
#pragma unroll
        for (int j = 0; j < tile_size_x; j++) {
            C[(long long)(m0 + ty + i * block_size_y) * matrix_n + n0 + tx + j * block_size_x] = acc[i][j];
        }
    }
}
