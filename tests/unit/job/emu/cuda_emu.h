// Just enough of CUDA to run this project's built-in kernels on the CPU in unit tests.
//
// Each CUDA thread of a block is a real std::thread; blocks run one after another, so a
// function-local `static` array is exactly one block's shared memory. __syncthreads()
// is a barrier over the block, warp shuffles a barrier over the 32 lanes of a warp.
// Because the threads are real, a missing __syncthreads() shows up as a data race here
// as it would on a GPU. Timing and performance mean nothing in this emulation.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct emu_uint3 { unsigned x = 0, y = 0, z = 0; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };

inline thread_local emu_uint3 threadIdx;
inline thread_local emu_uint3 blockIdx;
inline emu_uint3 blockDim;
inline emu_uint3 gridDim;

#define __global__
#define __device__
#define __shared__ static
#define __constant__
#define __launch_bounds__(...)

using std::max;
using std::min;

template <class T> inline T __ldg(const T *p) { return *p; }

// The threads are real, so are the atomics.
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v) {
    std::atomic_ref<unsigned long long> a(*p);
    unsigned long long old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {}
    return old;
}

struct emu_warp {
    explicit emu_warp(int lanes) : bar(lanes) {}
    std::barrier<> bar;
    float vals[32] = {};
};

inline std::barrier<> *emu_block_barrier = nullptr;
inline std::vector<std::unique_ptr<emu_warp>> emu_warps;

inline int emu_linear_tid() {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }

inline float __shfl_up_sync(unsigned, float v, int delta) {
    const int tid = emu_linear_tid();
    emu_warp &w = *emu_warps[tid / 32];
    const int lane = tid % 32;
    w.vals[lane] = v;
    w.bar.arrive_and_wait();
    const float r = lane >= delta ? w.vals[lane - delta] : v;
    w.bar.arrive_and_wait();
    return r;
}

template <class F> void emu_launch(emu_uint3 grid, emu_uint3 block, F kernel) {
    gridDim = grid;
    blockDim = block;
    const int n = (int)(block.x * block.y * block.z);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                std::barrier<> bar(n);
                emu_block_barrier = &bar;
                emu_warps.clear();
                for (int first = 0; first < n; first += 32)
                    emu_warps.push_back(std::make_unique<emu_warp>(std::min(32, n - first)));
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (unsigned tz = 0; tz < block.z; tz++)
                    for (unsigned ty = 0; ty < block.y; ty++)
                        for (unsigned tx = 0; tx < block.x; tx++)
                            threads.emplace_back([=] {
                                threadIdx = {tx, ty, tz};
                                blockIdx = {bx, by, bz};
                                kernel();
                            });
                for (auto &t : threads) t.join();
            }
}
