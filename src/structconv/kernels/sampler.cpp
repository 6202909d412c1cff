// Nested neighbour sampling over a CSR of incoming edges, and the restricted bipartite bases of a
// sample, in compiled CPU code (structconv.sampling's compiled path).
//
// ``sample`` draws, hop by hop, up to ``fanout`` incoming edges of every frontier node (in
// parallel over the frontier: at::parallel_for), relabels the sources (an open-addressing hash
// map global -> local id; a node keeps the id of the first hop that reached it, new nodes are
// appended in increasing global id) and returns the Sample's arrays. ``restrict`` turns a
// sample's edges into one coalesced CSR per edge group (relation) over the target rows, with the
// full graph's operator values gathered by edge id and the operator's diagonal added: every
// hop's operator is a row prefix of it (the sample's blocks are nested). ``gather_rows`` copies
// the input nodes' feature rows. Every loop over random rows prefetches a few rows ahead: the
// work is cache misses, not arithmetic.
//
// Random numbers are counter based, so a node's draws depend on (base seed, hop, the node's
// index in the frontier, slot) and on nothing else: the same on any thread count, and the same
// as the torch-op path (structconv.sampling.sampler), which computes the identical SplitMix64
// values in int64 tensor ops. The algorithms are the torch path's: Floyd's algorithm for uniform
// draws without replacement (fanout <= floyd_max), the f smallest random keys otherwise
// (Efraimidis-Spirakis keys -log1p(-u) / w for weighted draws, ties by CSR position), and
// min(floor(u * deg), deg - 1) per slot with replacement. Output edges of a hop are ordered by
// target node id, then CSR position (the torch path's canonical order).
//
// ``sample_typed`` is the same over typed relations: a CSR per relation, a fanout per relation and
// hop, the relation's index mixed into the hop's counter key (by the caller), one relabelling map
// per node type fed by every relation leaving that type; ``restrict``'s groups are per relation.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// SplitMix64's output function of x + golden: a well-mixed 64-bit value of a counter.
inline uint64_t mix(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from the top 53 bits (the torch path: (r >> 11) * 2^-53).
inline double unit(uint64_t key, int64_t slot) {
  return static_cast<double>(mix(key + static_cast<uint64_t>(slot)) >> 11) * 0x1.0p-53;
}

// Open addressing global id -> local id (keys >= 0; key -1 marks an empty slot); key and value
// side by side, so that a probe is one cache line.
struct IdMap {
  struct Slot {
    int64_t key, val;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;
  int shift = 64;
  int64_t size = 0;

  void reserve(int64_t n) {
    uint64_t cap = 16;
    int bits = 4;
    while (cap < static_cast<uint64_t>(2 * n + 16)) cap <<= 1, ++bits;
    if (cap <= slots.size()) return;
    std::vector<Slot> old = std::move(slots);
    slots.assign(cap, Slot{-1, -1});
    mask = cap - 1;
    shift = 64 - bits;
    size = 0;
    for (const Slot& s : old)
      if (s.key >= 0) slots[index(s.key)].val = s.val;
  }
  inline uint64_t home(int64_t k) const {
    return (static_cast<uint64_t>(k) * kGolden) >> shift;
  }
  inline void prefetch(int64_t k) const { __builtin_prefetch(&slots[home(k)]); }
  // the slot index of k, inserted (value -1) when absent
  uint64_t index(int64_t k) {
    uint64_t i = home(k);
    while (slots[i].key != k) {
      if (slots[i].key < 0) {
        slots[i].key = k;
        ++size;
        return i;
      }
      i = (i + 1) & mask;
    }
    return i;
  }
  int64_t* slot(int64_t k) { return &slots[index(k)].val; }
};

struct Graph {
  const int64_t* rowptr;
  const int64_t* sources;
  const int64_t* perm;
  const double* weight;  // null: uniform
};

// Up to f positions of the range [0, deg), sorted, from the node's key (see the header).
void draw(int64_t deg, int64_t f, bool replace, const double* w, int64_t floyd_max,
          uint64_t key, std::vector<int64_t>& out, std::vector<std::pair<double, int64_t>>& tmp) {
  out.clear();
  if (f < 0 || (!replace && deg <= f)) {
    out.resize(deg);
    std::iota(out.begin(), out.end(), int64_t(0));
    return;
  }
  if (deg == 0) return;
  if (replace) {
    for (int64_t j = 0; j < f; ++j)
      out.push_back(std::min(static_cast<int64_t>(unit(key, j) * static_cast<double>(deg)),
                             deg - 1));
  } else if (w == nullptr && f <= floyd_max) {
    for (int64_t j = 0; j < f; ++j) {  // Floyd: slot j draws t in [0, J], J if t was drawn
      const int64_t J = deg - f + j;
      int64_t t = std::min(static_cast<int64_t>(unit(key, j) * static_cast<double>(J + 1)), J);
      if (std::find(out.begin(), out.end(), t) != out.end()) t = J;
      out.push_back(t);
    }
  } else {  // the f smallest keys, ties by position
    tmp.resize(deg);
    for (int64_t p = 0; p < deg; ++p) {
      double u = unit(key, p);
      if (w != nullptr) {
        const double wp = w[p];
        u = wp > 0 ? -std::log1p(-u) / std::max(wp, std::numeric_limits<double>::min())
                   : std::numeric_limits<double>::infinity();
      }
      tmp[p] = {u, p};
    }
    std::nth_element(tmp.begin(), tmp.begin() + f, tmp.end());
    for (int64_t j = 0; j < f; ++j) out.push_back(tmp[j].second);
  }
  std::sort(out.begin(), out.end());
}

// Non-negative ids in increasing order: LSD radix sort, 11 bits a pass, as many passes as the
// largest id needs (three for 2^33 nodes), O(n) rather than std::sort's O(n log n).
void sort_ids(std::vector<int64_t>& v) {
  if (v.size() < 256) {
    std::sort(v.begin(), v.end());
    return;
  }
  const int64_t top = *std::max_element(v.begin(), v.end());
  std::vector<int64_t> tmp(v.size());
  for (int shift = 0; shift < 64 && (top >> shift) > 0; shift += 11) {
    size_t count[2049] = {0};
    for (int64_t x : v) ++count[((x >> shift) & 2047) + 1];
    for (int k = 0; k < 2048; ++k) count[k + 1] += count[k];
    for (int64_t x : v) tmp[count[(x >> shift) & 2047]++] = x;
    v.swap(tmp);
  }
}

// One relation's draws of a hop: the frontier fr[0, F) (global ids of the target nodes, local
// ids lo .. lo + F - 1) draws up to f edges each; appends the edges' targets (local) and ids to
// edst / eids and writes their sources (global ids) to src.
void draw_hop(const Graph& g, const int64_t* fr, int64_t F, int64_t lo, int64_t f, bool replace,
              uint64_t hop_key, int64_t floyd_max, std::vector<int64_t>& src,
              std::vector<int64_t>& edst, std::vector<int64_t>& eids) {
  std::vector<int64_t> order(F);  // the frontier by node id: the output's edge order
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!std::is_sorted(fr, fr + F))
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return fr[a] < fr[b]; });
  std::vector<int64_t> off(F + 1, 0);
  for (int64_t q = 0; q < F; ++q) {
    const int64_t v = fr[order[q]], deg = g.rowptr[v + 1] - g.rowptr[v];
    int64_t c = (f < 0 || (!replace && deg <= f)) ? deg : (deg == 0 ? 0 : f);
    off[q + 1] = off[q] + c;
  }
  const int64_t P = off[F], E0 = static_cast<int64_t>(eids.size());
  src.resize(P);
  edst.resize(E0 + P);
  eids.resize(E0 + P);
  at::parallel_for(0, F, 64, [&](int64_t a, int64_t b) {
    std::vector<int64_t> pos;
    std::vector<std::pair<double, int64_t>> tmp;
    for (int64_t q = a; q < b; ++q) {
      // the rows ahead: their pointers, then their sources and edge ids (random reads: fetched
      // while this node draws)
      if (q + 16 < b) __builtin_prefetch(&g.rowptr[fr[order[q + 16]]]);
      if (q + 8 < b) {
        const int64_t s8 = g.rowptr[fr[order[q + 8]]];
        __builtin_prefetch(&g.sources[s8]);
        __builtin_prefetch(&g.perm[s8]);
        if (g.weight) __builtin_prefetch(&g.weight[s8]);
      }
      const int64_t i = order[q], v = fr[i], start = g.rowptr[v];
      const uint64_t key = mix(hop_key ^ static_cast<uint64_t>(i));
      draw(g.rowptr[v + 1] - start, f, replace, g.weight ? g.weight + start : nullptr,
           floyd_max, key, pos, tmp);
      for (size_t k = 0; k < pos.size(); ++k) {
        const int64_t p = start + pos[k], o = off[q] + static_cast<int64_t>(k);
        src[o] = g.sources[p];
        eids[E0 + o] = g.perm[p];
        edst[E0 + o] = lo + i;
      }
    }
  });
}

