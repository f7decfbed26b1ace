// HDF5 helpers shared by the checkpoint writer, reader and verifier: a closing handle, checked calls
// that keep HDF5's own explanation (and the errno its file driver saw), and root attribute access.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "util/error.hpp"

namespace piper::h5 {

// A failed HDF5 call on the write path: `what` names the call and HDF5's most specific message;
// `sys_errno` is the errno HDF5's file driver recorded (ENOSPC on a full disk), 0 when there was none.
class Error : public SystemError {
 public:
  Error(const std::string& what, int sys_errno) : SystemError(what), sys_errno(sys_errno) {}
  int sys_errno;
};

// Closes an HDF5 handle when it goes out of scope.
struct Handle {
  hid_t id = -1;
  herr_t (*close_fn)(hid_t) = nullptr;
  Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close_fn(c) {}
  ~Handle() {
    if (id >= 0 && close_fn) close_fn(id);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  operator hid_t() const { return id; }
  // Closes now and reports failure (a write HDF5 had delayed may fail here).
  herr_t close() {
    herr_t rc = id >= 0 && close_fn ? close_fn(id) : 0;
    id = -1;
    return rc;
  }
};

// Stops HDF5 from printing its error stack; piper reports errors itself.
void quiet();

// The most specific message on the current thread's HDF5 error stack ("" when empty). Read it right
// after the failing call: the next HDF5 call clears the stack.
std::string innermost_error();

// The errno recorded on the error stack by HDF5's POSIX file driver ("errno = 28"), or 0.
int recorded_errno();

[[noreturn]] void fail(const char* file, int line, const char* expr);

// Names of the root attributes, in byte order.
std::vector<std::string> attribute_names(hid_t obj);

// A dataset's dimensions for messages: "(2, 3)".
std::string dims_text(const std::vector<hsize_t>& dims);

void write_attr_i64(hid_t obj, const char* name, int64_t v);
void write_attr_str(hid_t obj, const char* name, const std::string& v);
// A 1-D uint64 attribute; an existing one of the same length is overwritten in place.
void write_attr_u64s(hid_t obj, const char* name, const std::vector<uint64_t>& v);
// False when missing; UserError when it is not a 1-D (or scalar) integer attribute.
bool read_attr_u64s(hid_t obj, const char* name, std::vector<uint64_t>& v);

// Read a scalar attribute. False when it is missing; UserError (without a file name) when it has
// another type or cannot be read.
bool read_attr_i64(hid_t obj, const char* name, int64_t& v);
bool read_attr_str(hid_t obj, const char* name, std::string& v);

}  // namespace piper::h5

// Checked HDF5 call on the write path: throws h5::Error naming the call, file:line and HDF5's reason.
#define H5_CHECK(expr)                                              \
  ([&]() {                                                          \
    auto rc_ = (expr);                                              \
    if (rc_ < 0) ::piper::h5::fail(__FILE__, __LINE__, #expr);      \
    return rc_;                                                     \
  }())
