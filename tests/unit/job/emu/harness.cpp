// Runs one emulated kernel launch: argv = gx gy gz bx by bz, then one float32 file per
// kernel argument (output first). The output file is overwritten with the result.
// KERNEL_PATH, KERNEL_CALL (a call expression over buf[i]) and optionally
// KERNEL_CONSTANTS (statements filling __constant__ symbols) come from -D flags.
#include "cuda_emu.h"
#include KERNEL_PATH

static std::vector<float> read_file(const char *path) {
    FILE *f = std::fopen(path, "rb");
    if (!f) { std::perror(path); std::exit(2); }
    std::fseek(f, 0, SEEK_END);
    const long bytes = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    std::vector<float> data(bytes / sizeof(float));
    if (std::fread(data.data(), 1, bytes, f) != (size_t)bytes) { std::perror(path); std::exit(2); }
    std::fclose(f);
    return data;
}

int main(int argc, char **argv) {
    if (argc < 8) { std::fprintf(stderr, "usage: gx gy gz bx by bz out [in...]\n"); return 2; }
    const emu_uint3 grid{(unsigned)std::atoi(argv[1]), (unsigned)std::atoi(argv[2]), (unsigned)std::atoi(argv[3])};
    const emu_uint3 block{(unsigned)std::atoi(argv[4]), (unsigned)std::atoi(argv[5]), (unsigned)std::atoi(argv[6])};
    std::vector<std::vector<float>> data;
    for (int i = 7; i < argc; i++) data.push_back(read_file(argv[i]));
    std::vector<float *> buf;
    for (auto &d : data) buf.push_back(d.data());
#ifdef KERNEL_CONSTANTS
    KERNEL_CONSTANTS;
#endif
    emu_launch(grid, block, [&] { KERNEL_CALL; });
    FILE *f = std::fopen(argv[7], "wb");
    std::fwrite(data[0].data(), sizeof(float), data[0].size(), f);
    std::fclose(f);
    return 0;
}