// The local ids of drawn sources: parts[j] = (global ids, where their local ids go). Nodes seen
// before keep their ids; the new ones (over all parts) are appended to ``nodes`` in increasing
// id and numbered from its size.
void relabel(IdMap& map, std::vector<int64_t>& nodes,
             const std::vector<std::pair<const std::vector<int64_t>*, int64_t*>>& parts) {
  int64_t P = 0;
  for (const auto& pt : parts) P += static_cast<int64_t>(pt.first->size());
  const int64_t hi = static_cast<int64_t>(nodes.size());
  map.reserve(map.size + P);
  std::vector<int64_t> fresh;
  std::vector<uint64_t> at(P);  // each edge's slot: its local id once the new ones are numbered
  int64_t base = 0;
  for (const auto& pt : parts) {
    const std::vector<int64_t>& src = *pt.first;
    const int64_t n = static_cast<int64_t>(src.size());
    for (int64_t p = 0; p < n; ++p) {
      if (p + 16 < n) map.prefetch(src[p + 16]);
      const uint64_t i = map.index(src[p]);
      at[base + p] = i;
      if (map.slots[i].val == -1) map.slots[i].val = -2, fresh.push_back(src[p]);
    }
    base += n;
  }
  sort_ids(fresh);
  for (size_t r = 0; r < fresh.size(); ++r) *map.slot(fresh[r]) = hi + static_cast<int64_t>(r);
  nodes.insert(nodes.end(), fresh.begin(), fresh.end());
  base = 0;
  for (const auto& pt : parts) {
    const int64_t n = static_cast<int64_t>(pt.first->size());
    int64_t* out = pt.second;
    const uint64_t* a0 = at.data() + base;
    at::parallel_for(0, n, 4096, [&](int64_t a, int64_t b) {
      for (int64_t p = a; p < b; ++p) out[p] = map.slots[a0[p]].val;
    });
    base += n;
  }
}

