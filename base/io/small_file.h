// Small files written whole and read whole: state that must survive a crash (the epoch
// journal, the engine command a promoted upgrade put in place).
//
// WriteFileAtomically() writes `bytes` to PATH.tmp, fsyncs it, renames it over PATH and
// fsyncs the directory: after a crash PATH holds either the old or the new contents. A
// symbolic link at PATH.tmp is refused, not followed (base/io/private_dir.h).
// ReplaceFile() does the same without the fsyncs.
// ReadSmallFile() reads at most `limit` + 1 bytes, enough for the caller to tell a file that
// is too long. Thread-compatible; plain functions.
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"

namespace baton {

// Writes all of `bytes` to `fd`, retrying short writes and EINTR; `what` names it in errors.
Status WriteAll(int fd, const std::string& bytes, const std::string& what);

Status WriteFileAtomically(const std::string& path, const std::string& bytes);

// The same without the fsyncs: after a crash of this process PATH holds the old or the new
// contents, after a crash of the machine possibly neither. For state that a reboot voids
// anyway (which processes run), written on hot paths.
Status ReplaceFile(const std::string& path, const std::string& bytes);

Result<std::string> ReadSmallFile(const std::string& path, size_t limit);

// The whole of the regular file at `path` (a file a person names: a config). A directory
// ("PATH: is a directory"; an ifstream reads one as empty), a device or a FIFO ("PATH: not a
// regular file") is InvalidArgument, and so is a file longer than `limit`; one that cannot be
// opened is NotFound ("PATH: No such file or directory"), a failed read an IoError.
Result<std::string> ReadRegularFile(const std::string& path, size_t limit);

// The longest config file a daemon reads (the controller's and the router's TOML; the shipped
// ones are a few KiB): a bound for a file named by mistake.
inline constexpr size_t kMaxConfigFileBytes = 4 << 20;

// The directory part of `path` ("." when it has none).
std::string ParentDir(const std::string& path);

}  // namespace baton
