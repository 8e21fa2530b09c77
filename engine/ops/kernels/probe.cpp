// Read-bandwidth probe for the benchmarks: how fast the current threads can stream a large buffer.
//
// Why native: the decode kernels read their weights with wide vector loads from every thread at once,
// and PyTorch's own reductions (torch.mv, sum) reach only 70-80 % of that on the same host, so a bound
// computed from them was exceeded by both engines. This loop does what the kernels do and nothing
// else: 64-byte loads, split across at::parallel_for's threads, XOR-folded so the compiler cannot drop
// them (the result is returned; its value means nothing).
//
//   read_stream(buf uint8 [n]) -> int   n a multiple of 64; one pass over buf

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

namespace {

int64_t read_stream(const at::Tensor& buf) {
  TORCH_CHECK(buf.device().is_cpu() && buf.scalar_type() == at::kByte && buf.is_contiguous() && buf.dim() == 1,
              "read_stream: a contiguous 1-D uint8 CPU tensor");
  TORCH_CHECK(buf.numel() % 64 == 0, "read_stream: the length must be a multiple of 64 bytes");
  const uint64_t* p = reinterpret_cast<const uint64_t*>(buf.data_ptr<uint8_t>());
  const int64_t lines = buf.numel() / 64;
  const int64_t threads = at::get_num_threads();
  std::vector<uint64_t> partial(threads, 0);
  at::parallel_for(0, lines, 4096, [&](int64_t begin, int64_t end) {
    uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t l = begin; l < end; ++l) {
      const uint64_t* line = p + 8 * l;
      for (int j = 0; j < 8; ++j) acc[j] ^= line[j];
    }
    uint64_t r = 0;
    for (int j = 0; j < 8; ++j) r ^= acc[j];
    partial[at::get_thread_num() % threads] ^= r;
  });
  uint64_t r = 0;
  for (uint64_t v : partial) r ^= v;
  return static_cast<int64_t>(r);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(QDOT_NAMESPACE, m) {
  m.def("read_stream(Tensor buf) -> int");
}

TORCH_LIBRARY_IMPL(QDOT_NAMESPACE, CPU, m) {
  m.impl("read_stream", &read_stream);
}