// One hop: the frontier node_ids[lo, hi) draws its edges; appends the new nodes and edges.
void hop(const Graph& g, std::vector<int64_t>& nodes, IdMap& map, int64_t lo, int64_t f,
         bool replace, uint64_t hop_key, int64_t floyd_max, std::vector<int64_t>& esrc,
         std::vector<int64_t>& edst, std::vector<int64_t>& eids) {
  const int64_t hi = static_cast<int64_t>(nodes.size()), E0 = static_cast<int64_t>(eids.size());
  std::vector<int64_t> src;
  draw_hop(g, nodes.data() + lo, hi - lo, lo, f, replace, hop_key, floyd_max, src, edst, eids);
  esrc.resize(eids.size());
  relabel(map, nodes, {{&src, esrc.data() + E0}});
}

torch::Tensor vec(const std::vector<int64_t>& v) {
  auto t = torch::empty({static_cast<int64_t>(v.size())}, torch::kLong);
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t;
}

}  // namespace

// (node_ids, edge_index (2, E), edge_ids, node_counts, edge_counts) of the nested sample.
// hop_keys[h] is the counter key of hop h (SplitMix64 of the base seed and h, made by the
// caller so that both paths share it); weight (E,) float64 in CSR order, or an empty tensor.
std::vector<torch::Tensor> sample(torch::Tensor rowptr, torch::Tensor sources, torch::Tensor perm,
                                  torch::Tensor weight, torch::Tensor seeds,
                                  std::vector<int64_t> fanouts, std::vector<int64_t> hop_keys,
                                  bool replace, int64_t floyd_max) {
  TORCH_CHECK(rowptr.dtype() == torch::kLong && sources.dtype() == torch::kLong &&
              perm.dtype() == torch::kLong && seeds.dtype() == torch::kLong,
              "sample: index tensors must be int64");
  TORCH_CHECK(fanouts.size() == hop_keys.size(), "sample: one key per hop");
  rowptr = rowptr.contiguous(), sources = sources.contiguous(), perm = perm.contiguous();
  seeds = seeds.contiguous();
  if (weight.numel()) weight = weight.to(torch::kDouble).contiguous();
  const Graph g{rowptr.data_ptr<int64_t>(), sources.data_ptr<int64_t>(),
                perm.data_ptr<int64_t>(), weight.numel() ? weight.data_ptr<double>() : nullptr};
  const int64_t S = seeds.numel();
  std::vector<int64_t> nodes(seeds.data_ptr<int64_t>(), seeds.data_ptr<int64_t>() + S);
  IdMap map;
  map.reserve(S);
  for (int64_t i = 0; i < S; ++i) *map.slot(nodes[i]) = i;
  std::vector<int64_t> esrc, edst, eids, ncount{S}, ecount;
  int64_t lo = 0;
  for (size_t h = 0; h < fanouts.size(); ++h) {
    const int64_t hi = static_cast<int64_t>(nodes.size());
    hop(g, nodes, map, lo, fanouts[h], replace, static_cast<uint64_t>(hop_keys[h]), floyd_max,
        esrc, edst, eids);
    lo = hi;
    ncount.push_back(static_cast<int64_t>(nodes.size()));
    ecount.push_back(static_cast<int64_t>(eids.size()));
  }
  auto ei = torch::stack({vec(esrc), vec(edst)});
  return {vec(nodes), ei, vec(eids), vec(ncount), vec(ecount)};
}

