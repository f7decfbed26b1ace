// Waits from buffer hazards, use counts, and the per-kind memory estimate (see finalize.hpp).
#include "compile/finalize.hpp"

#include <algorithm>

namespace piper {

void finalize_plan(Plan& p) {
  const size_t nb = p.buffers.size();
  std::vector<int32_t> last_writer(nb, -1);
  std::vector<std::vector<int32_t>> readers(nb);
  std::vector<int32_t> reads, writes;
  for (auto& b : p.buffers) b.uses = 0;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    Instr& in = p.instrs[i];
    instr_accesses(in, reads, writes);
    std::vector<int32_t> waits = in.waits;  // pacing waits the lowering asked for
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
    for (int32_t b : all) ++p.buffers[size_t(b)].uses;
  }
}

void estimate_memory(Plan& p, const std::vector<size_t>& send_done) {
  const size_t nb = p.buffers.size();
  std::vector<int32_t> reads, writes;
  std::vector<int32_t> first_use(nb, -1);
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    instr_accesses(p.instrs[i], reads, writes);
    for (const auto* list : {&reads, &writes})
      for (int32_t b : *list)
        if (first_use[size_t(b)] < 0) first_use[size_t(b)] = int32_t(i);
  }
  // When each instruction is done, in list positions: synchronous work where it stands; posted
  // communication where the first instruction that waits for it stands (a send: by the next compute
  // instruction; otherwise by the end of the step). A buffer is held until every use is done.
  const size_t n = p.instrs.size();
  std::vector<size_t> done_at(n);
  for (size_t i = 0; i < n; ++i) done_at[i] = op_is_async(p.instrs[i].op) ? n - 1 : i;
  for (size_t i = 0; i < n; ++i)
    for (int32_t j : p.instrs[i].waits)
      if (op_is_async(p.instrs[size_t(j)].op)) done_at[size_t(j)] = std::min(done_at[size_t(j)], i);
  for (size_t i = 0; i < n; ++i) {
    if (p.instrs[i].op != Op::Send) continue;
    if (i < send_done.size()) {  // where the simulation says the receiver took it
      done_at[i] = std::min(done_at[i], std::max(send_done[i], i));
      continue;
    }
    for (size_t j = i + 1; j < n; ++j)  // without a simulation: by the next compute instruction
      if (op_is_compute(p.instrs[j].op)) {
        done_at[i] = std::min(done_at[i], j);
        break;
      }
  }
  // A buffer is released after its last synchronous use, or — when posted communication holds it —
  // before the instruction that waits for that communication starts.
  std::vector<int32_t> release_after(nb, -1), release_before(nb, -1);
  for (size_t i = 0; i < n; ++i) {
    instr_accesses(p.instrs[i], reads, writes);
    std::vector<int32_t> all = reads;
    all.insert(all.end(), writes.begin(), writes.end());
    for (int32_t b : all) {
      if (done_at[i] == i) release_after[size_t(b)] = std::max(release_after[size_t(b)], int32_t(i));
      else release_before[size_t(b)] = std::max(release_before[size_t(b)], int32_t(done_at[i]));
    }
  }
  // Memory: persistent buffers for the whole step; transient ones from first use until released.
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
  std::vector<std::vector<int32_t>> starts(n), ends_before(n), ends_after(n);
  for (size_t b = 0; b < nb; ++b) {
    if (p.buffers[b].persistent || first_use[b] < 0) continue;
    starts[size_t(first_use[b])].push_back(int32_t(b));
    if (release_before[b] > release_after[b]) ends_before[size_t(release_before[b])].push_back(int32_t(b));
    else ends_after[size_t(release_after[b])].push_back(int32_t(b));
  }
  auto release = [&](const std::vector<int32_t>& bufs) {
    for (int32_t b : bufs) {
      cur[int(p.buffers[size_t(b)].kind)] -= p.buffers[size_t(b)].bytes;
      total -= p.buffers[size_t(b)].bytes;
    }
  };
  for (size_t i = 0; i < n; ++i) {
    release(ends_before[i]);
    for (int32_t b : starts[i]) {
      cur[int(p.buffers[size_t(b)].kind)] += p.buffers[size_t(b)].bytes;
      total += p.buffers[size_t(b)].bytes;
    }
    for (int k = 0; k < kBufferKinds; ++k) est.peak_by_kind[k] = std::max(est.peak_by_kind[k], cur[k]);
    est.peak_total = std::max(est.peak_total, total);
    release(ends_after[i]);
  }
  p.memory = est;
}

}  // namespace piper
