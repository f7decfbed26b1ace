// Checkpoint save (gather owned slices on rank 0, write a temporary HDF5 file, fsync, verify, rename) and
// load (each rank reads the hyperslabs it holds). Datasets are chunked with the Fletcher32 checksum filter.
#include "ckpt/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/checksum.hpp"
#include "ckpt/file_writer.hpp"
#include "ckpt/folder.hpp"
#include "ckpt/hdf5_util.hpp"
#include "ckpt/verify.hpp"
#include "ckpt/resume_check.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"
#include "util/mpi_check.hpp"
#include "util/mpi_gather.hpp"

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


// Reads elements [begin, begin+count) of the flattened tensor into out.
void read_range(hid_t file, const std::string& path, const char* group, const ParamSpec& p, int64_t begin,
                int64_t count, float* out) {
  std::string name = std::string(group) + "/" + p.name;
  if (H5Lexists(file, group, H5P_DEFAULT) <= 0 || H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(cat(path, ": checkpoint has no tensor '", name, "'; it was written for a different model"));
  Handle ds(H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)), H5Dclose);
  Handle space(H5_CHECK(H5Dget_space(ds)), H5Sclose);
  int nd = H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5_CHECK(H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  std::vector<hsize_t> want(p.shape.begin(), p.shape.end());
  if (dims != want) {
    auto fmt = [](const std::vector<hsize_t>& d) {
      std::string s = "(";
      for (size_t i = 0; i < d.size(); ++i) s += cat(i ? ", " : "", d[i]);
      return s + ")";
    };
    throw UserError(cat(path, ": tensor '", name, "' has shape ", fmt(dims), " but the model expects ", fmt(want)));
  }
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

std::vector<Piece> owned_pieces(Executor& ex) {
  const Plan& plan = ex.plan();
  std::vector<Piece> out;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const PlanBucket& pb = plan.buckets[b];
    if (pb.tied_copy) continue;
    const int64_t shard = pb.padded / pb.group_size;
    const int64_t lo = int64_t(plan.replica) * shard, hi = lo + shard;
    for (const auto& pp : plan.plan_params) {
      if (pp.bucket != int32_t(b)) continue;
      const ParamSpec& spec = plan.params[size_t(pp.model_param)];
      int64_t a = std::max(lo, pp.offset), e = std::min(hi, pp.offset + spec.numel);
      if (a >= e) continue;
      Piece piece{pp.model_param, a - pp.offset, e - a, {nullptr, nullptr, nullptr}};
      piece.src[0] = pb.shard_params ? ex.bucket_ptr(pb.param_shard_buf, a - lo) : ex.bucket_ptr(pb.param_buf, a);
      const int64_t opt_at = pb.shard_optimizer ? a - lo : a;
      piece.src[1] = ex.bucket_ptr(pb.m_buf, opt_at);
      piece.src[2] = ex.bucket_ptr(pb.v_buf, opt_at);
      out.push_back(piece);
    }
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

// Collective over `comm`: every rank's owned slices reach rank 0, which hands each parameter's three
// complete tensors (params, adam_m, adam_v), in parameter order, to `take`. Other ranks only send.
template <typename Take>
void gather_state(Executor& ex, MPI_Comm comm, Take take) {
  const Plan& plan = ex.plan();
  Kernels& k = ex.backend().kernels();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::vector<Piece> mine = owned_pieces(ex);
  // Who sends what: every rank's piece list reaches rank 0.
  std::vector<int64_t> meta;
  for (const auto& p : mine) meta.insert(meta.end(), {p.param, p.start, p.count});
  Gathered<int64_t> all = gather_to_root(meta, comm);
  std::vector<float> staging;
  if (rank != 0) {
    for (const auto& p : mine)
      for (int t = 0; t < 3; ++t) {
        staging.resize(size_t(p.count));
        k.download(staging.data(), p.src[t], size_t(p.count) * sizeof(float));
        MPI_CHECK(MPI_Send(staging.data(), int(p.count), MPI_FLOAT, 0, t, comm));
      }
    return;
  }
  // Rank 0: pieces by parameter, each from its rank in start order.
  struct From { int rank; int64_t start, count; };
  std::map<int64_t, std::vector<From>> by_param;
  for (int r = 0; r < size; ++r)
    for (const int64_t* e = all.begin(r); e < all.end(r); e += 3) by_param[e[0]].push_back({r, e[1], e[2]});
  std::map<std::pair<int64_t, int64_t>, const Piece*> local;
  for (const auto& p : mine) local[{p.param, p.start}] = &p;
  for (size_t pi = 0; pi < plan.params.size(); ++pi) {
    const ParamSpec& spec = plan.params[pi];
    std::array<std::vector<float>, 3> full;
    for (auto& f : full) f.assign(size_t(spec.numel), 0.f);
    int64_t covered = 0;
    for (const From& fr : by_param[int64_t(pi)]) {
      for (int t = 0; t < 3; ++t) {
        float* dst = full[size_t(t)].data() + fr.start;
        if (fr.rank == 0) k.download(dst, local.at({int64_t(pi), fr.start})->src[t], size_t(fr.count) * sizeof(float));
        else MPI_CHECK(MPI_Recv(dst, int(fr.count), MPI_FLOAT, fr.rank, t, comm, MPI_STATUS_IGNORE));
      }
      covered += fr.count;
    }
    PIPER_CHECK(covered == spec.numel, "checkpoint of ", spec.name, " covers ", covered, " of ", spec.numel, " elements");
    take(spec, full);
  }
}

CheckpointHeader header_of(const Plan& plan, int64_t steps_done) {
  return {steps_done, plan.job_name, plan.job_text, layout_text(plan), run_record(plan)};
}

void report_failed_save(int64_t steps_done, const std::string& failure) {
  std::fprintf(stderr, "piper: error: checkpoint at step %lld not written: %s; older checkpoints are kept\n",
               static_cast<long long>(steps_done), failure.c_str());
  std::fflush(stderr);
}

}  // namespace

int save_checkpoint(Executor& ex, int64_t steps_done, const std::string& dir, MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm comm;
  MPI_CHECK(MPI_Comm_dup(world, &comm));
  std::unique_ptr<CheckpointFileWriter> file;
  if (rank == 0) file = std::make_unique<CheckpointFileWriter>(checkpoint_path(dir, steps_done), header_of(ex.plan(), steps_done));
  // Rank 0 writes each parameter as it arrives: it holds one parameter's tensors at a time.
  gather_state(ex, comm, [&](const ParamSpec& spec, const std::array<std::vector<float>, 3>& full) {
    for (int t = 0; t < 3; ++t) file->tensor(t, spec.name, spec.shape, full[size_t(t)].data(), full[size_t(t)].size());
  });
  int code = 0;
  if (rank == 0 && (code = file->finish()) != 0) report_failed_save(steps_done, file->failure());
  // Every rank learns rank 0's outcome: 0, or the exit code of a failed save.
  MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, 0, comm));
  MPI_Comm_free(&comm);
  return code;
}

