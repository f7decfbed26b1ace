// Which buffers each instruction reads and writes (the basis of cross-stream waits, buffer lifetimes and
// the executor's allocation at first use) and the bytes it sends, from its op's row of the op table.
#include <algorithm>
#include <utility>

#include "plan/plan.hpp"

namespace piper {

namespace {

// Calls fn(buffer) for every buffer of `in` in the roles `roles` (Operand bits).
template <typename Fn>
void for_operands(const Instr& in, uint32_t roles, Fn&& fn) {
  in.operands([&](uint32_t role, int32_t b) {
    if ((roles & role) && b >= 0) fn(b);
  });
}

void sort_unique(std::vector<int32_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

void instr_accesses(const Instr& in, std::vector<int32_t>& reads, std::vector<int32_t>& writes) {
  reads.clear();
  writes.clear();
  const OpInfo& op = op_info(in.op);
  for_operands(in, op.reads, [&](int32_t b) { reads.push_back(b); });
  for_operands(in, op.writes, [&](int32_t b) { writes.push_back(b); });
  sort_unique(reads);
  sort_unique(writes);
}

double instr_send_bytes(const Instr& in, int n) {
  const bool bf16 = op_info(in.op).kind == OpKind::Collective && (in.collective().flags & kFlagBf16Wire);
  const double elem = bf16 ? sizeof(uint16_t) : sizeof(float);
  switch (op_info(in.op).send) {
    case SendRule::None: return 0;
    case SendRule::Message: return double(in.message().count) * elem;
    case SendRule::RingAllReduce: return n > 1 ? 2.0 * (n - 1) / n * double(in.collective().count) * elem : 0;
    case SendRule::PerRankCount: return double(n - 1) * double(in.collective().count) * elem;
    case SendRule::RowsBound: {
      const AllToAllArgs& a = in.all_to_all();
      return n > 1 ? double(n - 1) / n * double(a.rows) * double(a.row_width) * elem : 0;
    }
  }
  return 0;
}

}  // namespace piper
