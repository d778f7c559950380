// DlLibrary: one shared library opened with dlopen(3), closed with dlclose(3) on destruction.
//
// Baton opens libcuda and libnccl at run time rather than linking them, so one build runs on
// machines with and without a GPU. Open() fails with Unavailable("<name>: <dlerror text>");
// Symbol() returns nullptr for a missing symbol. Move-only; owns the handle. The handle is
// thread-safe to use (dlsym is); moving or destroying it is not.
#pragma once

#include <string>

#include "base/status.h"

namespace baton {

class DlLibrary {
 public:
  DlLibrary() = default;
  ~DlLibrary();
  DlLibrary(DlLibrary&& other) noexcept;
  DlLibrary& operator=(DlLibrary&& other) noexcept;
  DlLibrary(const DlLibrary&) = delete;
  DlLibrary& operator=(const DlLibrary&) = delete;

  // dlopen(name, RTLD_NOW | RTLD_LOCAL). `name` is a soname ("libcuda.so.1") or a path.
  static Result<DlLibrary> Open(const std::string& name);

  // The address of `symbol`, or nullptr when the library does not export it.
  void* Symbol(const char* symbol) const;

  const std::string& name() const { return name_; }
  bool valid() const { return handle_ != nullptr; }

 private:
  DlLibrary(void* handle, std::string name) : handle_(handle), name_(std::move(name)) {}
  void Reset();

  void* handle_ = nullptr;
  std::string name_;
};

}  // namespace baton