// ---- CheckpointSaver ----

struct CheckpointSaver::Pending {
  int64_t steps_done = 0;
  CheckpointHeader header;
  std::vector<ParamSpec> specs;
  std::vector<std::array<std::vector<float>, 3>> tensors;
  std::thread writer;
  int code = 0;
  std::string failure;
};

CheckpointSaver::CheckpointSaver(std::string dir, int keep, bool async, MPI_Comm world)
    : dir_(std::move(dir)), keep_(keep), async_(async) {
  MPI_CHECK(MPI_Comm_dup(world, &comm_));
  MPI_Comm_rank(comm_, &rank_);
}

CheckpointSaver::~CheckpointSaver() {
  if (pending_ && pending_->writer.joinable()) pending_->writer.join();  // an error path: no collective here
  MPI_Comm_free(&comm_);
}

int CheckpointSaver::wait_rank0() {
  if (!pending_) return 0;
  pending_->writer.join();
  const int code = pending_->code;
  if (code != 0) report_failed_save(pending_->steps_done, pending_->failure);
  pending_.reset();
  return code;
}

int CheckpointSaver::save(Executor& ex, int64_t steps_done) {
  if (!async_) {
    int code = save_checkpoint(ex, steps_done, dir_, comm_);
    if (code == 0 && rank_ == 0) prune_checkpoints(dir_, keep_, checkpoint_path(dir_, steps_done));
    return code;
  }
  // The previous file must be complete before this one starts (and before its failure could go unseen).
  int code = rank_ == 0 ? wait_rank0() : 0;
  MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, 0, comm_));
  if (code != 0) return code;
  auto p = std::make_unique<Pending>();
  p->steps_done = steps_done;
  // The step's copy of the state: every rank's slices into rank 0's host memory, then training goes on.
  gather_state(ex, comm_, [&](const ParamSpec& spec, std::array<std::vector<float>, 3>& full) {
    p->specs.push_back(spec);
    p->tensors.push_back(std::move(full));
  });
  if (rank_ != 0) return 0;
  p->header = header_of(ex.plan(), steps_done);
  Pending* raw = p.get();
  const std::string dir = dir_;
  const int keep = keep_;
  raw->writer = std::thread([raw, dir, keep] {
    try {
      CheckpointFileWriter file(checkpoint_path(dir, raw->steps_done), raw->header);
      for (size_t i = 0; i < raw->specs.size(); ++i)
        for (int t = 0; t < 3; ++t)
          file.tensor(t, raw->specs[i].name, raw->specs[i].shape, raw->tensors[i][size_t(t)].data(),
                      raw->tensors[i][size_t(t)].size());
      raw->code = file.finish();
      raw->failure = file.failure();
      if (raw->code == 0) prune_checkpoints(dir, keep, checkpoint_path(dir, raw->steps_done));
    } catch (const std::exception& e) {
      raw->code = kExitFailure;
      raw->failure = e.what();
    }
    raw->tensors.clear();
    raw->tensors.shrink_to_fit();
  });
  pending_ = std::move(p);
  return 0;
}

