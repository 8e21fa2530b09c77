// How fast this core runs the AVX2 qdot kernel's instructions on their own (benchmarks/simd_floor.py builds and
// runs it): the clock, the throughput of vpmaddubsw, vpaddw, vpbroadcastd and of the multiply-add pair the
// kernel's inner loop is made of, and one weight group of the kernel's 4-bit, four-row pass written out in
// assembly, every byte in L1 (no compiler in between: what the kernel's instruction mix itself costs). One thread; timings by
// steady_clock, cycles from the measured clock (no hardware counters needed: many VMs have none).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A chain of dependent 64-bit multiplies: 3 cycles each on every x86 core of the last decade.
double clock_ghz() {
  long n = 200000000, a = 3;
  const auto t0 = std::chrono::steady_clock::now();
  asm volatile("1:\n imul %1,%1\n imul %1,%1\n imul %1,%1\n imul %1,%1\n dec %0\n jnz 1b" : "+r"(n), "+r"(a));
  return 3.0 * 4 * 200000000 / seconds_since(t0) / 1e9;
}

#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
                 "xmm12", "xmm13", "xmm14", "xmm15", "memory"

// 16 independent instructions a loop iteration, enough that the loop's own cost does not show.
#define X16(ins) ins ins ins ins ins ins ins ins ins ins ins ins ins ins ins ins
double cycles_per(const char* what, double ghz) {
  long n = 20000000;
  alignas(32) static int32_t cell[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto t0 = std::chrono::steady_clock::now();
  const char k = what[0];
  if (k == 'm') {  // vpmaddubsw, into 8 rotating registers
    asm volatile("vpxor %%ymm0,%%ymm0,%%ymm0\n vpxor %%ymm1,%%ymm1,%%ymm1\n .p2align 6\n 1:\n"
                 X16("vpmaddubsw %%ymm0, %%ymm1, %%ymm2\n vpmaddubsw %%ymm0, %%ymm1, %%ymm3\n")
                 "dec %0\n jnz 1b\n" : "+r"(n) : : CLOBBERS);
    return seconds_since(t0) * ghz * 1e9 / (32.0 * 20000000);
  }
  if (k == 'a') {  // vpaddw
    asm volatile("vpxor %%ymm0,%%ymm0,%%ymm0\n vpxor %%ymm1,%%ymm1,%%ymm1\n .p2align 6\n 1:\n"
                 X16("vpaddw %%ymm0, %%ymm1, %%ymm2\n vpaddw %%ymm0, %%ymm1, %%ymm3\n")
                 "dec %0\n jnz 1b\n" : "+r"(n) : : CLOBBERS);
    return seconds_since(t0) * ghz * 1e9 / (32.0 * 20000000);
  }
  if (k == 'b') {  // vpbroadcastd from memory
    asm volatile(".p2align 6\n 1:\n"
                 X16("vpbroadcastd (%1), %%ymm2\n vpbroadcastd 4(%1), %%ymm3\n")
                 "dec %0\n jnz 1b\n" : "+r"(n) : "r"(cell) : CLOBBERS);
    return seconds_since(t0) * ghz * 1e9 / (32.0 * 20000000);
  }
  // 'p': the inner loop's pair, a product added into one of eight int16 sums (as the kernel's four-row pass keeps
  // eight: each sum's chain of adds is then no longer than the multiplies' throughput allows)
#define PAIR(t, a) "vpmaddubsw %%ymm0, %%ymm1, %%ymm" #t "\n vpaddw %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n"
  asm volatile("vpxor %%ymm0,%%ymm0,%%ymm0\n vpxor %%ymm1,%%ymm1,%%ymm1\n .p2align 6\n 1:\n"
               PAIR(2, 8) PAIR(3, 9) PAIR(4, 10) PAIR(5, 11) PAIR(6, 12) PAIR(7, 13) PAIR(2, 14) PAIR(3, 15)
               PAIR(4, 8) PAIR(5, 9) PAIR(6, 10) PAIR(7, 11) PAIR(2, 12) PAIR(3, 13) PAIR(4, 14) PAIR(5, 15)
               PAIR(6, 8) PAIR(7, 9) PAIR(2, 10) PAIR(3, 11) PAIR(4, 12) PAIR(5, 13) PAIR(6, 14) PAIR(7, 15)
               PAIR(2, 8) PAIR(3, 9) PAIR(4, 10) PAIR(5, 11) PAIR(6, 12) PAIR(7, 13) PAIR(2, 14) PAIR(3, 15)
               "dec %0\n jnz 1b\n" : "+r"(n) : : CLOBBERS);
  return seconds_since(t0) * ghz * 1e9 / (32.0 * 20000000);
}

// One weight group (32 values) of a 16-row block of 4-bit codes against four activation rows, as the kernel's
// AVX2 pass does it: four 8-value steps (two 32-byte loads, the nibbles split, each row's two broadcasts and four
// products into its two int16 sums), then each sum times its rows' scale codes (vpmaddwd) added into the
// super-block's int32 sums in memory. Returns cycles per 32 multiply-adds and activation row.
double kernel_group_cycles(double ghz) {
  constexpr int K = 1536;
  alignas(64) static uint8_t w[K / 8 * 64];
  alignas(64) static int8_t x[K / 8 * 4 * 8];
  alignas(64) static int16_t sc[K / 32 * 32];
  alignas(64) static int32_t isum[8 * 8];
  for (auto& b : w) b = static_cast<uint8_t>(rand());
  for (auto& b : x) b = static_cast<int8_t>(rand() % 64);
  for (auto& b : sc) b = static_cast<int16_t>(rand() % 64);
  const long reps = 40000;
  const auto t0 = std::chrono::steady_clock::now();
  for (long r = 0; r < reps; ++r) {
    const uint8_t* p = w;
    const int8_t* xs = x;
    const int16_t* s = sc;
    for (int g = 0; g < K / 32; ++g, p += 256, xs += 128, s += 32) {
      asm volatile(
          "vpxor %%ymm0,%%ymm0,%%ymm0\n vpxor %%ymm1,%%ymm1,%%ymm1\n vpxor %%ymm2,%%ymm2,%%ymm2\n"
          "vpxor %%ymm3,%%ymm3,%%ymm3\n vpxor %%ymm4,%%ymm4,%%ymm4\n vpxor %%ymm5,%%ymm5,%%ymm5\n"
          "vpxor %%ymm6,%%ymm6,%%ymm6\n vpxor %%ymm7,%%ymm7,%%ymm7\n"
          "mov $0x0f0f0f0f, %%eax\n vmovd %%eax, %%xmm12\n vpbroadcastd %%xmm12, %%ymm12\n"
#define ROW(o, a0, a1)                                                                   \
  "vpbroadcastd " #o "(%[x]), %%ymm13\n vpbroadcastd " #o "+4(%[x]), %%ymm14\n"          \
  "vpmaddubsw %%ymm13, %%ymm8, %%ymm15\n vpaddw %%ymm15, %%" a0 ", %%" a0 "\n"           \
  "vpmaddubsw %%ymm13, %%ymm10, %%ymm15\n vpaddw %%ymm15, %%" a1 ", %%" a1 "\n"          \
  "vpmaddubsw %%ymm14, %%ymm9, %%ymm15\n vpaddw %%ymm15, %%" a0 ", %%" a0 "\n"           \
  "vpmaddubsw %%ymm14, %%ymm11, %%ymm15\n vpaddw %%ymm15, %%" a1 ", %%" a1 "\n"
#define STEP(po, xo)                                                                                        \
  "vmovdqu " #po "(%[p]), %%ymm8\n vmovdqu " #po "+32(%[p]), %%ymm10\n"                                     \
  "vpsrlw $4, %%ymm8, %%ymm9\n vpsrlw $4, %%ymm10, %%ymm11\n"                                               \
  "vpand %%ymm12, %%ymm8, %%ymm8\n vpand %%ymm12, %%ymm9, %%ymm9\n"                                         \
  "vpand %%ymm12, %%ymm10, %%ymm10\n vpand %%ymm12, %%ymm11, %%ymm11\n"                                     \
  ROW(xo, "ymm0", "ymm1") ROW(xo + 8, "ymm2", "ymm3") ROW(xo + 16, "ymm4", "ymm5") ROW(xo + 24, "ymm6", "ymm7")
#define EPILOGUE(a, h, o) \
  "vpmaddwd %%" h ", %%" a ", %%" a "\n vpaddd " #o "(%[isum]), %%" a ", %%" a "\n vmovdqa %%" a ", " #o "(%[isum])\n"
          STEP(0, 0) STEP(64, 32) STEP(128, 64) STEP(192, 96)
          "vmovdqa (%[sc]), %%ymm8\n vmovdqa 32(%[sc]), %%ymm9\n"
          EPILOGUE("ymm0", "ymm8", 0) EPILOGUE("ymm1", "ymm9", 32) EPILOGUE("ymm2", "ymm8", 64)
          EPILOGUE("ymm3", "ymm9", 96) EPILOGUE("ymm4", "ymm8", 128) EPILOGUE("ymm5", "ymm9", 160)
          EPILOGUE("ymm6", "ymm8", 192) EPILOGUE("ymm7", "ymm9", 224)
          :
          : [p] "r"(p), [x] "r"(xs), [sc] "r"(s), [isum] "r"(isum)
          : "rax", CLOBBERS);
    }
  }
  const double units = double(reps) * K * 16 * 4 / 32;  // (16 weight rows x K values / 32) x 4 activation rows
  return seconds_since(t0) * ghz * 1e9 / units;
}

// AVX-512 VNNI (run only where the CPU has it): vpdpbusd on zmm registers, 64 multiply-adds per activation row, into
// twelve accumulators (each its own chain), and vpmulld zmm, the per-group scale step of the kernel's K-quant path.
// Cycles per 32 multiply-adds and row for 'd' (half an instruction), per instruction for 'l'.
double vnni_cycles_per(char k, double ghz) {
  long n = 20000000;
  const auto t0 = std::chrono::steady_clock::now();
#define DP(a) "vpdpbusd %%zmm0, %%zmm1, %%zmm" #a "\n"
#define ML(a) "vpmulld %%zmm0, %%zmm1, %%zmm" #a "\n"
  if (k == 'd') {
    asm volatile("vpxord %%zmm0,%%zmm0,%%zmm0\n vpxord %%zmm1,%%zmm1,%%zmm1\n .p2align 6\n 1:\n"
                 DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11) DP(12) DP(13)
                 DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11) DP(12) DP(13)
                 "dec %0\n jnz 1b\n" : "+r"(n) : : CLOBBERS);
    return seconds_since(t0) * ghz * 1e9 / (24.0 * 20000000) / 2;
  }
  asm volatile("vpxord %%zmm0,%%zmm0,%%zmm0\n vpxord %%zmm1,%%zmm1,%%zmm1\n .p2align 6\n 1:\n"
               ML(2) ML(3) ML(4) ML(5) ML(6) ML(7) ML(8) ML(9) ML(10) ML(11) ML(12) ML(13)
               ML(2) ML(3) ML(4) ML(5) ML(6) ML(7) ML(8) ML(9) ML(10) ML(11) ML(12) ML(13)
               "dec %0\n jnz 1b\n" : "+r"(n) : : CLOBBERS);
  return seconds_since(t0) * ghz * 1e9 / (24.0 * 20000000);
}