// Typed sampling: R relations (a CSR over its target type's nodes each: rowptrs[r],
// sources[r] (ids of its source type), perms[r] (edge ids within the relation)) between T node
// types (relation r from type rel_src[r] to type rel_dst[r]); seeds[t] the seeds of type t.
// Hop h: every relation r with fanout fanouts[h * R + r] != 0 draws for the nodes of its target
// type first reached at hop h - 1 (the seeds at hop 1), with the counter key keys[h * R + r];
// then each type's new sources (over all relations leaving it) are appended in increasing id.
// Returns T node id tensors, the (T, H + 1) cumulative node counts, R edge_index (2, E_r) in
// local ids [source in rel_src's nodes; target in rel_dst's], R edge id tensors and the (R, H)
// cumulative edge counts.
std::vector<torch::Tensor> sample_typed(std::vector<torch::Tensor> rowptrs,
                                        std::vector<torch::Tensor> sources,
                                        std::vector<torch::Tensor> perms,
                                        std::vector<int64_t> rel_src, std::vector<int64_t> rel_dst,
                                        std::vector<torch::Tensor> seeds,
                                        std::vector<int64_t> fanouts, std::vector<int64_t> keys,
                                        int64_t hops, bool replace, int64_t floyd_max) {
  const int64_t R = static_cast<int64_t>(rowptrs.size()), T = static_cast<int64_t>(seeds.size());
  TORCH_CHECK(static_cast<int64_t>(sources.size()) == R && static_cast<int64_t>(perms.size()) == R &&
              static_cast<int64_t>(rel_src.size()) == R && static_cast<int64_t>(rel_dst.size()) == R,
              "sample_typed: one CSR and one (source, target) type per relation");
  TORCH_CHECK(static_cast<int64_t>(fanouts.size()) == hops * R &&
              static_cast<int64_t>(keys.size()) == hops * R, "sample_typed: hops x relations");
  std::vector<Graph> g(R);
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(rowptrs[r].dtype() == torch::kLong && sources[r].dtype() == torch::kLong &&
                perms[r].dtype() == torch::kLong, "sample_typed: index tensors must be int64");
    TORCH_CHECK(rel_src[r] >= 0 && rel_src[r] < T && rel_dst[r] >= 0 && rel_dst[r] < T,
                "sample_typed: relation types out of range");
    rowptrs[r] = rowptrs[r].contiguous(), sources[r] = sources[r].contiguous();
    perms[r] = perms[r].contiguous();
    g[r] = Graph{rowptrs[r].data_ptr<int64_t>(), sources[r].data_ptr<int64_t>(),
                 perms[r].data_ptr<int64_t>(), nullptr};
  }
  std::vector<std::vector<int64_t>> nodes(T);
  std::vector<IdMap> map(T);
  std::vector<int64_t> ncount(T * (hops + 1)), ecount(R * hops);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(seeds[t].dtype() == torch::kLong, "sample_typed: seeds must be int64");
    auto s = seeds[t].contiguous();
    const int64_t S = s.numel();
    nodes[t].assign(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + S);
    map[t].reserve(S);
    for (int64_t i = 0; i < S; ++i) *map[t].slot(nodes[t][i]) = i;
    ncount[t * (hops + 1)] = S;
  }
  std::vector<std::vector<int64_t>> esrc(R), edst(R), eids(R), src(R);
  std::vector<int64_t> lo(T, 0);
  for (int64_t h = 0; h < hops; ++h) {
    std::vector<int64_t> hi(T), E0(R);
    for (int64_t t = 0; t < T; ++t) hi[t] = static_cast<int64_t>(nodes[t].size());
    for (int64_t r = 0; r < R; ++r) {
      const int64_t f = fanouts[h * R + r], d = rel_dst[r];
      E0[r] = static_cast<int64_t>(eids[r].size());
      src[r].clear();
      if (f == 0 || hi[d] == lo[d]) continue;
      draw_hop(g[r], nodes[d].data() + lo[d], hi[d] - lo[d], lo[d], f, replace,
               static_cast<uint64_t>(keys[h * R + r]), floyd_max, src[r], edst[r], eids[r]);
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<std::pair<const std::vector<int64_t>*, int64_t*>> parts;
      for (int64_t r = 0; r < R; ++r) {
        if (rel_src[r] != t) continue;
        esrc[r].resize(eids[r].size());
        parts.push_back({&src[r], esrc[r].data() + E0[r]});
      }
      relabel(map[t], nodes[t], parts);
    }
    for (int64_t t = 0; t < T; ++t) {
      lo[t] = hi[t];
      ncount[t * (hops + 1) + h + 1] = static_cast<int64_t>(nodes[t].size());
    }
    for (int64_t r = 0; r < R; ++r) ecount[r * hops + h] = static_cast<int64_t>(eids[r].size());
  }
  std::vector<torch::Tensor> out;
  for (int64_t t = 0; t < T; ++t) out.push_back(vec(nodes[t]));
  out.push_back(vec(ncount).reshape({T, hops + 1}));
  for (int64_t r = 0; r < R; ++r) out.push_back(torch::stack({vec(esrc[r]), vec(edst[r])}));
  for (int64_t r = 0; r < R; ++r) out.push_back(vec(eids[r]));
  out.push_back(vec(ecount).reshape({R, hops}));
  return out;
}

