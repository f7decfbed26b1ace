// Checkpoint save (every rank writes the slices it owns into one temporary HDF5 file, which rank 0 checks
// and renames; parallel_save.hpp) and load (each rank reads the hyperslabs it holds).
#include "ckpt/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <exception>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/block_read.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/file_writer.hpp"
#include "ckpt/folder.hpp"
#include "ckpt/hdf5_util.hpp"
#include "ckpt/parallel_save.hpp"
#include "ckpt/replica_share.hpp"
#include "ckpt/verify.hpp"
#include "ckpt/resume_check.hpp"
#include "plan/owned_slices.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"
#include "util/mpi_check.hpp"
#include "util/memory_usage.hpp"
#include "util/timer.hpp"

namespace piper {

namespace fs = std::filesystem;
using h5::Handle;

namespace {

const char* kGroups[3] = {"params", "adam_m", "adam_v"};
static_assert(std::endian::native == std::endian::little, "tensors are hashed as stored: float32 little-endian");

// A logical tensor as (rows, cols): 1-D tensors are (n, 1).
std::pair<hsize_t, hsize_t> rows_cols(const ParamSpec& p) {
  if (p.shape.size() == 1) return {hsize_t(p.shape[0]), 1};
  hsize_t cols = 1;
  for (size_t i = 1; i < p.shape.size(); ++i) cols *= hsize_t(p.shape[i]);
  return {hsize_t(p.shape[0]), cols};
}


// Reads elements [begin, begin+count) of the flattened tensor into out (format versions 1 and 2: HDF5
// reads the hyperslab of whole rows, checking version 2's Fletcher32 chunks).
void read_range(hid_t file, const std::string& path, const char* group, const ParamSpec& p, int64_t begin,
                int64_t count, float* out) {
  const std::string name = std::string(group) + "/" + p.name;
  Handle ds(open_checkpoint_tensor(file, path, group, p), H5Dclose);
  Handle space(H5_CHECK(H5Dget_space(ds)), H5Sclose);
  const int nd = int(p.shape.size());
  const std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
  auto [rows, cols] = rows_cols(p);
  (void)rows;
  hsize_t r0 = hsize_t(begin) / cols, r1 = (hsize_t(begin + count) - 1) / cols + 1;
  std::vector<hsize_t> start(static_cast<size_t>(nd), 0), extent = dims;
  start[0] = r0;
  extent[0] = r1 - r0;
  H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr));
  hsize_t n = (r1 - r0) * cols;
  Handle mem(H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  std::vector<float> tmp(n);
  if (H5Dread(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, tmp.data()) < 0)
    throw UserError(cat(path, ": reading '", name, "' failed: checksum mismatch or damaged file"));
  std::copy(tmp.begin() + long(hsize_t(begin) - r0 * cols), tmp.begin() + long(hsize_t(begin) - r0 * cols + hsize_t(count)),
            out);
}

// One slice of a parameter that this rank owns and saves.
struct Piece {
  int64_t param, start, count;
  float* src[3];  // parameter, first moment, second moment (device pointers)
};

std::vector<Piece> owned_pieces(const StateView& state) {
  const Plan& plan = state.plan;
  std::vector<Piece> out;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const PlanBucket& pb = plan.buckets[b];
    if (pb.tied_copy) continue;
    // Each replica saves its shard's share, sharded or not: the ranks split the writing.
    // (of a sliced bucket: the replicas holding the same slice split its writing)
    const BucketRange owned = owned_range(pb, plan.replica, true);
    const int64_t base = slice_begin(pb, plan.replica);  // where the bucket's full buffers start here
    for_each_param_piece(plan, int32_t(b), owned, [&](const ParamPiece& p) {
      // a tensor-parallel piece lies in the tensor as runs (owned_slices.hpp)
      for_each_element_run(*p.pp, pb.slices, p.param_begin(), p.count(), [&](int64_t element, int64_t at, int64_t n) {
        const int64_t a = p.begin + (at - p.param_begin()), lo = owned.lo;
        Piece piece{p.pp->model_param, element, n, {nullptr, nullptr, nullptr}};
        piece.src[0] = pb.shard_params ? state.at(pb.param_shard_buf, a - lo) : state.at(pb.param_buf, a - base);
        const int64_t opt_at = pb.shard_optimizer ? a - lo : a - base;
        piece.src[1] = state.at(pb.m_buf, opt_at);
        piece.src[2] = state.at(pb.v_buf, opt_at);
        out.push_back(piece);
      });
    });
  }
  std::sort(out.begin(), out.end(), [](const Piece& x, const Piece& y) {
    return std::tie(x.param, x.start) < std::tie(y.param, y.start);
  });
  return out;
}

