// Waits from buffer hazards, use counts, and the per-kind memory estimate (see finalize.hpp).
#include "compile/finalize.hpp"

#include <algorithm>

namespace piper {

void finalize_plan(Plan& p) {
  const size_t nb = p.buffers.size();
  std::vector<int32_t> last_writer(nb, -1);
  std::vector<std::vector<int32_t>> readers(nb);
  std::vector<int32_t> first_use(nb, -1), last_use(nb, -1);
  std::vector<int32_t> reads, writes;
  for (auto& b : p.buffers) b.uses = 0;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    Instr& in = p.instrs[i];
    instr_accesses(in, reads, writes);
    std::vector<int32_t> waits;
    // Same-stream order suffices after synchronous instructions; communication completes later than
    // it is posted, so hazards on it are waited for even on its own stream.
    auto wait_on = [&](int32_t j) {
      if (j < 0) return;
      const Instr& prev = p.instrs[size_t(j)];
      if (prev.stream != in.stream || op_is_async(prev.op)) waits.push_back(j);
    };
    for (int32_t b : reads) wait_on(last_writer[size_t(b)]);
    for (int32_t b : writes) {
      wait_on(last_writer[size_t(b)]);
      for (int32_t j : readers[size_t(b)]) wait_on(j);
    }
    std::sort(waits.begin(), waits.end());
    waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
    in.waits = std::move(waits);
    for (int32_t b : reads) readers[size_t(b)].push_back(int32_t(i));
    for (int32_t b : writes) {
      last_writer[size_t(b)] = int32_t(i);
      readers[size_t(b)].clear();
    }
    std::vector<int32_t> all = reads;
    all.insert(all.end(), writes.begin(), writes.end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    for (int32_t b : all) {
      ++p.buffers[size_t(b)].uses;
      if (first_use[size_t(b)] < 0) first_use[size_t(b)] = int32_t(i);
      last_use[size_t(b)] = int32_t(i);
    }
  }
  // Memory: persistent buffers for the whole step; transient ones from first to last use, in list order.
  MemoryEstimate est;
  uint64_t cur[kBufferKinds] = {0};
  uint64_t total = 0;
  for (size_t b = 0; b < nb; ++b) {
    const PlanBuffer& buf = p.buffers[b];
    if (!buf.persistent) continue;
    cur[int(buf.kind)] += buf.bytes;
    est.steady_by_kind[int(buf.kind)] += buf.bytes;
    total += buf.bytes;
  }
  for (int k = 0; k < kBufferKinds; ++k) est.peak_by_kind[k] = cur[k];
  est.peak_total = total;
  std::vector<std::vector<int32_t>> starts(p.instrs.size()), ends(p.instrs.size());
  for (size_t b = 0; b < nb; ++b) {
    if (p.buffers[b].persistent || first_use[b] < 0) continue;
    starts[size_t(first_use[b])].push_back(int32_t(b));
    ends[size_t(last_use[b])].push_back(int32_t(b));
  }
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    for (int32_t b : starts[i]) {
      cur[int(p.buffers[size_t(b)].kind)] += p.buffers[size_t(b)].bytes;
      total += p.buffers[size_t(b)].bytes;
    }
    for (int k = 0; k < kBufferKinds; ++k) est.peak_by_kind[k] = std::max(est.peak_by_kind[k], cur[k]);
    est.peak_total = std::max(est.peak_total, total);
    for (int32_t b : ends[i]) {
      cur[int(p.buffers[size_t(b)].kind)] -= p.buffers[size_t(b)].bytes;
      total -= p.buffers[size_t(b)].bytes;
    }
  }
  p.memory = est;
}

}  // namespace piper