namespace {

template <typename T>
std::vector<torch::Tensor> restrict_impl(const int64_t* es, const int64_t* ed, const int64_t* eid,
                                         int64_t E, const int64_t* nid, int64_t R,
                                         const T* value, const bool* keep, const int64_t* group,
                                         const int64_t* gmap, int64_t G, const T* diag,
                                         torch::ScalarType st) {
  // bucket the kept edges by (group, row): a counting sort; the diagonal joins group 0 last
  std::vector<int64_t> gi(E);
  std::vector<int64_t> cnt(G * R + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t id = eid[e];
    if (e + 16 < E) {
      if (keep != nullptr) __builtin_prefetch(&keep[eid[e + 16]]);
      if (group != nullptr) __builtin_prefetch(&group[eid[e + 16]]);
    }
    int64_t k = -1;
    if (keep == nullptr || keep[id]) k = group == nullptr ? 0 : gmap[group[id]];
    gi[e] = k;
    if (k >= 0) ++cnt[k * R + ed[e] + 1];
  }
  if (diag != nullptr)
    for (int64_t r = 0; r < R; ++r) ++cnt[r + 1];
  for (int64_t i = 0; i < G * R; ++i) cnt[i + 1] += cnt[i];
  const int64_t total = cnt[G * R];
  std::vector<int64_t> col(total);
  std::vector<T> val(total);
  std::vector<int64_t> fill(cnt.begin(), cnt.end() - 1);
  for (int64_t e = 0; e < E; ++e) {
    if (e + 16 < E) __builtin_prefetch(&value[eid[e + 16]]);  // random reads by edge id
    if (gi[e] < 0) continue;
    const int64_t at = fill[gi[e] * R + ed[e]]++;
    col[at] = es[e], val[at] = value[eid[e]];
  }
  if (diag != nullptr)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t at = fill[r]++;
      col[at] = r, val[at] = diag[nid[r]];
    }
  // each row: columns sorted (an insertion sort: rows are short; stable, so duplicates are
  // summed in edge order), duplicates merged in place
  std::vector<int64_t> len(G * R);
  at::parallel_for(0, G * R, 256, [&](int64_t a, int64_t b) {
    std::vector<std::pair<int64_t, T>> long_row;
    for (int64_t i = a; i < b; ++i) {
      const int64_t s = cnt[i], n = cnt[i + 1] - s;
      int64_t* c = col.data() + s;
      T* v = val.data() + s;
      if (n > 32) {  // a hub's whole neighbourhood: O(n log n)
        long_row.resize(n);
        for (int64_t k = 0; k < n; ++k) long_row[k] = {c[k], v[k]};
        std::stable_sort(long_row.begin(), long_row.end(),
                         [](const auto& x, const auto& y) { return x.first < y.first; });
        for (int64_t k = 0; k < n; ++k) c[k] = long_row[k].first, v[k] = long_row[k].second;
      }
      for (int64_t k = 1; k < n; ++k) {
        const int64_t ck = c[k];
        const T vk = v[k];
        int64_t j = k;
        for (; j > 0 && c[j - 1] > ck; --j) c[j] = c[j - 1], v[j] = v[j - 1];
        c[j] = ck, v[j] = vk;
      }
      int64_t m = 0;
      for (int64_t k = 0; k < n; ++k) {
        if (m > 0 && c[m - 1] == c[k]) v[m - 1] += v[k];
        else c[m] = c[k], v[m] = v[k], ++m;
      }
      len[i] = m;
    }
  });
  std::vector<torch::Tensor> out;
  for (int64_t k = 0; k < G; ++k) {
    auto crow = torch::empty({R + 1}, torch::kLong);
    int64_t* cr = crow.data_ptr<int64_t>();
    cr[0] = 0;
    for (int64_t r = 0; r < R; ++r) cr[r + 1] = cr[r] + len[k * R + r];
    const int64_t nnz = cr[R];
    auto rows = torch::empty({nnz}, torch::kLong), cols = torch::empty({nnz}, torch::kLong);
    auto vals = torch::empty({nnz}, torch::TensorOptions().dtype(st));
    int64_t* rp = rows.data_ptr<int64_t>();
    int64_t* cp = cols.data_ptr<int64_t>();
    T* vp = vals.data_ptr<T>();
    for (int64_t r = 0; r < R; ++r) {
      const int64_t s = cnt[k * R + r], d = cr[r];
      for (int64_t j = 0; j < cr[r + 1] - d; ++j) rp[d + j] = r, cp[d + j] = col[s + j],
                                                  vp[d + j] = val[s + j];
    }
    out.insert(out.end(), {crow, rows, cols, vals});
  }
  return out;
}

}  // namespace