std::string layout_text(const Plan& p) {
  std::string s = cat("world=", p.world, " microbatches=", p.microbatches);
  for (size_t i = 0; i < p.sets.size(); ++i) {
    s += cat(" set", i, "=[");
    for (size_t j = 0; j < p.sets[i].size(); ++j) s += cat(j ? "," : "", p.sets[i][j]);
    s += "]";
  }
  return s;
}

RunRecord read_run_record(hid_t file) {
  RunRecord r;
  r.has_seed = h5::read_attr_i64(file, "seed", r.seed);
  h5::read_attr_str(file, "sampler", r.sampler);
  h5::read_attr_str(file, "model", r.model);
  r.has_data = h5::read_attr_str(file, "data_path", r.data_path) && h5::read_attr_i64(file, "data_bytes", r.data_bytes) &&
               h5::read_attr_str(file, "data_hash", r.data_hash);
  return r;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t steps_done) {
  char name[64];
  std::snprintf(name, sizeof(name), "step_%08lld.h5", static_cast<long long>(steps_done));
  return (fs::path(dir) / name).string();
}

namespace {

// The data file is recorded as this run opened it, not as data.path names it now.
CheckpointHeader header_of(const StateView& state, int64_t steps_done) {
  const Plan& plan = state.plan;
  return {steps_done, plan.job_name, plan.job_text, layout_text(plan), run_record(plan, &state.data)};
}

void report_failed_save(int64_t steps_done, const std::string& failure) {
  std::fprintf(stderr, "piper: error: checkpoint at step %lld not written: %s; older checkpoints are kept\n",
               static_cast<long long>(steps_done), failure.c_str());
  std::fflush(stderr);
}

// Bytes of a checkpoint's tensors: parameters and both moments, float32.
int64_t state_bytes(const Plan& plan) {
  int64_t n = 0;
  for (const ParamSpec& p : plan.params) n += p.numel;
  return 3 * int64_t(sizeof(float)) * n;
}

// Rank 0's line for a completed save: size, ranks, time and bandwidth; for a synchronous save the growth
// of rank 0's resident memory during it (negative: not measured), for an asynchronous one how long the
// step waited for its copy.
void report_save(const Plan& plan, int64_t steps_done, int ranks, double seconds, int64_t memory_growth,
                 double step_wait) {
  const double gb = double(state_bytes(plan)) / 1e9;
  char tail[128] = "";
  if (step_wait >= 0)
    std::snprintf(tail, sizeof(tail), " behind training (the step waited %.3f s to copy its share)", step_wait);
  else if (memory_growth >= 0)
    std::snprintf(tail, sizeof(tail), ", rank 0 memory +%.1f MiB", double(memory_growth) / 1048576.0);
  std::printf("saved %s: %.3f GB by %d rank%s in %.3f s (%.3f GB/s)%s\n",
              fs::path(checkpoint_path(".", steps_done)).filename().c_str(), gb, ranks, ranks == 1 ? "" : "s",
              seconds, gb / std::max(seconds, 1e-9), tail);
  std::fflush(stdout);
}

// This rank's slices of the three groups, in the order of `pieces` (three per piece).
std::vector<SaveSlice> slices_of(const std::vector<Piece>& pieces) {
  std::vector<SaveSlice> out;
  for (const Piece& p : pieces)
    for (int32_t g = 0; g < 3; ++g) out.push_back({g, p.param, p.start, p.count});
  return out;
}

// Collective: every rank writes its own slices into the one file (parallel_save.hpp), straight from the
// state through a 16 MiB host staging buffer.
int write_now(const StateView& state, int64_t steps_done, const std::string& dir, MPI_Comm comm) {
  const bool rank0 = state.plan.rank == 0;
  const bool peak_reset = rank0 && reset_peak_resident();
  const int64_t resident_before = resident_bytes();
  const double t0 = now_seconds();
  const std::vector<Piece> pieces = owned_pieces(state);
  ParallelCheckpointWrite w(checkpoint_path(dir, steps_done), header_of(state, steps_done), state.plan.params,
                            slices_of(pieces), comm);
  if (int code = w.begin_code()) {
    if (state.plan.rank == 0) report_failed_save(steps_done, w.failure());
    return code;
  }
  Kernels& k = state.kernels;
  w.write_local([&](size_t slice, int64_t at, int64_t count, float* dst) {
    k.download(dst, pieces[slice / 3].src[slice % 3] + at, size_t(count) * sizeof(float));
  });
  const int code = w.complete();
  if (code != 0 && rank0) report_failed_save(steps_done, w.failure());
  if (code == 0 && rank0) {
    int ranks = 1;
    MPI_Comm_size(comm, &ranks);
    report_save(state.plan, steps_done, ranks, now_seconds() - t0,
                peak_reset ? peak_resident_bytes() - resident_before : -1, -1);
  }
  return code;
}

}  // namespace

