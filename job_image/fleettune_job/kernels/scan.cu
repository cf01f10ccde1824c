// Tunable batched inclusive prefix sum: every row of a rows x row_length float32 matrix
// is scanned independently (row-major), the shape of the batched signal-processing work
// of embedded (Jetson) pipelines.
//
//   out[r][c] = sum_{i <= c} in[r][i]
//
// A block scans rows_per_block rows, block_size_x threads per row. A row is consumed in
// chunks of block_size_x * items_per_thread elements: each thread loads items_per_thread
// consecutive elements (vector_width at a time), scans them sequentially in registers,
// the row's threads combine their totals with a block-level exclusive scan (warp
// shuffles or a shared-memory Hillis-Steele scan), and a running carry links the chunks.

#if !defined(block_size_x) || !defined(rows_per_block) || !defined(items_per_thread) || !defined(vector_width)
#error "block_size_x, rows_per_block, items_per_thread and vector_width must be defined"
#endif
#if !defined(row_length) || !defined(num_rows)
#error "row_length and num_rows must be defined"
#endif
#ifndef use_shuffle
#define use_shuffle 1
#endif

#define CHUNK (block_size_x * items_per_thread)

static_assert(items_per_thread % vector_width == 0, "vector_width must divide items_per_thread");
static_assert(row_length % vector_width == 0, "vector_width must divide the row length (aligned rows)");
#if use_shuffle
static_assert(block_size_x % 32 == 0, "the shuffle scan needs whole warps per row");
#define WARPS (block_size_x / 32)
#endif

#if vector_width == 4
typedef float4 vec_t;
#elif vector_width == 2
typedef float2 vec_t;
#elif vector_width == 1
typedef float vec_t;
#else
#error "vector_width must be 1, 2 or 4"
#endif

extern "C" __global__ void scan_kernel(float *__restrict__ out, const float *__restrict__ in)
{
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row = blockIdx.x * rows_per_block + ty;
    // Threads of a row past the end still take part in every __syncthreads.
    const bool active = row < num_rows;
    const long long row_start = (long long)(active ? row : 0) * row_length;
    const float *row_in = in + row_start;
    float *row_out = out + row_start;

#if use_shuffle
    __shared__ float warp_sums[rows_per_block][WARPS];
#else
    __shared__ float partial[rows_per_block][block_size_x];
#endif
    __shared__ float chunk_total[rows_per_block];

    float carry = 0.0f;
    for (int start = 0; start < row_length; start += CHUNK) {
        const int first = start + tx * items_per_thread;

        float v[items_per_thread];
#pragma unroll
        for (int u = 0; u < items_per_thread; u += vector_width) {
            const int col = first + u;
            // Rows and vectors are aligned, so a vector is either wholly inside or wholly past the row.
            if (active && col < row_length) {
                const vec_t t = *reinterpret_cast<const vec_t *>(&row_in[col]);
                const float *f = reinterpret_cast<const float *>(&t);
#pragma unroll
                for (int w = 0; w < vector_width; w++) {
                    v[u + w] = f[w];
                }
            } else {
#pragma unroll
                for (int w = 0; w < vector_width; w++) {
                    v[u + w] = 0.0f;
                }
            }
        }
#pragma unroll
        for (int u = 1; u < items_per_thread; u++) {
            v[u] += v[u - 1];
        }
        const float total = v[items_per_thread - 1];

        float exclusive;
#if use_shuffle
        const int lane = tx & 31;
        const int warp = tx >> 5;
        float x = total;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, x, d);
            if (lane >= d) {
                x += y;
            }
        }
        if (lane == 31) {
            warp_sums[ty][warp] = x;
        }
        __syncthreads();
        float before = 0.0f;
        for (int w = 0; w < warp; w++) {
            before += warp_sums[ty][w];
        }
        exclusive = before + x - total;
#else
        partial[ty][tx] = total;
        __syncthreads();
        for (int d = 1; d < block_size_x; d <<= 1) {
            const float y = tx >= d ? partial[ty][tx - d] : 0.0f;
            __syncthreads();
            partial[ty][tx] += y;
            __syncthreads();
        }
        exclusive = partial[ty][tx] - total;
#endif

        const float offset = carry + exclusive;
#pragma unroll
        for (int u = 0; u < items_per_thread; u += vector_width) {
            const int col = first + u;
            if (active && col < row_length) {
                vec_t t;
                float *f = reinterpret_cast<float *>(&t);
#pragma unroll
                for (int w = 0; w < vector_width; w++) {
                    f[w] = v[u + w] + offset;
                }
                *reinterpret_cast<vec_t *>(&row_out[col]) = t;
            }
        }

        if (tx == block_size_x - 1) {
            chunk_total[ty] = exclusive + total;
        }
        __syncthreads();
        carry += chunk_total[ty];
        // Shared scratch is rewritten by the next chunk.
        __syncthreads();
    }
}
