// Which buffers each instruction reads and writes: the basis of cross-stream waits, buffer lifetimes and
// the executor's allocation at first use.
#include <algorithm>

#include "plan/plan.hpp"

namespace piper {

void instr_accesses(const Instr& in, std::vector<int32_t>& reads, std::vector<int32_t>& writes) {
  reads.clear();
  writes.clear();
  auto r = [&](int32_t b) { if (b >= 0) reads.push_back(b); };
  auto w = [&](int32_t b) { if (b >= 0) writes.push_back(b); };
  if (op_is_compute(in.op)) {  // a linked stash is read and written by every pass
    r(in.link);
    w(in.link);
  }
  switch (in.op) {
    case Op::Forward:
      r(in.in);
      for (int32_t b : in.pbuf) r(b);
      w(in.out);
      w(in.stash);
      break;
    case Op::Backward:
    case Op::BackwardInput:
      r(in.in);
      r(in.dout);
      for (int32_t b : in.pbuf) r(b);
      w(in.stash);  // heads turn probabilities into logit gradients in place
      w(in.din);
      w(in.wstash);
      for (int32_t b : in.gbuf) w(b);
      break;
    case Op::BackwardWeight:
      r(in.in);
      r(in.stash);
      r(in.dout);
      r(in.wstash);
      for (int32_t b : in.gbuf) w(b);
      break;
    case Op::Update:
      r(in.src);
      w(in.buf);
      w(in.m);
      w(in.v);
      break;
    case Op::Send: r(in.buf); break;
    case Op::Recv: w(in.buf); break;
    case Op::AllReduce: w(in.buf); break;
    case Op::ReduceScatter:
      r(in.src);
      w(in.buf);
      w(in.tmp);
      break;
    case Op::AllGather:
    case Op::AllToAll:
      r(in.src);
      w(in.buf);
      break;
    case Op::StepSync:
      for (const auto& s : in.spans) r(s.buf);
      break;
  }
  auto dedupe = [](std::vector<int32_t>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  dedupe(reads);
  dedupe(writes);
}

}  // namespace piper