int save_checkpoint(const StateView& state, int64_t steps_done, const std::string& dir, MPI_Comm world) {
  return write_now(state, steps_done, dir, world);
}

// ---- CheckpointSaver ----

struct CheckpointSaver::Pending {
  int64_t steps_done = 0;
  const Plan* plan = nullptr;
  double started = 0, step_wait = 0;  // when the save began; how long its step waited for the copy
  std::unique_ptr<ParallelCheckpointWrite> write;
  Kernels* kernels = nullptr;
  float* host = nullptr;            // this rank's slices, one after another (page-locked on CUDA)
  std::vector<size_t> slice_at;     // where each slice starts in `host`, in elements
  std::thread writer;
  std::atomic<bool> written{false};
  ~Pending() {
    if (host) kernels->host_free(host);  // on the thread that allocated it, once the writer is done
  }
};

CheckpointSaver::CheckpointSaver(std::string dir, int keep, bool async, MPI_Comm world)
    : dir_(std::move(dir)), keep_(keep), async_(async) {
  MPI_CHECK(MPI_Comm_dup(world, &comm_));
  MPI_Comm_rank(comm_, &rank_);
}

CheckpointSaver::~CheckpointSaver() {
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();  // an error path: no collective here
  pending_.reset();
  MPI_Comm_free(&comm_);
}

void CheckpointSaver::prune(const std::string& job_name, int64_t steps_done) {
  const PruneResult r = prune_checkpoints(dir_, keep_, job_name, checkpoint_path(dir_, steps_done), damaged_);
  for (const std::string& m : r.moved)
    std::fprintf(stderr, "piper: warning: checkpoint: moved aside %s (not counted by checkpoint.keep, never resumed "
                 "from; delete it when it is no longer needed)\n", m.c_str());
  std::fflush(stderr);
}

int CheckpointSaver::complete_pending() {
  if (!pending_) return 0;
  pending_->writer.join();
  const int code = pending_->write->complete();
  if (rank_ == 0) {
    if (code != 0) {
      report_failed_save(pending_->steps_done, pending_->write->failure());
    } else {
      int ranks = 1;
      MPI_Comm_size(comm_, &ranks);
      report_save(*pending_->plan, pending_->steps_done, ranks, now_seconds() - pending_->started, -1,
                  pending_->step_wait);
      prune(pending_->plan->job_name, pending_->steps_done);
    }
  }
  pending_.reset();
  return code;
}

