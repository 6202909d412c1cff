// The causal depthwise taps of a Canon layer in one pass over memory (CPU, float and double).
//
// y[b, n, c] = sum_s taps[K-1-s, c] * x[b, P + n - s, c]     (inputs before x's start are zero)
//
// x is (B, P + N, C) contiguous, w (K, C) the tap weights; ``forward`` folds the residual into
// them (taps = w, plus 1 at the identity tap). The torch-op version
// (structconv.nn.canon.CausalTaps) makes K passes forward and 2K backward over the
// activations, each a separate call; a Canon layer is memory-bound, so here each output row is
// a register sum over its K input rows (forward: one read of x, one write of y), and the
// backward is one walk over the rows: the input gradient the same way from g, the tap gradient
// accumulated from the same rows while they are in cache. The autograd node is C++ (no Python
// in the backward); a backward that builds a graph runs recorded torch ops instead.
#include <torch/extension.h>
#include <torch/csrc/autograd/custom_function.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <mutex>
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
void backward_rows(const T* g, const T* x, const T* taps, T* gx, double* gt, int64_t B,
                   int64_t L, int64_t N, int64_t C, int64_t K, int64_t P) {
  // One walk over the input rows m of each batch item, with g's and x's rows in cache:
  //   gx[b, m, c] = sum_s taps[K-1-s, c] * g[b, m - P + s, c] over outputs n = m - P + s in [0, N)
  //   gt[K-1-s, c] += g[b, n, c] * x[b, P + n - s, c] at the output row n = m - P
  // (gx or gt may be null: not needed). Batch items in parallel; each chunk sums the tap
  // gradient in T over runs of ROWS rows (vectorised), the runs in double, the chunks under a lock.
  constexpr int64_t ROWS = 128;
  std::mutex lock;
  at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
    std::vector<const T*> src(K), w(K);
    std::vector<T> run(gt ? K * C : 0, T(0));
    std::vector<double> acc(gt ? K * C : 0, 0.0);
    int64_t rows = 0;
    for (int64_t b = lo; b < hi; ++b) {
      for (int64_t m = 0; m < L; ++m) {
        if (gx) {
          int k = 0;
          for (int64_t s = 0; s < K; ++s) {
            const int64_t n = m - P + s;
            if (n < 0) continue;
            if (n >= N) break;
            src[k] = g + (b * N + n) * C;
            w[k++] = taps + (K - 1 - s) * C;
          }
          row_sum_any<T>(gx + (b * L + m) * C, src.data(), w.data(), k, C);
        }
        if (gt && m >= P) {
          const int64_t n = m - P;
          const T* __restrict__ gr = g + (b * N + n) * C;
          for (int64_t s = 0; s < K; ++s) {
            const int64_t mm = m - s;
            if (mm < 0) break;
            const T* __restrict__ xr = x + (b * L + mm) * C;
            T* __restrict__ ar = run.data() + s * C;
            for (int64_t c = 0; c < C; ++c) ar[c] += gr[c] * xr[c];
          }
          if (++rows == ROWS) {
            for (int64_t i = 0; i < K * C; ++i) acc[i] += double(run[i]);
            std::fill(run.begin(), run.end(), T(0));
            rows = 0;
          }
        }
      }
    }
    if (gt) {
      for (int64_t i = 0; i < K * C; ++i) acc[i] += double(run[i]);
      std::lock_guard<std::mutex> guard(lock);
      for (int64_t s = 0; s < K; ++s)
        for (int64_t c = 0; c < C; ++c) gt[(K - 1 - s) * C + c] += acc[s * C + c];
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

std::vector<torch::Tensor> forward(torch::Tensor x, torch::Tensor w, int64_t identity,
                                   int64_t past) {
  // the residual folded into the taps here (one small op, no Python dispatch): returns
  // (y, taps), the taps kept for the backward
  auto taps = w.contiguous().clone();
  TORCH_CHECK(identity >= 0 && identity < taps.size(0), "causal_taps: identity tap outside");
  taps.select(0, identity).add_(1);
  check(x, taps, past);
  const int64_t B = x.size(0), L = x.size(1), C = x.size(2), K = taps.size(0), N = L - past;
  auto y = torch::empty({B, N, C}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_taps_forward", [&] {
    forward_rows<scalar_t>(x.data_ptr<scalar_t>(), taps.data_ptr<scalar_t>(),
                           y.data_ptr<scalar_t>(), B, L, N, C, K, past);
  });
  return {y, taps};
}

std::vector<torch::Tensor> backward(torch::Tensor g, torch::Tensor x, torch::Tensor taps,
                                    int64_t past, bool need_x, bool need_taps) {
  check(x, taps, past);
  g = g.contiguous();
  const int64_t B = x.size(0), L = x.size(1), C = x.size(2), K = taps.size(0), N = L - past;
  TORCH_CHECK(g.size(0) == B && g.size(1) == N && g.size(2) == C &&
              g.scalar_type() == x.scalar_type(), "causal_taps: g (B, N, C) expected");
  torch::Tensor gx, gt;
  if (need_x) gx = torch::empty_like(x);
  torch::Tensor acc;  // the tap gradient's sums in double, when it is needed
  if (need_taps) acc = torch::zeros({K, C}, x.options().dtype(torch::kFloat64));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "causal_taps_backward", [&] {
    backward_rows<scalar_t>(g.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                            taps.data_ptr<scalar_t>(),
                            need_x ? gx.data_ptr<scalar_t>() : nullptr,
                            need_taps ? acc.data_ptr<double>() : nullptr, B, L, N, C, K, past);
  });
  if (need_taps) gt = acc.to(x.scalar_type());
  return {gx, gt};
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The differentiable form of the backward (torch ops, recorded when a graph is being built:
// create_graph=True), so that the kernel's gradient can be differentiated again.
tensor_list backward_ops(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& taps,
                         int64_t P) {
  const int64_t L = x.size(1), N = g.size(1), K = taps.size(0);
  // x's rows as the outputs read them: xp[:, j] = x[:, j - (K - 1) + P], zero before x's start
  auto xp = torch::constant_pad_nd(x, {0, 0, K - 1, 0});
  auto gp = torch::constant_pad_nd(g, {0, 0, P, K - 1});  // g on x's rows, K - 1 zero rows after
  auto gx = torch::zeros_like(x);
  std::vector<torch::Tensor> gts;
  for (int64_t s = 0; s < K; ++s) {
    auto tap = taps.select(0, K - 1 - s);
    gx = gx + gp.narrow(1, s, L) * tap;  // gx[m] += taps[K-1-s] * g[m - P + s]
    gts.push_back((g * xp.narrow(1, K - 1 - s + P, N)).sum({0, 1}));
  }
  std::reverse(gts.begin(), gts.end());
  return {gx, torch::stack(gts)};
}

class CausalTapsFunction : public torch::autograd::Function<CausalTapsFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor w,
                               int64_t identity, int64_t past) {
    auto xc = x.contiguous();
    auto out = ::forward(xc, w.to(x.scalar_type()), identity, past);
    // w itself is saved (a graph-building backward differentiates through it); the folded
    // taps ride along as data for the kernel's backward
    ctx->save_for_backward({xc, w});
    ctx->saved_data["taps"] = out[1];
    ctx->saved_data["identity"] = identity;
    ctx->saved_data["past"] = past;
    ctx->saved_data["wdtype"] = static_cast<int64_t>(w.scalar_type());
    return out[0];
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    const int64_t P = ctx->saved_data["past"].toInt();
    const auto wdtype = static_cast<at::ScalarType>(ctx->saved_data["wdtype"].toInt());
    const bool nx = ctx->needs_input_grad(0), nw = ctx->needs_input_grad(1);
    torch::Tensor gx, gt;
    if (torch::GradMode::is_enabled()) {
      const int64_t identity = ctx->saved_data["identity"].toInt();
      auto eye = torch::zeros({w.size(0), 1}, x.options());
      eye.select(0, identity).fill_(1);
      auto r = backward_ops(grads[0], x, w.to(x.scalar_type()) + eye, P);
      gx = r[0];
      gt = r[1];
    } else {
      auto r = ::backward(grads[0], x, ctx->saved_data["taps"].toTensor(), P, nx, nw);
      gx = r[0];
      gt = r[1];
    }
    if (!nx) gx = torch::Tensor();
    if (!nw) gt = torch::Tensor();
    if (gt.defined() && gt.scalar_type() != wdtype) gt = gt.to(wdtype);
    return {gx, gt, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

// y with its gradient function (the autograd node is C++: no Python runs in the backward)
torch::Tensor apply(torch::Tensor x, torch::Tensor w, int64_t identity, int64_t past) {
  return CausalTapsFunction::apply(x, w, identity, past);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "causal depthwise taps, forward: (y, taps)");
  m.def("backward", &backward, "causal depthwise taps, backward: (gx, gtaps)");
  m.def("apply", &apply, "causal depthwise taps with their autograd node");
}
