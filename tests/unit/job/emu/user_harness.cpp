// Runs one emulated launch of a user kernel with any parameter list, the way
// cuLaunchKernel does: each parameter is a pointer to its value. argv = gx gy gz bx by bz,
// then per kernel parameter "a:PATH" (an array: the file's bytes are the buffer, written
// back after the launch) or "s:PATH" (a scalar: the file holds its bytes, which must be
// exactly as many as the parameter's C type has). KERNEL_PATH and KERNEL_FUNCTION come
// from -D flags, like the configuration's defines.
#include "cuda_emu.h"
#include KERNEL_PATH

#include <tuple>
#include <type_traits>
#include <utility>

static std::vector<unsigned char> read_file(const char *path) {
    FILE *f = std::fopen(path, "rb");
    if (!f) { std::perror(path); std::exit(2); }
    std::fseek(f, 0, SEEK_END);
    const long bytes = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    std::vector<unsigned char> data(bytes);
    if (std::fread(data.data(), 1, bytes, f) != (size_t)bytes) { std::perror(path); std::exit(2); }
    std::fclose(f);
    return data;
}

struct Param {
    bool array;
    std::vector<unsigned char> bytes;
    void *pointer;
};

template <class A> A param_value(Param &p, int index) {
    if constexpr (std::is_pointer_v<A>) {
        if (!p.array) { std::fprintf(stderr, "parameter %d is a pointer, got a scalar\n", index); std::exit(3); }
        return static_cast<A>(p.pointer);
    } else {
        if (p.array || p.bytes.size() != sizeof(A)) {
            std::fprintf(stderr, "parameter %d takes %zu bytes by value, got %s of %zu bytes\n", index, sizeof(A),
                         p.array ? "an array" : "a scalar", p.bytes.size());
            std::exit(3);
        }
        A v;
        std::memcpy(&v, p.bytes.data(), sizeof(A));
        return v;
    }
}

template <class... A, std::size_t... I>
static void call(void (*f)(A...), std::vector<Param> &params, std::index_sequence<I...>) {
    // Converted once, outside the threads, so that a mismatch exits before any thread starts.
    std::tuple<A...> values{param_value<A>(params[I], (int)I)...};
    emu_launch(gridDim, blockDim, [&] { f(std::get<I>(values)...); });
}

template <class... A> static void call(void (*f)(A...), std::vector<Param> &params) {
    if (params.size() != sizeof...(A)) {
        std::fprintf(stderr, "kernel takes %zu parameters, got %zu\n", sizeof...(A), params.size());
        std::exit(3);
    }
    call(f, params, std::index_sequence_for<A...>{});
}

int main(int argc, char **argv) {
    if (argc < 7) { std::fprintf(stderr, "usage: gx gy gz bx by bz [a:PATH|s:PATH...]\n"); return 2; }
    gridDim = {(unsigned)std::atoi(argv[1]), (unsigned)std::atoi(argv[2]), (unsigned)std::atoi(argv[3])};
    blockDim = {(unsigned)std::atoi(argv[4]), (unsigned)std::atoi(argv[5]), (unsigned)std::atoi(argv[6])};
    std::vector<Param> params;
    for (int i = 7; i < argc; i++) params.push_back({argv[i][0] == 'a', read_file(argv[i] + 2), nullptr});
    for (auto &p : params) p.pointer = p.bytes.data();
    call(&KERNEL_FUNCTION, params);
    for (int i = 7; i < argc; i++) {
        Param &p = params[i - 7];
        if (!p.array) continue;
        FILE *f = std::fopen(argv[i] + 2, "wb");
        std::fwrite(p.bytes.data(), 1, p.bytes.size(), f);
        std::fclose(f);
    }
    return 0;
}