// The restricted operator of a sample: per group k (gmap[relation], -1 dropped; one group
// without ``group``) the coalesced CSR (crow (R+1,), row, col, value) of the sampled edges into
// the first R local nodes, values value[edge id] (edges with keep[edge id] false left out) and
// group 0 holding diag[node id] on its diagonal. Empty tensors stand for absent options.
std::vector<torch::Tensor> restrict_csr(torch::Tensor edge_index, torch::Tensor edge_ids,
                                        torch::Tensor node_ids, int64_t rows,
                                        torch::Tensor value, torch::Tensor keep,
                                        torch::Tensor group, torch::Tensor gmap,
                                        int64_t groups, torch::Tensor diag) {
  TORCH_CHECK(edge_index.dtype() == torch::kLong && edge_ids.dtype() == torch::kLong &&
              node_ids.dtype() == torch::kLong, "restrict: index tensors must be int64");
  edge_index = edge_index.contiguous(), edge_ids = edge_ids.contiguous();
  node_ids = node_ids.contiguous(), value = value.contiguous();
  if (keep.numel()) keep = keep.to(torch::kBool).contiguous();
  if (group.numel()) group = group.to(torch::kLong).contiguous(), gmap = gmap.contiguous();
  if (diag.numel()) diag = diag.to(value.scalar_type()).contiguous();
  const int64_t E = edge_ids.numel();
  std::vector<torch::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(value.scalar_type(), "restrict_csr", [&] {
    out = restrict_impl<scalar_t>(
        edge_index.data_ptr<int64_t>(), edge_index.data_ptr<int64_t>() + E,
        edge_ids.data_ptr<int64_t>(), E, node_ids.data_ptr<int64_t>(), rows,
        value.data_ptr<scalar_t>(), keep.numel() ? keep.data_ptr<bool>() : nullptr,
        group.numel() ? group.data_ptr<int64_t>() : nullptr,
        group.numel() ? gmap.data_ptr<int64_t>() : nullptr, groups,
        diag.numel() ? diag.data_ptr<scalar_t>() : nullptr, value.scalar_type());
  });
  return out;
}

