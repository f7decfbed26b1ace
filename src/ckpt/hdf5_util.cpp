// HDF5 helpers shared by the checkpoint code (see hdf5_util.hpp): error-stack reading, checked calls,
// scalar attributes.
#include "ckpt/hdf5_util.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace piper::h5 {

namespace {

herr_t collect_descriptions(unsigned, const H5E_error2_t* e, void* out) {
  if (e->desc) static_cast<std::vector<std::string>*>(out)->push_back(e->desc);
  return 0;
}

// Messages of the current error stack, most specific first.
std::vector<std::string> error_stack() {
  std::vector<std::string> out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_descriptions, &out);
  return out;
}

herr_t collect_name(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

hid_t utf8_vlen_string() {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  return t;
}

}  // namespace

void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string innermost_error() {
  std::vector<std::string> s = error_stack();
  return s.empty() ? "" : s.front();
}

int recorded_errno() {
  for (const std::string& d : error_stack()) {
    size_t at = d.find("errno = ");
    if (at != std::string::npos) return std::atoi(d.c_str() + at + 8);
  }
  return 0;
}

void fail(const char* file, int line, const char* expr) {
  std::string why = innermost_error();
  int err = recorded_errno();
  throw Error(cat(file, ":", line, ": HDF5 call failed: ", expr, why.empty() ? "" : cat(" (", why, ")")), err);
}

std::vector<std::string> attribute_names(hid_t obj) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  if (H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_name, &names) < 0)
    throw UserError("its attributes cannot be listed");
  std::sort(names.begin(), names.end());
  return names;
}

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += cat(i ? ", " : "", dims[i]);
  return s + ")";
}

void write_attr_i64(hid_t obj, const char* name, int64_t v) {
  Handle space(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  Handle a(H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(a, H5T_NATIVE_INT64, &v));
}

void write_attr_str(hid_t obj, const char* name, const std::string& v) {
  Handle type(H5_CHECK(utf8_vlen_string()), H5Tclose);
  Handle space(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  Handle a(H5_CHECK(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  const char* p = v.c_str();
  H5_CHECK(H5Awrite(a, type, &p));
}

void write_attr_u64s(hid_t obj, const char* name, const std::vector<uint64_t>& v) {
  if (H5Aexists(obj, name) > 0) {  // rewritten in place when it has the same size (no new file space)
    Handle a(H5_CHECK(H5Aopen(obj, name, H5P_DEFAULT)), H5Aclose);
    Handle space(H5_CHECK(H5Aget_space(a)), H5Sclose);
    if (H5Sget_simple_extent_npoints(space) == hssize_t(v.size())) {
      H5_CHECK(H5Awrite(a, H5T_NATIVE_UINT64, v.data()));
      return;
    }
    H5_CHECK(a.close());
    H5_CHECK(H5Adelete(obj, name));
  }
  const hsize_t n = v.size();
  Handle space(H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  Handle a(H5_CHECK(H5Acreate2(obj, name, H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(a, H5T_NATIVE_UINT64, v.data()));
}

bool read_attr_u64s(hid_t obj, const char* name, std::vector<uint64_t>& v) {
  if (H5Aexists(obj, name) <= 0) return false;
  Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (a.id < 0) throw UserError(cat("attribute '", name, "' cannot be opened"));
  Handle type(H5Aget_type(a), H5Tclose), space(H5Aget_space(a), H5Sclose);
  const hssize_t n = space.id < 0 ? -1 : H5Sget_simple_extent_npoints(space);
  if (type.id < 0 || H5Tget_class(type) != H5T_INTEGER || n < 0 || H5Sget_simple_extent_ndims(space) > 1)
    throw UserError(cat("attribute '", name, "' is not a list of integers"));
  v.resize(size_t(n));
  if (n > 0 && H5Aread(a, H5T_NATIVE_UINT64, v.data()) < 0) throw UserError(cat("attribute '", name, "' cannot be read"));
  return true;
}

namespace {

// Opens a scalar attribute of the given type class; -1 when it is missing.
hid_t open_scalar(hid_t obj, const char* name, H5T_class_t want, const char* kind) {
  if (H5Aexists(obj, name) <= 0) return -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) throw UserError(cat("attribute '", name, "' cannot be opened"));
  Handle type(H5Aget_type(a), H5Tclose), space(H5Aget_space(a), H5Sclose);
  if (type.id < 0 || space.id < 0 || H5Tget_class(type) != want || H5Sget_simple_extent_npoints(space) != 1 ||
      (want == H5T_STRING && H5Tis_variable_str(type) <= 0)) {
    H5Aclose(a);
    throw UserError(cat("attribute '", name, "' is not a single ", kind));
  }
  return a;
}

}  // namespace

bool read_attr_i64(hid_t obj, const char* name, int64_t& v) {
  Handle a(open_scalar(obj, name, H5T_INTEGER, "integer"), H5Aclose);
  if (a.id < 0) return false;
  if (H5Aread(a, H5T_NATIVE_INT64, &v) < 0) throw UserError(cat("attribute '", name, "' cannot be read"));
  return true;
}

bool read_attr_str(hid_t obj, const char* name, std::string& v) {
  Handle a(open_scalar(obj, name, H5T_STRING, "variable-length string"), H5Aclose);
  if (a.id < 0) return false;
  Handle type(utf8_vlen_string(), H5Tclose);
  char* p = nullptr;
  if (H5Aread(a, type, &p) < 0) throw UserError(cat("attribute '", name, "' cannot be read"));
  v = p ? p : "";
  H5free_memory(p);
  return true;
}

}  // namespace piper::h5
