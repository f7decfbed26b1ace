// A growable byte writer and a bounds-checked reader: the binary form of plans and MPI messages.
#pragma once
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "util/error.hpp"

namespace piper {

class ByteWriter {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint32_t>(uint32_t(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  template <typename T>
  void put_vector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    buf_.insert(buf_.end(), p, p + v.size() * sizeof(T));
  }
  std::vector<uint8_t>& bytes() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  // A trivially copyable value; `bool_offsets` name the bool members of a struct, whose bytes must hold
  // 0 or 1 (any other byte is no bool, and loading it would be undefined).
  template <typename T>
  T get(std::initializer_list<size_t> bool_offsets = {}) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    check_bools(p_, bool_offsets);
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string get_string() {
    auto n = get<uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> get_vector(std::initializer_list<size_t> bool_offsets = {}) {
    static_assert(std::is_trivially_copyable_v<T>);
    auto n = get<uint64_t>();
    if (n > remaining() / sizeof(T)) corrupt();  // before n * sizeof(T), which could wrap
    for (uint64_t i = 0; i < n; ++i) check_bools(p_ + i * sizeof(T), bool_offsets);
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), p_, n * sizeof(T));
    p_ += n * sizeof(T);
    return v;
  }
  // A count of items that follow, each at least `min_item_bytes` long: more than the bytes left can hold
  // is corrupt (and would otherwise reserve or loop for nothing).
  uint32_t get_count(size_t min_item_bytes) {
    auto n = get<uint32_t>();
    if (n > remaining() / min_item_bytes) corrupt();
    return n;
  }
  size_t remaining() const { return size_t(end_ - p_); }
  bool done() const { return p_ == end_; }

 private:
  [[noreturn]] static void corrupt() { throw SystemError("plan bytes truncated or corrupt"); }
  void need(size_t n) {
    if (remaining() < n) corrupt();
  }
  static void check_bools(const uint8_t* at, std::initializer_list<size_t> offsets) {
    for (size_t o : offsets)
      if (at[o] > 1) throw SystemError("plan bytes corrupt: a boolean holds neither 0 nor 1");
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace piper
