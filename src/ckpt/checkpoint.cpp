// Checkpoint save (gather owned slices on rank 0, write a temporary HDF5 file, rename) and load (each
// rank reads the hyperslabs it holds). Datasets are chunked with the Fletcher32 checksum filter.
#include "ckpt/checkpoint.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include "util/error.hpp"
#include "util/mpi_check.hpp"
#include "util/mpi_gather.hpp"

#define H5_CHECK(expr)                                                                          \
  ([&]() {                                                                                      \
    auto rc_ = (expr);                                                                          \
    if (rc_ < 0) throw ::piper::SystemError(::piper::cat(__FILE__, ":", __LINE__, ": HDF5 call failed: ", #expr)); \
    return rc_;                                                                                 \
  }())

namespace piper {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "piper-checkpoint";
constexpr int64_t kFormatVersion = 1;
const char* kGroups[3] = {"params", "adam_m", "adam_v"};

// Closes an HDF5 handle when it goes out of scope.
struct H5Handle {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  H5Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5Handle() {
    if (id >= 0 && close) close(id);
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  operator hid_t() const { return id; }
};

void quiet_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void write_attr_i64(hid_t obj, const char* name, int64_t v) {
  H5Handle space(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Handle a(H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(a, H5T_NATIVE_INT64, &v));
}

void write_attr_str(hid_t obj, const char* name, const std::string& v) {
  H5Handle type(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  H5Handle space(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Handle a(H5_CHECK(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  const char* p = v.c_str();
  H5_CHECK(H5Awrite(a, type, &p));
}

bool read_attr_i64(hid_t obj, const char* name, int64_t& v) {
  if (H5Aexists(obj, name) <= 0) return false;
  H5Handle a(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Aread(a, H5T_NATIVE_INT64, &v));
  return true;
}

bool read_attr_str(hid_t obj, const char* name, std::string& v) {
  if (H5Aexists(obj, name) <= 0) return false;
  H5Handle a(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
  H5Handle type(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  char* p = nullptr;
  H5_CHECK(H5Aread(a, type, &p));
  v = p ? p : "";
  H5free_memory(p);
  return true;
}

// A logical tensor as (rows, cols): 1-D tensors are (n, 1).
std::pair<hsize_t, hsize_t> rows_cols(const ParamSpec& p) {
  if (p.shape.size() == 1) return {hsize_t(p.shape[0]), 1};
  hsize_t cols = 1;
  for (size_t i = 1; i < p.shape.size(); ++i) cols *= hsize_t(p.shape[i]);
  return {hsize_t(p.shape[0]), cols};
}

void write_dataset(hid_t group, const ParamSpec& p, const float* data) {
  std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
  std::vector<hsize_t> chunk = dims;
  auto [rows, cols] = rows_cols(p);
  (void)rows;
  chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], (hsize_t(1) << 20) / std::max<hsize_t>(1, cols)));
  H5Handle space(H5_CHECK(H5Screate_simple(int(dims.size()), dims.data(), nullptr)), H5Sclose);
  H5Handle dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  H5_CHECK(H5Pset_chunk(dcpl, int(chunk.size()), chunk.data()));
  H5_CHECK(H5Pset_fletcher32(dcpl));
  H5Handle ds(H5_CHECK(H5Dcreate2(group, p.name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)),
              H5Dclose);
  H5_CHECK(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

// Reads elements [begin, begin+count) of the flattened tensor into out.
void read_range(hid_t file, const std::string& path, const char* group, const ParamSpec& p, int64_t begin,
                int64_t count, float* out) {
  std::string name = std::string(group) + "/" + p.name;
  if (H5Lexists(file, group, H5P_DEFAULT) <= 0 || H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0)
    throw UserError(cat(path, ": checkpoint has no tensor '", name, "'; it was written for a different model"));
  H5Handle ds(H5_CHECK(H5Dopen2(file, name.c_str(), H5P_DEFAULT)), H5Dclose);
  H5Handle space(H5_CHECK(H5Dget_space(ds)), H5Sclose);
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
  H5Handle mem(H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
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

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t steps_done) {
  char name[64];
  std::snprintf(name, sizeof(name), "step_%08lld.h5", static_cast<long long>(steps_done));
  return (fs::path(dir) / name).string();
}

void save_checkpoint(Executor& ex, int64_t steps_done, const std::string& dir, MPI_Comm world) {
  const Plan& plan = ex.plan();
  Kernels& k = ex.backend().kernels();
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  MPI_Comm comm;
  MPI_CHECK(MPI_Comm_dup(world, &comm));
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
    MPI_CHECK(MPI_Barrier(comm));
    MPI_Comm_free(&comm);
    return;
  }

  // Rank 0: pieces by parameter, each from its rank in start order.
  struct From { int rank; int64_t start, count; };
  std::map<int64_t, std::vector<From>> by_param;
  for (int r = 0; r < size; ++r)
    for (const int64_t* e = all.begin(r); e < all.end(r); e += 3) by_param[e[0]].push_back({r, e[1], e[2]});
  std::map<std::pair<int64_t, int64_t>, const Piece*> local;
  for (const auto& p : mine) local[{p.param, p.start}] = &p;

  fs::create_directories(dir);
  const std::string final_path = checkpoint_path(dir, steps_done);
  const std::string tmp_path = (fs::path(dir) / ("." + fs::path(final_path).filename().string() + ".tmp")).string();
  std::string failure;
  try {
    quiet_hdf5();
    H5Handle file(H5Fcreate(tmp_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (file.id < 0) throw SystemError(cat("cannot create checkpoint file ", tmp_path));
    write_attr_str(file, "format", kFormat);
    write_attr_i64(file, "format_version", kFormatVersion);
    write_attr_i64(file, "step", steps_done);
    write_attr_i64(file, "data_step", steps_done);
    write_attr_i64(file, "seed", int64_t(plan.seed));
    write_attr_str(file, "sampler", plan.data.sequential ? "sequential" : "random");
    write_attr_str(file, "job_name", plan.job_name);
    write_attr_str(file, "job", plan.job_text);
    write_attr_str(file, "layout", layout_text(plan));
    hid_t groups[3];
    for (int t = 0; t < 3; ++t)
      groups[t] = H5_CHECK(H5Gcreate2(file, kGroups[t], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    std::vector<float> full[3];
    for (size_t pi = 0; pi < plan.params.size(); ++pi) {
      const ParamSpec& spec = plan.params[pi];
      for (auto& f : full) f.assign(size_t(spec.numel), 0.f);
      int64_t covered = 0;
      for (const From& fr : by_param[int64_t(pi)]) {
        for (int t = 0; t < 3; ++t) {
          float* dst = full[t].data() + fr.start;
          if (fr.rank == 0) k.download(dst, local.at({int64_t(pi), fr.start})->src[t], size_t(fr.count) * sizeof(float));
          else MPI_CHECK(MPI_Recv(dst, int(fr.count), MPI_FLOAT, fr.rank, t, comm, MPI_STATUS_IGNORE));
        }
        covered += fr.count;
      }
      PIPER_CHECK(covered == spec.numel, "checkpoint of ", spec.name, " covers ", covered, " of ", spec.numel, " elements");
      for (int t = 0; t < 3; ++t) write_dataset(groups[t], spec, full[t].data());
    }
    for (hid_t g : groups) H5Gclose(g);
    H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (failure.empty()) {
    std::error_code ec;
    fs::rename(tmp_path, final_path, ec);
    if (ec) failure = cat("cannot rename ", tmp_path, " to ", final_path, ": ", ec.message());
  }
  if (!failure.empty()) {
    std::error_code ec;
    fs::remove(tmp_path, ec);
    throw SystemError(cat("checkpoint at step ", steps_done, " not written: ", failure));
  }
  MPI_CHECK(MPI_Barrier(comm));
  MPI_Comm_free(&comm);
}

int64_t load_checkpoint(Executor& ex, const std::string& path) {
  const Plan& plan = ex.plan();
  Kernels& k = ex.backend().kernels();
  quiet_hdf5();
  if (!fs::is_regular_file(path)) throw UserError(cat("--resume: no checkpoint file '", path, "'"));
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.id < 0) throw UserError(cat(path, ": not an HDF5 file"));
  std::string format;
  int64_t version = 0, steps = 0;
  if (!read_attr_str(file, "format", format) || format != kFormat)
    throw UserError(cat(path, ": not a piper checkpoint (attribute format != \"", kFormat, "\")"));
  read_attr_i64(file, "format_version", version);
  if (version != kFormatVersion)
    throw UserError(cat(path, ": checkpoint format version ", version, ", this piper reads ", kFormatVersion));
  if (!read_attr_i64(file, "step", steps)) throw UserError(cat(path, ": checkpoint has no 'step' attribute"));
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
  return steps;
}

std::string latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return "";
  std::string best;
  long long best_step = -1;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    long long step = 0;
    char tail[8] = {0};
    if (std::sscanf(name.c_str(), "step_%lld.%3s", &step, tail) == 2 && std::string(tail) == "h5" &&
        name.size() > 3 && name.substr(name.size() - 3) == ".h5" && step > best_step) {
      best_step = step;
      best = e.path().string();
    }
  }
  return best;
}

void prune_checkpoints(const std::string& dir, int keep) {
  if (keep <= 0) return;
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.size() > 3 && name.substr(name.size() - 3) == ".h5")
      files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i + size_t(keep) < files.size(); ++i) fs::remove(files[i], ec);
}

}  // namespace piper
