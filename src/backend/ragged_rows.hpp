// Ragged rows, the one format of rows routed to parts (a mixture of experts' token rows): `parts` int32 counts, then
// the rows (width 4-byte words each: a row of floats, or of bf16 values two to a word) of part 0, part 1, ...
// Segments write and read it, Communicator::all_to_all_rows exchanges it as words, never reading them (part p goes
// to group rank p / (parts / ranks)), and rows_layout says where its rows travel.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace piper {

// A view of ragged rows at `p`: the count header, then the rows.
struct RaggedRows {
  int32_t* counts;  // (parts)
  float* rows;      // (Σ counts, width) words
  RaggedRows(const void* p, int parts)
      : counts(static_cast<int32_t*>(const_cast<void*>(p))), rows(reinterpret_cast<float*>(counts + parts)) {}
  // Bytes of a buffer of `parts` counts and `rows` rows.
  static size_t bytes(int parts, int64_t rows, int width) {
    return size_t(parts) * sizeof(int32_t) + size_t(rows) * size_t(width) * sizeof(float);
  }
  // The rows a buffer of `bytes` bytes holds.
  static int64_t rows_in(size_t bytes, int parts, int width) {
    return int64_t((bytes - size_t(parts) * sizeof(int32_t)) / (sizeof(float) * size_t(width)));
  }
};

struct RowsLayout {
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;  // words, per group rank
  int64_t send_total() const { return send_displs.back() + send_counts.back(); }
  int64_t recv_total() const { return recv_displs.back() + recv_counts.back(); }
};

// sent(parts): rows of each part this rank sends; got(parts): rows it receives, by source rank in order.
inline RowsLayout rows_layout(const int32_t* sent, const int32_t* got, int parts, int ranks, int width) {
  RowsLayout l;
  const int q = parts / ranks;
  l.send_counts.assign(size_t(ranks), 0);
  l.recv_counts.assign(size_t(ranks), 0);
  for (int p = 0; p < parts; ++p) {
    l.send_counts[size_t(p / q)] += int64_t(sent[p]) * width;
    l.recv_counts[size_t(p / q)] += int64_t(got[p]) * width;
  }
  l.send_displs.assign(size_t(ranks), 0);
  l.recv_displs.assign(size_t(ranks), 0);
  for (int r = 1; r < ranks; ++r) {
    l.send_displs[size_t(r)] = l.send_displs[size_t(r) - 1] + l.send_counts[size_t(r) - 1];
    l.recv_displs[size_t(r)] = l.recv_displs[size_t(r) - 1] + l.recv_counts[size_t(r) - 1];
  }
  return l;
}

// The layout as the int arrays MPI_(I)alltoallv takes; false when a count does not fit in an int.
inline bool mpi_counts(const std::vector<int64_t>& v, std::vector<int>& out) {
  out.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] > INT32_MAX) return false;
    out[i] = int(v[i]);
  }
  return true;
}

}  // namespace piper