int CheckpointSaver::save(const StateView& state, int64_t steps_done) {
  if (!async_) {
    int code = write_now(state, steps_done, dir_, comm_);
    if (code == 0 && rank_ == 0) prune(state.plan.job_name, steps_done);
    return code;
  }
  // The previous file must be complete before this one starts (and before its failure could go unseen).
  if (int code = complete_pending()) return code;
  const double t0 = now_seconds();
  const std::vector<Piece> pieces = owned_pieces(state);
  auto p = std::make_unique<Pending>();
  p->steps_done = steps_done;
  p->plan = &state.plan;
  p->started = t0;
  p->write = std::make_unique<ParallelCheckpointWrite>(checkpoint_path(dir_, steps_done), header_of(state, steps_done),
                                                       state.plan.params, slices_of(pieces), comm_);
  if (int code = p->write->begin_code()) {
    if (rank_ == 0) report_failed_save(steps_done, p->write->failure());
    return code;
  }
  // The step's copy of this rank's slices (host memory of the size of its own share), then training goes on.
  Kernels& k = state.kernels;
  size_t elements = 0;
  for (const Piece& piece : pieces)
    for (int t = 0; t < 3; ++t) p->slice_at.push_back(elements), elements += size_t(piece.count);
  p->kernels = &k;
  p->host = static_cast<float*>(k.host_alloc(std::max<size_t>(elements, 1) * sizeof(float)));
  int copied = p->host ? 1 : 0, all_copied = 0;
  for (size_t i = 0; copied && i < pieces.size(); ++i)
    for (int t = 0; t < 3; ++t)
      k.download(p->host + p->slice_at[3 * i + size_t(t)], pieces[i].src[t], size_t(pieces[i].count) * sizeof(float));
  MPI_CHECK(MPI_Allreduce(&copied, &all_copied, 1, MPI_INT, MPI_MIN, comm_));
  if (!all_copied) {
    if (!copied)
      std::fprintf(stderr, "piper: rank %d: error: checkpoint at step %lld not written: cannot allocate %zu bytes of "
                   "host memory for its asynchronous copy\n", rank_, static_cast<long long>(steps_done),
                   elements * sizeof(float));
    return kExitFailure;  // the unfinished file is removed with the write
  }
  p->step_wait = now_seconds() - t0;
  Pending* raw = p.get();
  raw->writer = std::thread([raw] {
    raw->write->write_local([raw](size_t slice, int64_t at, int64_t count, float* dst) {
      std::memcpy(dst, raw->host + raw->slice_at[slice] + at, size_t(count) * sizeof(float));
    });
    raw->written = true;
  });
  pending_ = std::move(p);
  return 0;
}

int CheckpointSaver::poll() {
  if (!pending_) return 0;
  int mine = pending_->written ? 1 : 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm_));
  return all ? complete_pending() : 0;
}

int CheckpointSaver::finish() { return complete_pending(); }

namespace {

// Every rank reads the ranges of parameters and moments that it holds, in the order they lie in the file;
// `checked` (version 3) reads them through whole blocks checked against their hashes, block by block, each
// uploaded where it belongs as soon as it is checked (no copy of a whole range). The ranges the replicas of
// a data-parallel group hold alike are read once by the group: each replica reads and checks a contiguous
// part and broadcasts it (replica_share.hpp); the ranks agree on any failure before training starts.
void read_tensors(const StateView& state, hid_t file, const std::string& path, BlockCheckedReader* checked) {
  const Plan& plan = state.plan;
  Kernels& k = state.kernels;
  struct Range {
    int t;                       // 0 params, 1 adam_m, 2 adam_v
    const PlanParam* pp;
    int64_t begin, count;        // elements of the tensor
    float* dst;                  // where they go in the state
    int32_t group;               // the data-parallel group holding it alike, -1 this rank alone
  };
  std::vector<Range> ranges;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const PlanBucket& pb = plan.buckets[b];
    for (int t = 0; t < 3; ++t) {
      const bool sharded = t == 0 ? pb.shard_params : pb.shard_optimizer;
      const BucketRange owned = owned_range(pb, plan.replica, sharded);
      const int32_t buf = t == 0 ? (pb.shard_params ? pb.param_shard_buf : pb.param_buf) : (t == 1 ? pb.m_buf : pb.v_buf);
      const bool alike = !sharded && pb.group_size > 1 && pb.group >= 0;
      for_each_param_piece(plan, int32_t(b), owned, [&](const ParamPiece& piece) {
        for_each_element_run(*piece.pp, pb.slices, piece.param_begin(), piece.count(),
                             [&](int64_t element, int64_t at, int64_t n) {
                               const int64_t a = piece.begin + (at - piece.param_begin());
                               ranges.push_back({t, piece.pp, element, n, state.at(buf, a - owned.lo), alike ? pb.group : -1});
                             });
      });
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) {  // groups, then parameters
    return std::tie(x.t, x.pp->model_param, x.begin) < std::tie(y.t, y.pp->model_param, y.begin);
  });
  // The alike ranges are shared within their group when the file is block-checked and no rank holds alike
  // ranges of two groups (every rank takes part in this decision); otherwise every rank reads all its own.
  int32_t shared_group = -1;
  int several = 0, any_several = 0;
  for (const Range& r : ranges)
    if (r.group >= 0) {
      if (shared_group >= 0 && r.group != shared_group) several = 1;
      shared_group = r.group;
    }
  MPI_CHECK(MPI_Allreduce(&several, &any_several, 1, MPI_INT, MPI_MAX, state.world));
  if (!checked || any_several) shared_group = -1;
  std::unique_ptr<ReplicaShare> share;
  if (shared_group >= 0) {
    std::vector<SharedRange> alike;
    for (const Range& r : ranges)
      if (r.group >= 0) alike.push_back({kGroups[r.t], &plan.params[size_t(r.pp->model_param)], r.begin, r.count, r.dst});
    share = std::make_unique<ReplicaShare>(std::move(alike), state.world,
                                           plan.group_ranks(plan.groups[size_t(shared_group)]));
  }
  const bool sharing = share && share->agreed();
  auto own = [&](const Range& r) { return !sharing || r.group < 0; };  // read by this rank, not shared
  std::exception_ptr announce_failure;  // a missing or misshapen tensor; the group agrees on it first
  try {
    if (checked) {
      if (sharing) share->expect(*checked);
      for (const Range& r : ranges)
        if (own(r)) checked->expect(kGroups[r.t], plan.params[size_t(r.pp->model_param)], r.begin, r.count);
    }
  } catch (...) {
    announce_failure = std::current_exception();
  }
  if (sharing) share->read(*checked, k, announce_failure);
  if (announce_failure) std::rethrow_exception(announce_failure);
  std::vector<float> host;  // versions 1 and 2: a whole range through HDF5
  for (const Range& r : ranges) {
    if (!own(r)) continue;
    const ParamSpec& spec = plan.params[size_t(r.pp->model_param)];
    if (checked) {
      checked->read(kGroups[r.t], spec, r.begin, r.count, [&](const float* data, int64_t at, int64_t n) {
        k.upload(r.dst + at, data, size_t(n) * sizeof(float));
      });
      continue;
    }
    host.resize(size_t(r.count));
    read_range(file, path, kGroups[r.t], spec, r.begin, r.count, host.data());
    k.upload(r.dst, host.data(), size_t(r.count) * sizeof(float));
  }
}

}  // namespace