// x[index] for a contiguous x (n, ...) on CPU: the rows of a mini-batch's input nodes, copied
// with the rows a few places ahead prefetched (they are random reads over the whole graph).
torch::Tensor gather_rows(torch::Tensor x, torch::Tensor index) {
  TORCH_CHECK(x.dim() >= 1 && x.is_contiguous() && x.device().is_cpu(),
              "gather_rows: x must be a contiguous CPU tensor");
  TORCH_CHECK(index.dtype() == torch::kLong && index.dim() == 1, "gather_rows: int64 index");
  index = index.contiguous();
  std::vector<int64_t> shape = x.sizes().vec();
  const int64_t n = shape[0], L = index.numel();
  shape[0] = L;
  auto out = torch::empty(shape, x.options());
  const int64_t row = n ? x.numel() / n * x.element_size() : 0;
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const int64_t* idx = index.data_ptr<int64_t>();
  for (int64_t q = 0; q < L; ++q)
    TORCH_CHECK(idx[q] >= 0 && idx[q] < n, "gather_rows: index ", idx[q], " out of [0, ", n, ")");
  at::parallel_for(0, L, 1024, [&](int64_t a, int64_t b) {
    for (int64_t q = a; q < b; ++q) {
      if (q + 8 < b) {
        const char* ahead = src + idx[q + 8] * row;
        for (int64_t o = 0; o < row; o += 64) __builtin_prefetch(ahead + o);
      }
      std::memcpy(dst + q * row, src + idx[q] * row, row);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the GIL is released: a loader's background thread samples while the model steps
  m.def("sample", &sample, "nested neighbour sampling over a CSR of incoming edges",
        py::call_guard<py::gil_scoped_release>());
  m.def("sample_typed", &sample_typed, "nested neighbour sampling over typed relations",
        py::call_guard<py::gil_scoped_release>());
  m.def("restrict", &restrict_csr, "the coalesced CSR per group of a sample's restricted operator",
        py::call_guard<py::gil_scoped_release>());
  m.def("gather_rows", &gather_rows, "x[index] along the first dimension, rows prefetched",
        py::call_guard<py::gil_scoped_release>());
}
