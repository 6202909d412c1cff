// The causal depthwise taps of a Canon layer in one pass over memory (CPU, float and double).
//
// y[b, n, c] = sum_s taps[K-1-s, c] * x[b, P + n - s, c]     (inputs before x's start are zero)
//
// x is (B, P + N, C) contiguous, taps (K, C) contiguous (the residual already folded in).
// The torch-op version (structconv.nn.canon.CausalTaps) makes K passes forward and 2K
// backward over the activations, each a separate call; a Canon layer is memory-bound, so this
// kernel reads each input row once per output row it feeds while it is still in cache:
// forward 1 read of x and 1 write of y, backward 1 read of g and x, 1 write of gx, and the tap
// gradient accumulated per channel block in registers.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace {

// One output row: out[c] = sum over the k (<= KK) rows src[i] of w[i][c] * src[i][c], summed in
// registers (KK a compile-time count: the tap loop unrolls and the channel loop vectorises).
template <typename T, int KK>
inline void row_sum(T* __restrict__ out, const T* const* src, const T* const* w, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    T acc = w[0][c] * src[0][c];
    for (int i = 1; i < KK; ++i) acc += w[i][c] * src[i][c];
    out[c] = acc;
  }
}

template <typename T>
inline void row_sum_any(T* __restrict__ out, const T* const* src, const T* const* w, int k,
                        int64_t C) {
  switch (k) {
    case 0: std::fill(out, out + C, T(0)); return;
    case 1: return row_sum<T, 1>(out, src, w, C);
    case 2: return row_sum<T, 2>(out, src, w, C);
    case 3: return row_sum<T, 3>(out, src, w, C);
    case 4: return row_sum<T, 4>(out, src, w, C);
    case 5: return row_sum<T, 5>(out, src, w, C);
    case 6: return row_sum<T, 6>(out, src, w, C);
    case 7: return row_sum<T, 7>(out, src, w, C);
    case 8: return row_sum<T, 8>(out, src, w, C);
    default: {
      row_sum<T, 8>(out, src, w, C);
      for (int i = 8; i < k; ++i) {
        const T* __restrict__ a = w[i];
        const T* __restrict__ v = src[i];
        for (int64_t c = 0; c < C; ++c) out[c] += a[c] * v[c];
      }
    }
  }
}

template <typename T>
void forward_rows(const T* x, const T* taps, T* y, int64_t B, int64_t L, int64_t N, int64_t C,
                  int64_t K, int64_t P) {
  at::parallel_for(0, B * N, 16, [&](int64_t lo, int64_t hi) {
    std::vector<const T*> src(K), w(K);
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t b = r / N, n = r % N;
      int k = 0;  // the taps that read an input (the current one always does)
      for (int64_t s = 0; s < K; ++s) {
        const int64_t m = P + n - s;
        if (m < 0) break;
        src[k] = x + (b * L + m) * C;
        w[k++] = taps + (K - 1 - s) * C;
      }
      row_sum_any<T>(y + r * C, src.data(), w.data(), k, C);
    }
  });
}

template <typename T>
void input_grad_rows(const T* g, const T* taps, T* gx, int64_t B, int64_t L, int64_t N,
                     int64_t C, int64_t K, int64_t P) {
  // gx[b, m, c] = sum_s taps[K-1-s, c] * g[b, m - P + s, c] over outputs n = m - P + s in [0, N)
  at::parallel_for(0, B * L, 16, [&](int64_t lo, int64_t hi) {
    std::vector<const T*> src(K), w(K);
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t b = r / L, m = r % L;
      int k = 0;
      for (int64_t s = 0; s < K; ++s) {
        const int64_t n = m - P + s;
        if (n < 0) continue;
        if (n >= N) break;
        src[k] = g + (b * N + n) * C;
        w[k++] = taps + (K - 1 - s) * C;
      }
      row_sum_any<T>(gx + r * C, src.data(), w.data(), k, C);
    }
  });
}