int CheckpointSaver::finish() {
  if (!async_) return 0;
  int code = rank_ == 0 ? wait_rank0() : 0;
  MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, 0, comm_));
  return code;
}

namespace {

// Every rank reads the ranges of parameters and moments that it holds.
void read_tensors(Executor& ex, hid_t file, const std::string& path) {
  const Plan& plan = ex.plan();
  Kernels& k = ex.backend().kernels();
  std::vector<float> host;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const PlanBucket& pb = plan.buckets[b];
    const int64_t shard = pb.padded / pb.group_size;
    const int64_t lo = int64_t(plan.replica) * shard;
    for (const auto& pp : plan.plan_params) {
      if (pp.bucket != int32_t(b)) continue;
      const ParamSpec& spec = plan.params[size_t(pp.model_param)];
      for (int t = 0; t < 3; ++t) {
        const bool sharded = t == 0 ? pb.shard_params : pb.shard_optimizer;
        const int64_t range_lo = sharded ? lo : 0, range_hi = sharded ? lo + shard : pb.padded;
        int64_t a = std::max(range_lo, pp.offset), e = std::min(range_hi, pp.offset + spec.numel);
        if (a >= e) continue;
        host.resize(size_t(e - a));
        read_range(file, path, kGroups[t], spec, a - pp.offset, e - a, host.data());
        int32_t buf = t == 0 ? (pb.shard_params ? pb.param_shard_buf : pb.param_buf) : (t == 1 ? pb.m_buf : pb.v_buf);
        k.upload(ex.bucket_ptr(buf, a - range_lo), host.data(), size_t(e - a) * sizeof(float));
      }
    }
  }
}

}  // namespace

int64_t load_checkpoint(Executor& ex, const std::string& path) {
  h5::quiet();
  if (!fs::is_regular_file(path)) throw UserError(cat(path, ": no checkpoint file (it does not exist)"));
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.id < 0) throw UserError(cat(path, ": not a readable HDF5 file (not a checkpoint, or truncated)"));
  int64_t version = 0, steps = 0;
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
  const Plan& plan = ex.plan();
  if (plan.rank == 0)  // the job must be the one the checkpoint was trained with, up to checkpoint.allow_changes
    for (const std::string& w : check_resume(read_run_record(file), run_record(plan), plan.allow_changes, path))
      std::fprintf(stderr, "piper: warning: %s\n", w.c_str());
  try {
    read_tensors(ex, file, path);
  } catch (const h5::Error&) {
    throw UserError(cat(path, ": cannot be read (damaged or truncated file)"));
  }
  return steps;
}

}  // namespace piper
