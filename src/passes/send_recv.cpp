// Inserts a SEND/RECV pair on every data edge between nodes of different device sets.
// The pair shares one id (the SEND's) used as the message tag.
#include <map>
#include <tuple>

#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

void insert_send_recv(Graph& g) {
  // One transfer per (producer, tensor, receiving set): several consumers there share its RECV.
  std::map<std::tuple<int, int, int, int, int>, int> received;
  const size_t e_before = g.edges.size();
  for (size_t ei = 0; ei < e_before; ++ei) {
    Edge e = g.edges[ei];
    if (e.removed || e.kind != EdgeKind::Data) continue;
    const Node& from = g.nodes[size_t(e.from)];
    const Node& to = g.nodes[size_t(e.to)];
    if (from.device_set < 0 || to.device_set < 0 || from.device_set == to.device_set) continue;
    PIPER_CHECK(e.tensor.kind == TensorRef::Kind::Act || e.tensor.kind == TensorRef::Kind::ActGrad,
                "cross-set edge carries ", e.tensor.str());
    g.edges[ei].removed = true;
    auto key = std::make_tuple(e.from, int(e.tensor.kind), e.tensor.index, e.tensor.mb, to.device_set);
    if (auto it = received.find(key); it != received.end()) {
      g.add_edge(it->second, e.to, EdgeKind::Data, e.tensor);
      continue;
    }
    Node send;
    send.kind = NodeKind::SEND;
    send.tags = from.tags;
    send.mb = from.mb;  // compute nodes always carry their microbatch (0 before any split)
    send.device_set = from.device_set;
    send.peer_set = to.device_set;
    // Forward activations and backward gradients travel on separate channels (streams), each in FIFO order.
    send.stream = e.tensor.kind == TensorRef::Kind::Act ? "p2p.fwd" : "p2p.bwd";
    send.tensor = e.tensor;
    Node recv = send;
    recv.kind = NodeKind::RECV;
    recv.tags = to.tags;
    recv.device_set = to.device_set;
    recv.peer_set = from.device_set;
    int s = g.add_node(send);
    int r = g.add_node(recv);
    g.nodes[size_t(s)].pair = r;
    g.nodes[size_t(r)].pair = s;
    g.add_edge(e.from, s, EdgeKind::Data, e.tensor);
    g.add_edge(s, r, EdgeKind::Data, e.tensor);
    g.add_edge(r, e.to, EdgeKind::Data, e.tensor);
    received[key] = r;
  }
}

}  // namespace piper
