// Tunable 2D convolution (correlation form) of a padded image with a small filter.
//
//   output[y][x] = sum_{i < filter_height, j < filter_width} input[y + i][x + j] * filter[i][j]
//
// output is image_height x image_width, input is (image_height + filter_height - 1) x
// (image_width + filter_width - 1), all float32, row-major. Every parameter arrives as a
// compile-time constant (-D), so tile loops unroll and shared-memory arrays are static.
//
// Each thread computes tile_size_y x tile_size_x outputs spaced one block apart, so that
// neighbouring threads always touch neighbouring addresses (coalesced loads and stores).

#if !defined(block_size_x) || !defined(block_size_y) || !defined(tile_size_x) || !defined(tile_size_y)
#error "block_size_x, block_size_y, tile_size_x and tile_size_y must be defined"
#endif
#if !defined(filter_width) || !defined(filter_height) || !defined(image_width) || !defined(image_height)
#error "filter_width, filter_height, image_width and image_height must be defined"
#endif
#ifndef read_only
#define read_only 0
#endif
#ifndef use_padding
#define use_padding 0
#endif
#ifndef use_shmem
#define use_shmem 0
#endif
#ifndef use_cmem
#define use_cmem 1
#endif

#define input_width (image_width + filter_width - 1)
#define input_height (image_height + filter_height - 1)
#define TILE_W (block_size_x * tile_size_x)
#define TILE_H (block_size_y * tile_size_y)

#if read_only
// Routes loads through the read-only (texture) data cache.
#define LOAD(ptr) __ldg(ptr)
#else
#define LOAD(ptr) (*(ptr))
#endif

#if use_cmem
// Every thread of a warp reads the same filter element at the same time: constant
// memory broadcasts it in one transaction.
__constant__ float d_filter[filter_height * filter_width];
#define FILTER(i, j) d_filter[(i) * filter_width + (j)]
#else
#define FILTER(i, j) LOAD(&filter[(i) * filter_width + (j)])
#endif

#if use_shmem
#define SH_W (TILE_W + filter_width - 1)
#define SH_H (TILE_H + filter_height - 1)
#if use_padding
// One extra float per row shifts consecutive rows to different banks when a warp spans
// several rows (block_size_x not a multiple of 32).
#define SH_STRIDE (SH_W + 1)
#else
#define SH_STRIDE SH_W
#endif
#endif

extern "C" __global__ void convolution_kernel(float *__restrict__ output,
                                              const float *__restrict__ input,
                                              const float *__restrict__ filter)
{
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int x0 = blockIdx.x * TILE_W;
    const int y0 = blockIdx.y * TILE_H;

    float sum[tile_size_y][tile_size_x];
#pragma unroll
    for (int ti = 0; ti < tile_size_y; ti++) {
#pragma unroll
        for (int tj = 0; tj < tile_size_x; tj++) {
            sum[ti][tj] = 0.0f;
        }
    }

#if use_shmem
    __shared__ float sh_input[SH_H * SH_STRIDE];
    // The block's input window, including the filter's halo, staged once.
    for (int i = ty; i < SH_H; i += block_size_y) {
        const int gy = y0 + i;
        for (int j = tx; j < SH_W; j += block_size_x) {
            const int gx = x0 + j;
            sh_input[i * SH_STRIDE + j] =
                (gy < input_height && gx < input_width) ? LOAD(&input[gy * input_width + gx]) : 0.0f;
        }
    }
    __syncthreads();

    // Filter rows stay a loop: unrolling them too made NVRTC ~70x slower (30 s for 4x4
    // tiles) while a row's body, filter_width x tile FMAs, is already long enough to hide
    // the loop overhead.
#pragma unroll 1
    for (int i = 0; i < filter_height; i++) {
#pragma unroll
        for (int j = 0; j < filter_width; j++) {
            const float f = FILTER(i, j);
#pragma unroll
            for (int ti = 0; ti < tile_size_y; ti++) {
#pragma unroll
                for (int tj = 0; tj < tile_size_x; tj++) {
                    sum[ti][tj] += sh_input[(ty + ti * block_size_y + i) * SH_STRIDE + tx + tj * block_size_x + j] * f;
                }
            }
        }
    }
#else
    // Outputs past the image edge still compute (on clamped coordinates, so every read is
    // in bounds) and are simply not stored: no divergent branch in the hot loop.
    int row[tile_size_y];
    int col[tile_size_x];
#pragma unroll
    for (int ti = 0; ti < tile_size_y; ti++) {
        row[ti] = min(y0 + ty + ti * block_size_y, image_height - 1);
    }
#pragma unroll
    for (int tj = 0; tj < tile_size_x; tj++) {
        col[tj] = min(x0 + tx + tj * block_size_x, image_width - 1);
    }

    // Filter rows stay a loop, as above.
#pragma unroll 1
    for (int i = 0; i < filter_height; i++) {
#pragma unroll
        for (int j = 0; j < filter_width; j++) {
            const float f = FILTER(i, j);
#pragma unroll
            for (int ti = 0; ti < tile_size_y; ti++) {
#pragma unroll
                for (int tj = 0; tj < tile_size_x; tj++) {
                    sum[ti][tj] += LOAD(&input[(row[ti] + i) * input_width + col[tj] + j]) * f;
                }
            }
        }
    }
#endif

#pragma unroll
    for (int ti = 0; ti < tile_size_y; ti++) {
        const int y = y0 + ty + ti * block_size_y;
#pragma unroll
        for (int tj = 0; tj < tile_size_x; tj++) {
            const int x = x0 + tx + tj * block_size_x;
            if (y < image_height && x < image_width) {
                output[y * image_width + x] = sum[ti][tj];
            }
        }
    }
}
