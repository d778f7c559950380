#include "cuda/driver/dl_library.h"

#include <dlfcn.h>

#include <utility>

namespace baton {

DlLibrary::~DlLibrary() { Reset(); }

DlLibrary::DlLibrary(DlLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), name_(std::move(other.name_)) {}

DlLibrary& DlLibrary::operator=(DlLibrary&& other) noexcept {
  if (this != &other) {
    Reset();
    handle_ = std::exchange(other.handle_, nullptr);
    name_ = std::move(other.name_);
  }
  return *this;
}

void DlLibrary::Reset() {
  if (handle_ != nullptr) ::dlclose(handle_);
  handle_ = nullptr;
}

Result<DlLibrary> DlLibrary::Open(const std::string& name) {
  ::dlerror();  // clear a stale message
  void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    std::string text = why != nullptr ? why : "dlopen failed";
    // dlerror() usually starts with the name already; do not say it twice.
    if (text.rfind(name + ": ", 0) == 0) return Unavailable(text);
    return Unavailable(name + ": " + text);
  }
  return DlLibrary(handle, name);
}

void* DlLibrary::Symbol(const char* symbol) const {
  if (handle_ == nullptr) return nullptr;
  return ::dlsym(handle_, symbol);
}

}  // namespace baton