namespace {

// The file's format and step, and the checks of rank 0 (the job against the checkpoint's record); throws
// UserError naming the file.
int64_t open_for_load(const StateView& state, const std::string& path, Handle& file, int64_t& version) {
  if (!fs::is_regular_file(path)) throw UserError(cat(path, ": no checkpoint file (it does not exist)"));
  file.id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file.id < 0) throw UserError(cat(path, ": not a readable HDF5 file (not a checkpoint, or truncated)"));
  int64_t steps = 0;
  try {
    std::string format;
    if (!h5::read_attr_str(file, "format", format) || format != kCheckpointFormat)
      throw UserError(cat("not a piper checkpoint (no attribute format = \"", kCheckpointFormat, "\")"));
    if (!h5::read_attr_i64(file, "format_version", version) || version < 1 || version > kCheckpointVersion)
      throw UserError(
          cat("checkpoint format version ", version, "; this piper reads versions 1 to ", kCheckpointVersion));
    if (!h5::read_attr_i64(file, "step", steps)) throw UserError("has no attribute 'step'");
  } catch (const UserError& e) {
    throw UserError(cat(path, ": ", e.what()));
  }
  const Plan& plan = state.plan;
  if (plan.rank == 0)  // the job must be the one the checkpoint was trained with, up to checkpoint.allow_changes
    for (const std::string& w : check_resume(read_run_record(file), run_record(plan, &state.data),
                                             plan.allow_changes, path))
      std::fprintf(stderr, "piper: warning: %s\n", w.c_str());
  return steps;
}

}  // namespace

int64_t load_checkpoint(const StateView& state, const std::string& path) {
  h5::quiet();
  // Every rank opens and checks the file; they agree on the outcome before they read together.
  Handle file(-1, H5Fclose);
  int64_t version = 0, steps = 0;
  std::unique_ptr<BlockCheckedReader> checked;
  std::string refused;
  try {
    steps = open_for_load(state, path, file, version);
    if (version >= 3) checked = std::make_unique<BlockCheckedReader>(file, path);
  } catch (const UserError& e) {
    refused = e.what();
  } catch (const h5::Error&) {
    refused = cat(path, ": cannot be read (damaged or truncated file)");
  }
  int mine = refused.empty() ? 0 : 1, any = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, state.world));
  if (mine) throw UserError(refused);
  if (any) throw CheckpointLoadAbandoned(cat(path, ": refused by another rank"));
  try {
    read_tensors(state, file, path, checked.get());
  } catch (const h5::Error&) {
    throw UserError(cat(path, ": cannot be read (damaged or truncated file)"));
  }
  return steps;
}

}  // namespace piper