// One weight group (32 values) of a 16-row block of 4-bit codes against eight activation rows, as the kernel's
// AVX-512 VNNI pass does it: four 8-value steps (one 64-byte load, the nibbles split, each row's two vpdpbusd with
// its four activation bytes broadcast from memory into its int32 sum), then each sum times the 16 rows' scale codes
// (vpmovzxbd, vpmulld) added into the super-block's int32 sums in memory. Cycles per 32 multiply-adds and row.
double vnni_group_cycles(double ghz) {
  constexpr int K = 1536;
  alignas(64) static uint8_t w[K / 8 * 64];
  alignas(64) static int8_t x[8 * K];
  alignas(64) static uint8_t sc[K / 32 * 16];
  alignas(64) static int32_t isum[8 * 16];
  for (auto& b : w) b = static_cast<uint8_t>(rand());
  for (auto& b : x) b = static_cast<int8_t>(rand() % 64);
  for (auto& b : sc) b = static_cast<uint8_t>(rand() % 64);
  const long reps = 40000;
  const auto t0 = std::chrono::steady_clock::now();
  for (long r = 0; r < reps; ++r) {
    const uint8_t* p = w;
    const int8_t* xs = x;
    const uint8_t* s = sc;
    for (int g = 0; g < K / 32; ++g, p += 256, xs += 32, s += 16) {
      asm volatile(
          "vpxord %%zmm0,%%zmm0,%%zmm0\n vpxord %%zmm1,%%zmm1,%%zmm1\n vpxord %%zmm2,%%zmm2,%%zmm2\n"
          "vpxord %%zmm3,%%zmm3,%%zmm3\n vpxord %%zmm4,%%zmm4,%%zmm4\n vpxord %%zmm5,%%zmm5,%%zmm5\n"
          "vpxord %%zmm6,%%zmm6,%%zmm6\n vpxord %%zmm7,%%zmm7,%%zmm7\n"
          "mov $0x0f0f0f0f, %%eax\n vpbroadcastd %%eax, %%zmm12\n"
#define VROW(row, xo, a) \
  "vpdpbusd " #row "*1536+" #xo "(%[x])%{1to16%}, %%zmm8, %%" a "\n vpdpbusd " #row "*1536+" #xo "+4(%[x])%{1to16%}, %%zmm9, %%" a "\n"
#define VSTEP(po, xo)                                                                                        \
  "vmovdqu64 " #po "(%[p]), %%zmm8\n vpsrlw $4, %%zmm8, %%zmm9\n"                                            \
  "vpandd %%zmm12, %%zmm8, %%zmm8\n vpandd %%zmm12, %%zmm9, %%zmm9\n"                                        \
  VROW(0, xo, "zmm0") VROW(1, xo, "zmm1") VROW(2, xo, "zmm2") VROW(3, xo, "zmm3")                            \
  VROW(4, xo, "zmm4") VROW(5, xo, "zmm5") VROW(6, xo, "zmm6") VROW(7, xo, "zmm7")
#define VEPILOGUE(a, o) \
  "vpmulld %%zmm13, %%" a ", %%zmm14\n vpaddd " #o "(%[isum]), %%zmm14, %%zmm14\n vmovdqa64 %%zmm14, " #o "(%[isum])\n"
          VSTEP(0, 0) VSTEP(64, 8) VSTEP(128, 16) VSTEP(192, 24)
          "vpmovzxbd (%[sc]), %%zmm13\n"
          VEPILOGUE("zmm0", 0) VEPILOGUE("zmm1", 64) VEPILOGUE("zmm2", 128) VEPILOGUE("zmm3", 192)
          VEPILOGUE("zmm4", 256) VEPILOGUE("zmm5", 320) VEPILOGUE("zmm6", 384) VEPILOGUE("zmm7", 448)
          :
          : [p] "r"(p), [x] "r"(xs), [sc] "r"(s), [isum] "r"(isum)
          : "rax", CLOBBERS);
    }
  }
  const double units = double(reps) * K * 16 * 8 / 32;  // (16 weight rows x K values / 32) x 8 activation rows
  return seconds_since(t0) * ghz * 1e9 / units;
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? atoi(argv[1]) : 3;
  const bool vnni = argc > 2 && argv[2][0] == 'v';  // the caller checked the CPU's flags
  for (int r = 0; r < repeats; ++r) {  // the best of each over the repeats is printed by the caller
    const double ghz = clock_ghz();
    printf("clock_ghz %.3f\n", ghz);
    printf("vpmaddubsw %.3f\n", cycles_per("m", ghz));
    printf("vpaddw %.3f\n", cycles_per("a", ghz));
    printf("vpbroadcastd %.3f\n", cycles_per("b", ghz));
    printf("pair %.3f\n", cycles_per("p", ghz));
    printf("group_asm %.3f\n", kernel_group_cycles(ghz));
    if (vnni) {
      printf("vpdpbusd %.3f\n", vnni_cycles_per('d', ghz));
      printf("vpmulld %.3f\n", vnni_cycles_per('l', ghz));
      printf("vnni_group_asm %.3f\n", vnni_group_cycles(ghz));
    }
  }
  return 0;
}