template <typename T>
void taps_grad(const T* g, const T* x, T* gt, int64_t B, int64_t L, int64_t N, int64_t C,
               int64_t K, int64_t P) {
  // gt[K-1-s, c] = sum_{b, n} g[b, n, c] * x[b, P + n - s, c]. Channel blocks in parallel,
  // each walking every row once (a block's part of a row is contiguous); sums in T over runs
  // of ROWS rows (vectorised), the runs added in double (long sums stay accurate)
  constexpr int64_t CB = 128, ROWS = 128;
  const int64_t blocks = (C + CB - 1) / CB;
  at::parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
    std::vector<T> run(K * CB);
    std::vector<double> acc(K * CB);
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t c0 = blk * CB, cw = std::min(CB, C - c0);
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(run.begin(), run.end(), T(0));
      int64_t rows = 0;
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t n = 0; n < N; ++n) {
          const T* __restrict__ gr = g + (b * N + n) * C + c0;
          for (int64_t s = 0; s < K; ++s) {
            const int64_t m = P + n - s;
            if (m < 0) break;
            const T* __restrict__ xr = x + (b * L + m) * C + c0;
            T* __restrict__ ar = run.data() + s * CB;
            for (int64_t c = 0; c < cw; ++c) ar[c] += gr[c] * xr[c];
          }
          if (++rows == ROWS) {
            for (int64_t i = 0; i < K * CB; ++i) acc[i] += double(run[i]);
            std::fill(run.begin(), run.end(), T(0));
            rows = 0;
          }
        }
      }
      for (int64_t i = 0; i < K * CB; ++i) acc[i] += double(run[i]);
      for (int64_t s = 0; s < K; ++s)
        for (int64_t c = 0; c < cw; ++c) gt[(K - 1 - s) * C + c0 + c] = T(acc[s * CB + c]);
    }
  });
}

void check(const torch::Tensor& x, const torch::Tensor& taps, int64_t past) {
  TORCH_CHECK(x.device().is_cpu() && taps.device().is_cpu(), "causal_taps: CPU tensors only");
  TORCH_CHECK(x.dim() == 3 && taps.dim() == 2 && x.size(2) == taps.size(1),
              "causal_taps: x (B, L, C) and taps (K, C) expected");
  TORCH_CHECK(x.is_contiguous() && taps.is_contiguous(), "causal_taps: contiguous tensors");
  TORCH_CHECK(x.scalar_type() == taps.scalar_type(), "causal_taps: one dtype");
  TORCH_CHECK(past >= 0 && past <= x.size(1), "causal_taps: 0 <= past <= L");
}

}  // namespace

torch::Tensor forward(torch::Tensor x, torch::Tensor taps, int64_t past) {
  check(x, taps, past);
  const int64_t B = x.size(0), L = x.size(1), C = x.size(2), K = taps.size(0), N = L - past;
  auto y = torch::empty({B, N, C}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_taps_forward", [&] {
    forward_rows<scalar_t>(x.data_ptr<scalar_t>(), taps.data_ptr<scalar_t>(),
                           y.data_ptr<scalar_t>(), B, L, N, C, K, past);
  });
  return y;
}

std::vector<torch::Tensor> backward(torch::Tensor g, torch::Tensor x, torch::Tensor taps,
                                    int64_t past, bool need_x, bool need_taps) {
  check(x, taps, past);
  const int64_t B = x.size(0), L = x.size(1), C = x.size(2), K = taps.size(0), N = L - past;
  TORCH_CHECK(g.is_contiguous() && g.size(0) == B && g.size(1) == N && g.size(2) == C &&
              g.scalar_type() == x.scalar_type(), "causal_taps: g (B, N, C) expected");
  torch::Tensor gx, gt;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_taps_backward", [&] {
    if (need_x) {
      gx = torch::empty_like(x);
      input_grad_rows<scalar_t>(g.data_ptr<scalar_t>(), taps.data_ptr<scalar_t>(),
                                gx.data_ptr<scalar_t>(), B, L, N, C, K, past);
    }
    if (need_taps) {
      gt = torch::empty_like(taps);
      taps_grad<scalar_t>(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                          gt.data_ptr<scalar_t>(), B, L, N, C, K, past);
    }
  });
  return {gx, gt};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "causal depthwise taps, forward");
  m.def("backward", &backward, "causal depthwise taps, backward");
}
